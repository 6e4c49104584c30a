"""The documentation stands alone: nothing points at documents outside the repository
(issue 14 item 8). `docs/background.md` summarises those documents and is the one place that
names them, so that citations of them in source comments can be looked up."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = re.compile(r"PRODUCT\.md|PERFORMANCE-NOTES|combos-behaviour|reference/|shared/")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_no_document_points_outside_the_repository() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in documents()
        if path.name != "background.md"
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert hits == []


def test_relative_links_resolve() -> None:
    broken = []
    for path in documents():
        for target in LINK.findall(path.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_background_covers_every_name_the_sources_cite() -> None:
    text = (ROOT / "docs" / "background.md").read_text()
    for name in ("combos-behaviour.md", "PRODUCT.md", "PERFORMANCE-NOTES", "codex-wire.md"):
        assert f"`{name}" in text, name
