"""Where ocx keeps its data, decided without creating anything (the CLI's read-only commands
ask before Django's settings, which create the directory, are loaded)."""

from __future__ import annotations

import json
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


SERVER_FILE = "server.json"


def server_file_write(data_dir: Path, *, url: str, status_token: str) -> Path:
    """Where `ocx status` finds the running server (no Redis: its state is in its memory):
    the URL and a token good for `GET /api/status` only. 0600: readable by who may read the
    database next to it."""
    path = data_dir / SERVER_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"url": url, "pid": os.getpid(), "statusToken": status_token}, fh)
    return path


def server_file_read(data_dir: Path) -> dict[str, object] | None:
    try:
        data = json.loads((data_dir / SERVER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def server_file_remove(data_dir: Path) -> None:
    """Remove the file if this process wrote it (a second server may have replaced it)."""
    data = server_file_read(data_dir)
    if data is not None and data.get("pid") == os.getpid():
        (data_dir / SERVER_FILE).unlink(missing_ok=True)
