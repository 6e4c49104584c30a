from __future__ import annotations

from collections.abc import Mapping, Sequence


class ConfigError(Exception):
    """A rejected configuration write. Nothing was stored.

    `message` is the first issue (what the API answers); `issues` lists them all
    (what `ocx config load` prints); `status` is the HTTP status the API uses.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        issues: Sequence[str] = (),
        extra: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.issues = list(issues) or [message]
        self.extra = dict(extra or {})
