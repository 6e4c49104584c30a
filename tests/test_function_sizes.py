"""The request path stays readable: no long functions, proxy.py well under 800 lines (#41)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 80
PROXY_LIMIT = 800


def _request_path_files() -> list[Path]:
    files = sorted((ROOT / "gateway").rglob("*.py")) + sorted((ROOT / "routing").rglob("*.py"))
    files.append(ROOT / "providers" / "upstream.py")
    return [f for f in files if "migrations" not in f.parts]


def long_functions(limit: int = LIMIT) -> list[str]:
    found = []
    for path in _request_path_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > limit:
                    found.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({size} lines)"
                    )
    return found


def test_no_function_on_the_request_path_is_over_80_lines() -> None:
    assert long_functions() == []


def test_proxy_module_stays_well_under_800_lines() -> None:
    lines = len((ROOT / "gateway" / "proxy.py").read_text(encoding="utf-8").splitlines())
    assert lines < PROXY_LIMIT, lines


if __name__ == "__main__":
    print("\n".join(long_functions()))
