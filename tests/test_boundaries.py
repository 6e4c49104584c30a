"""Package boundaries: the pure routing core imports no framework (PRODUCT.md §1), and imports
flow one way down a declared order of packages (docs/architecture.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PURE_MODULES = [
    "routing.types",
    "routing.validate",
    "routing.strategies",
    "routing.eligibility",
    "routing.state",
    "routing.classify",
    "routing.cooldown",
    "routing.attempts",
    "routing.catalog",
    "routing.efforts",
    "routing.recall",
    "combos.shaping",
    "combos.cli_parse",
    "providers.wire.sse",
    "providers.wire.commit",
    "providers.wire.chat",
    "providers.wire.anthropic",
    "mockupstream.server",
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


# The packages from the top (the project package, which wires everything) down to the pure
# routing core; a package imports only packages in lower rows, never one in its own row or
# above (docs/architecture.md). Derived from what the code needs: `gateway` asks `accounts`
# (who), `usage` (budgets, request log), `combos`/`routing` (where) and `providers` (the wire);
# `server` (process lifecycle, metrics, background writers) and `state` (Redis stores) serve
# the domains above them; `alerts` sits below every producer of events (usage, accounts,
# gateway) and above `server` (its background writer); `state` implements stores whose types
# `routing` and `quota` define.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("ocxsite",),
    ("gateway",),
    ("accounts", "dashboard"),
    ("usage",),
    ("alerts",),
    ("server", "state"),
    ("combos",),
    ("quota",),
    ("providers",),
    ("audit",),
    ("routing",),
)
RANK = {pkg: i for i, row in enumerate(LAYERS) for pkg in row}
# Tools beside the layers, each with the only packages allowed to import it: a tool imports no
# package of ocx, and the production packages import nothing of it (`ocx mock-upstream` is the
# CLI's, in `ocxsite`, and `ocx serve --demo` starts it as a separate process).
TOOLS: dict[str, frozenset[str]] = {"mockupstream": frozenset({"ocxsite"})}
PACKAGES = {*RANK, *TOOLS}
ROOT = Path(__file__).resolve().parents[1]


def _imports() -> list[tuple[str, str, str]]:
    """(importing package, imported package, where) for every import between two packages,
    module level or inside a function (`TYPE_CHECKING` blocks included)."""
    found = []
    for pkg in sorted(PACKAGES):
        for path in (ROOT / pkg).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom):
                    names = [] if node.level else [node.module or ""]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in PACKAGES and top != pkg:
                        found.append((pkg, top, f"{path.relative_to(ROOT)}:{node.lineno}"))
    return found


def test_every_package_has_a_place_in_the_order() -> None:
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert packages == PACKAGES


def test_imports_flow_down_the_declared_order() -> None:
    upward = [
        f"{where}: {src} imports {dst}"
        for src, dst, where in _imports()
        if src in RANK and dst in RANK and RANK[dst] <= RANK[src]
    ]
    assert upward == []


def test_a_tool_imports_no_package_and_only_its_users_import_it() -> None:
    wrong = [
        f"{where}: {src} imports {dst}"
        for src, dst, where in _imports()
        if src in TOOLS or (dst in TOOLS and src not in TOOLS[dst])
    ]
    assert wrong == []


def test_no_two_packages_import_each_other() -> None:
    edges = {(src, dst) for src, dst, _ in _imports()}
    assert sorted((a, b) for a, b in edges if (b, a) in edges) == []


def test_the_routing_core_imports_no_framework_at_all() -> None:
    """Every module of `routing`, not only the listed ones (a new module joins by being there)."""
    modules = sorted(
        "routing." + ".".join(p.relative_to(ROOT / "routing").with_suffix("").parts)
        for p in (ROOT / "routing").rglob("*.py")
        if p.name != "__init__.py"
    )
    code = (
        f"import sys, {', '.join(modules)}; "
        "fw = ('django', 'ninja', 'channels', 'daphne', 'httpx', 'redis'); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in fw); "
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""
