"""A body write that completes at once, offered by ocx's Daphne worker to the proxy (issue #24).

An ASGI `send` is a coroutine: every streamed event a proxy forwards costs a wake-up of the
request's task, its whole await chain and the send's own coroutines, though Daphne's send never
waits for anything (it hands the bytes to Twisted, which sends them or queues what the socket did
not take). The worker puts a plain function under `SCOPE_KEY` in each HTTP scope: called with a
body chunk (`more_body` true), it writes it before it returns, exactly as that `send` would. The
proxy uses it for a committed stream's chunks, from the upstream connection's own data callback
(`providers.http1`). A server without it (uvicorn, tests' ASGI clients) gets the ordinary `send`
for every chunk.
"""

from __future__ import annotations

from collections.abc import Callable

SCOPE_KEY = "ocx.body_now"

# Writes one body chunk of a started response, more to follow.
BodyNow = Callable[[bytes], None]
