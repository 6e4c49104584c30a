"""Docs that cannot drift (issue #41): docs/cli.md is what the commands print, every command's
help names each flag its code takes and no other, README.md's command list names every command
and flag, and docs/admin.md's sections name pages the admin has."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from ocxsite import clidocs
from tests.conftest import ROOT

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
NAMES = sorted(clidocs.commands(), key=len, reverse=True)
COMMAND = re.compile(r"\bocx (?:route )?(" + "|".join(NAMES) + r")(?![\w-])")
ANY_COMMAND = frozenset({"--help"})  # every command's


def _module_file(command: str) -> Path:
    if command == "mock-upstream":
        return ROOT / "mockupstream" / "server.py"
    from django.core.management import get_commands

    app = get_commands()[command]
    return Path(importlib.import_module(f"{app}.management.commands.{command}").__file__ or "")


def _flag(node: ast.AST) -> str | None:
    value = getattr(node, "value", None) if isinstance(node, ast.Constant) else None
    return value if isinstance(value, str) and FLAG.fullmatch(value) else None


def registered(command: str) -> set[str]:
    """The long options the command's code takes: those it adds to a parser (hidden ones left
    out) and those it compares its arguments with (`"--yes" in rest`)."""
    flags: set[str] = set()
    for node in ast.walk(ast.parse(_module_file(command).read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            if not any(
                k.arg == "help" and getattr(k.value, "attr", "") == "SUPPRESS"
                for k in node.keywords
            ):
                flags.update(f for a in node.args if (f := _flag(a)))
        elif isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                flags.update(f for n in ast.walk(side) if (f := _flag(n)))
    return flags


# A line that starts with a command (after `usage:` or `VAR=value` words) switches to it; so does
# each further `ocx X` on that line (`ocx user create a && ocx key create --user a`).
LEADING = re.compile(r"^\s*(?:usage:\s*)?(?:[A-Z_]+=\S*\s+)*ocx ")
# `ocx X` inside other text names X until a backtick, `;` or `)` closes the mention.
MENTION_END = re.compile(r"[`;)]")


def named(text: str, default: str | None) -> dict[str, set[str]]:
    """The flags a text names, by the command they go with: those after `ocx X` on a line that
    starts with a command are X's; any other line goes on with the previous one's (or
    `default`: a wrapped usage, an option's description, a note), apart from a mention of
    another command inside it."""
    found: dict[str, set[str]] = {}
    current = default
    for line in text.splitlines():
        spans = [(m.start(), m.end(), m.group(1)) for m in COMMAND.finditer(line)]
        if LEADING.match(line):
            cuts = [(0, current), *((start, command) for start, _, command in spans)]
            current = spans[-1][2]
        else:
            cuts = [(0, current)]
            for start, end, command in spans:
                close = MENTION_END.search(line, end)
                cuts += [(start, command), (close.start() if close else len(line), current)]
        for i, (start, command) in enumerate(cuts):
            end = cuts[i + 1][0] if i + 1 < len(cuts) else len(line)
            if command is not None:
                found.setdefault(command, set()).update(FLAG.findall(line[start:end]))
    return found


@pytest.fixture(scope="module")
def generated() -> str:
    return clidocs.render()


def _sections(text: str) -> dict[str, str]:
    """`## ocx X` / `### ocx X sub` sections of docs/cli.md by title."""
    parts = re.split(r"^#{2,3} (ocx [^\n]+)$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def test_cli_md_is_what_the_commands_print(generated: str) -> None:
    # Compared without the wrapping (argparse wraps to the terminal); any other difference:
    # regenerate with `python -m ocxsite.clidocs --write`.
    written = (ROOT / "docs" / "cli.md").read_text()
    assert set(_sections(written)) == set(_sections(generated))
    for title, body in _sections(generated).items():
        assert " ".join(_sections(written)[title].split()) == " ".join(body.split()), title


def test_cli_md_has_a_section_per_command(generated: str) -> None:
    from ocxsite.cli import COMMANDS

    titles = {t.split()[1] for t in _sections(generated)}
    assert titles == {*COMMANDS, "mock-upstream"}


@pytest.mark.parametrize("command", clidocs.commands())
def test_each_help_names_the_flags_its_command_takes_and_no_other(command: str) -> None:
    from ocxsite.cli import COMMANDS

    assert command in COMMANDS or command == "mock-upstream"
    text = clidocs._help(command) + "".join(
        clidocs._help(command, sub) for sub in clidocs.subcommands(command)
    )
    flags = named(text, command)
    assert registered(command) - flags.get(command, set()) == set(), "missing from the help"
    for other, seen in flags.items():
        gone = seen - registered(other) - ANY_COMMAND
        assert gone == set(), f"`ocx {other}` takes no {sorted(gone)}"


def _readme_cli_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## CLI\n", 1)[1]
    return section.split("```", 2)[1]


def test_the_readme_lists_every_command_and_flag_and_no_other() -> None:
    from ocxsite.cli import COMMANDS

    block = _readme_cli_block()
    listed = {m.group(1) for m in COMMAND.finditer(block)}
    assert listed == {*COMMANDS, "mock-upstream"}
    flags = named(block, None)
    for command in listed:
        missing = registered(command) - flags.get(command, set())
        assert missing == set(), f"README.md's `ocx {command}` lacks {sorted(missing)}"
        gone = flags.get(command, set()) - registered(command) - ANY_COMMAND
        assert gone == set(), f"README.md's `ocx {command}` names {sorted(gone)}"


def test_named_follows_the_command_of_each_line() -> None:
    text = (
        "usage: ocx key create --user U\n   [--rpm N] (see ocx user create --staff) --name\n"
        "  X=1 ocx user create a --staff && ocx token create --user a\n"
        "--json: as `ocx serve` writes; --url, see ocx combo set --alias\n"
    )
    assert named(text, None) == {
        "key": {"--user", "--rpm", "--name"},
        "user": {"--staff"},
        "token": {"--user", "--json", "--url"},
        "serve": set(),
        "combo": {"--alias"},
    }


# --- docs/admin.md ------------------------------------------------------------------------------


def admin_pages() -> dict[str, set[str]]:
    """Each app of the admin's index by its shown name, with its model pages' names."""
    from django.contrib import admin

    pages: dict[str, set[str]] = {}
    for model in admin.site._registry:
        app = str(model._meta.app_config.verbose_name)
        pages.setdefault(app, set()).add(str(model._meta.verbose_name_plural).capitalize())
    return pages


def test_admin_md_sections_name_pages_the_admin_has() -> None:
    # `## Title (App → Page)`: App as the admin's index shows it, Page one of its model pages
    # (or an "Add" form of one); `(App)` alone is the app's only page.
    pages = admin_pages()
    titles = re.findall(r"^## .*\(([^)]*)\)$", (ROOT / "docs" / "admin.md").read_text(), re.M)
    assert titles, "docs/admin.md has no `## Title (App → Page)` sections"
    for where in titles:
        app, _, page = (part.strip() for part in where.partition("→"))
        assert app in pages, f"docs/admin.md: no app {app!r} in the admin ({sorted(pages)})"
        if page and not page.startswith("Add"):
            assert page in pages[app], f"docs/admin.md: {app} has no page {page!r}"
