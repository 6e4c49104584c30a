"""The pure routing core imports no framework (PRODUCT.md §1)."""

from __future__ import annotations

import subprocess
import sys

import pytest

PURE_MODULES = [
    "combos.engine.types",
    "combos.engine.validate",
    "combos.engine.strategies",
    "combos.engine.eligibility",
    "combos.engine.state",
    "combos.engine.classify",
    "combos.engine.cooldown",
    "combos.engine.attempts",
    "combos.engine.catalog",
    "combos.engine.efforts",
    "combos.cli_parse",
    "providers.wire.sse",
    "providers.wire.commit",
    "providers.wire.chat",
    "providers.wire.anthropic",
    "providers.mock_upstream",
    "quota.windows",
]


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_no_framework(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "fw = ('django', 'ninja', 'channels', 'daphne', 'httpx'); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in fw); "
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""


APPS = ("providers", "combos", "quota", "usage", "dashboard")


def test_no_app_imports_the_shell() -> None:
    """Imports flow downward: `ocxsite` (the shell) may use the apps, never the reverse."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    offenders = []
    for app in APPS:
        for path in (root / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = (
                    [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else []
                )
                if any(n == "ocxsite" or n.startswith("ocxsite.") for n in names):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert offenders == []
