"""The JSON body of a management API request, with the reference's exact error messages.

Here, in the lowest app, so that every app's `api.py` can use it without importing the shell
(`ocxsite`)."""

from __future__ import annotations

import json

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest
from ninja.errors import HttpError


def _reject_constant(name: str) -> object:
    # NaN / Infinity / -Infinity are not JSON (the reference's JSON.parse rejects them).
    raise ValueError(f"invalid JSON constant {name}")


def json_body(request: HttpRequest) -> object:
    """The parsed JSON body, or a 400 with the reference's exact messages."""
    try:
        raw = request.body
    except RequestDataTooBig:
        raise HttpError(413, "request body too large") from None
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError):
        raise HttpError(400, "invalid JSON body") from None


def object_body(request: HttpRequest) -> dict[str, object]:
    body = json_body(request)
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be an object")
    return body
