"""A new SQLite database is private to the server's user (0600; its directory is 0700).

SQLite creates the database file with the process's umask (usually 0644: readable by every
local user) and gives its -wal and -shm files the mode the database file has then. So a
database that did not exist when this process started is made 0600, with its -wal and -shm
files, on the first connection (before any request or migration writes to it). A database
that existed already is left as it is: `ocx doctor` warns when it is readable by others."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

_pending: set[str] = set()


def note_new_sqlite(name: str) -> None:
    """Called by the settings for a SQLite database file that does not exist yet."""
    if name and not name.startswith(("file:", ":memory:")) and not Path(name).exists():
        _pending.add(name)


def new_sqlite_private(sender: object, connection: Any, **kwargs: object) -> None:
    """`connection_created` receiver."""
    if not _pending or connection.vendor != "sqlite":
        return
    name = str(connection.settings_dict["NAME"])
    if name not in _pending:
        return
    _pending.discard(name)
    for path in (name, name + "-wal", name + "-shm"):
        with contextlib.suppress(OSError):  # not there (yet), or not ours: the doctor reports
            if os.stat(path).st_mode & 0o077:
                os.chmod(path, 0o600)
