"""Run Daphne for ocx (`ocx serve` starts its workers with `python -m ocxsite.daphne_main`).

Daphne drops every request header whose name contains "_" (a guard against CVE-2015-0219,
where `X_Forwarded_For` would pass for `X-Forwarded-For` in a WSGI environ). Codex sends its
session as `session_id`, which compaction recall and the `chatgpt` forward need, so exactly
these names are renamed to their dashed form first; every other underscore header is still
dropped by Daphne.

Twisted also parses the Content-Type of every POST with the `email` package, to decode form
submissions into `request.args`; Daphne hands the raw body to the ASGI app and never reads
`args`, so that parsing (a few per cent of a request's CPU) is switched off.
"""

from __future__ import annotations

from typing import Any

from daphne import http_protocol
from daphne.cli import CommandLineInterface

RENAMED = {b"session_id": b"session-id", b"conversation_id": b"conversation-id"}

_process = http_protocol.WebRequest.process
_init = http_protocol.WebRequest.__init__


def _process_with_codex_headers(self: Any) -> Any:
    headers = self.requestHeaders
    for name, alias in RENAMED.items():
        values = headers.getRawHeaders(name)
        if values is not None and not headers.hasHeader(alias):
            headers.setRawHeaders(alias, values)
    return _process(self)


def _init_without_form_parsing(self: Any, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    self._parsePOSTFormSubmission = False


def install() -> None:
    http_protocol.WebRequest.process = _process_with_codex_headers  # type: ignore[method-assign]
    http_protocol.WebRequest.__init__ = _init_without_form_parsing  # type: ignore[method-assign]


if __name__ == "__main__":
    install()
    CommandLineInterface.entrypoint()
