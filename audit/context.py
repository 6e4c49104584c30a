"""Who is changing things, and through what: set per request by `audit.middleware` (the
request's user, read when the first change is recorded: the API's token auth sets it late), by
the SSO sign-in, or not at all: then it is a command, `cli:<OS user>`."""

from __future__ import annotations

import contextlib
import getpass
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

VIAS = ("admin", "api", "cli", "portal", "sso")


@dataclass(frozen=True)
class Origin:
    via: str
    request: Any = None  # the HttpRequest whose user acts; None: `actor`
    actor: str = ""


_origin: ContextVar[Origin | None] = ContextVar("ocx_audit_origin", default=None)


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER: a container's uid
        return "unknown"


def current() -> tuple[str, str]:
    """(actor, via) of the change being made now."""
    origin = _origin.get()
    if origin is None:
        return f"cli:{_os_user()}", "cli"
    if origin.request is not None:
        user = getattr(origin.request, "user", None)
        if user is not None and user.is_authenticated:
            return user.get_username(), origin.via
        return origin.actor or "-", origin.via
    return origin.actor or "-", origin.via


@contextlib.contextmanager
def acting(*, via: str, request: Any = None, actor: str = "") -> Iterator[None]:
    """Changes made inside are recorded as `via` by `request`'s user (or `actor`)."""
    token = _origin.set(Origin(via=via, request=request, actor=actor))
    try:
        yield
    finally:
        _origin.reset(token)


def via_for_path(path: str) -> str | None:
    """The interface a request path belongs to (None: not one that changes things)."""
    if path.startswith("/admin/"):
        return "admin"
    if path.startswith(("/me/", "/api/me/")):
        return "portal"
    if path.startswith("/api/"):
        return "api"
    if path.startswith(("/login/sso", "/oidc/")):
        return "sso"
    return None
