"""Where ocx keeps its data, decided without creating anything (the CLI's read-only commands
ask before Django's settings, which create the directory, are loaded)."""

from __future__ import annotations

import os
from pathlib import Path

SQLITE_NAME = "ocx.sqlite3"


def data_dir_path() -> Path:
    return Path(os.environ.get("OCX_DATA_DIR") or "./var").expanduser().resolve()


def missing_sqlite_database() -> Path | None:
    """The SQLite file the settings would use when it does not exist yet; None when it exists
    or when DATABASE_URL names another database."""
    if os.environ.get("DATABASE_URL"):
        return None
    path = data_dir_path() / SQLITE_NAME
    return None if path.exists() else path
