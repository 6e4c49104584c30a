"""Graceful shutdown of one worker (issue 16): SIGTERM stops accepting, lets the running proxy
requests and streams finish for up to `OCX_SHUTDOWN_GRACE_S` (default 30), then ends the rest
with an explicit in-band error (`SHUTDOWN_FAILURE`: the protocol's terminal error frame on a
stream, a 503 before the first byte), never as a clean end.

`ProxyApp` registers each request's task here (`track`); the server glue (`server.daphne_main`,
the uvicorn worker in `serve`) calls `drain` on SIGTERM. No Django here beyond its settings.

Keep-alive connections are what makes a rolling restart lose requests: a client that sends on
an idle connection just as the old worker closes it gets "server disconnected". So a draining
worker answers every request with `Connection: close` and closes a connection only once it
has stayed idle for `IDLE_LINGER_S`, by which time a busy client has had its `close` and
reconnected to a new worker; the worker stops once no connection is left (or the grace is
over).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from django.conf import settings

from providers.wire.commit import StreamFailure
from server import metrics

log = logging.getLogger("ocx.lifecycle")

DEFAULT_GRACE_S = 30.0
IDLE_LINGER_S = 1.0
SHUTDOWN_FAILURE = StreamFailure(
    status=503,
    type="server_error",
    code="ocx_shutting_down",
    message="ocx is restarting or shutting down: the request was ended before completion; retry",
)

_inflight: set[asyncio.Task[object]] = set()
_stopping = False
# What a draining worker writes out before it exits: `gateway.runtime` registers its
# background writers' flush here (the server package sits below the gateway, never imports it).
_flushers: list[Callable[[], Awaitable[None]]] = []


def on_flush(flush: Callable[[], Awaitable[None]]) -> None:
    _flushers.append(flush)


# What a worker starts once it accepts connections (on its event loop): `gateway.runtime`
# registers the alert sender and the worker's first config and key-map load here.
_starters: list[Callable[[asyncio.AbstractEventLoop], None]] = []


def on_start(start: Callable[[asyncio.AbstractEventLoop], None]) -> None:
    _starters.append(start)


def started(loop: asyncio.AbstractEventLoop) -> None:
    """The worker accepts connections: run what was registered with `on_start`."""
    for start in list(_starters):
        try:
            start(loop)
        except Exception:  # noqa: BLE001 - one starter's failure must not stop the worker
            log.exception("worker start hook %s failed", getattr(start, "__name__", start))


async def flush_all() -> None:
    for flush in list(_flushers):
        await flush()


def grace_s() -> float:
    raw = os.environ.get("OCX_SHUTDOWN_GRACE_S") or ""
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_GRACE_S
    except ValueError:
        return DEFAULT_GRACE_S


def freeze_heap() -> bool:
    """Called once the worker has loaded everything and accepts connections: what exists now
    (Django, the apps, the frameworks: most of the heap) lives as long as the worker, so it is
    moved out of the cyclic collector's sight. A full collection otherwise walks all of it and
    stalls the event loop: p99 at c=1 was 46-105 ms with it, 11 ms without (bench/README.md).
    `settings.OCX_GC_FREEZE` off (env OCX_GC_FREEZE=0) keeps the default behaviour (to
    measure it)."""
    tune_collector()
    if not settings.OCX_GC_FREEZE:
        metrics.FROZEN_OBJECTS.set(0)
        return False
    gc.collect()  # startup's garbage is freed first, not kept for the worker's life
    gc.freeze()
    metrics.FROZEN_OBJECTS.set(gc.get_freeze_count())
    return True


# Python's own thresholds, and the middle and oldest ones a worker uses with `OCX_GC_YOUNG`.
DEFAULT_GC_THRESHOLD = (700, 10, 10)
GC_MIDDLE, GC_OLDEST = 20, 10
# What the young threshold grows by per proxy request in flight: a bit above the objects the
# collector tracks for one open stream (about 290 for a Chat stream: its Twisted request and
# connection, the upstream connection, the stream's parser and scanner, the task).
GC_PER_REQUEST = 400
# The requests that count at most: the 1,000 long streams a worker is sized for (issue #24).
# Beyond them the threshold stops growing, so what waits for a collection stays bounded.
GC_MAX_REQUESTS = 1024
# The young threshold with no request in flight (`tune_collector`); 0: Python's own, fixed.
_young = 0


def tune_collector() -> tuple[int, int, int]:
    """The worker's collector thresholds (`settings.OCX_GC_YOUNG`; 0: Python's own).

    With Python's 700, 1,024 open streams (whose objects live for the stream) made a worker
    collect its youngest generation ~700 times, the middle one ~65 and the whole heap 6 times
    while they opened (the whole heap grew by over a quarter between two of them), mostly
    finding nothing: ~0.8 s of a worker's CPU, a quarter of the streams' (bench/README.md,
    tenth run). At 20,000 objects, ~0.37 s: two dozen young collections of ~10 ms, no whole one
    during the burst. Garbage without cycles is freed at once either way; only cycles wait."""
    global _young
    young = settings.OCX_GC_YOUNG
    threshold = DEFAULT_GC_THRESHOLD if young == 0 else (young, GC_MIDDLE, GC_OLDEST)
    gc.set_threshold(*threshold)
    _young = young
    return threshold


def _follow_load() -> None:
    """Move the young threshold with the requests in flight (`GC_PER_REQUEST` each).

    A young collection walks every object allocated since the last one that is still alive.
    While a burst of streams opens, that is the streams themselves: all alive, so every
    collection then found nothing and the 1,024-stream burst spent 15 of them, about 170 ms of
    the worker (bench/README.md, eighteenth run). With the threshold above what the open
    requests hold, a collection comes when something beyond them has accumulated; as requests
    end, the threshold falls back and the cycles they left are collected. It grows for at
    most `GC_MAX_REQUESTS` requests: garbage waits for at most about 430,000 objects."""
    if _young:
        requests = min(len(_inflight), GC_MAX_REQUESTS)
        gc.set_threshold(_young + GC_PER_REQUEST * requests, GC_MIDDLE, GC_OLDEST)


def stopping() -> bool:
    """True once this worker was told to stop: a cancellation now is the shutdown's."""
    return _stopping


def mark_stopping() -> None:
    global _stopping
    _stopping = True


def inflight() -> int:
    return len(_inflight)


@contextmanager
def track() -> Iterator[None]:
    """Count the current task as a running request for the duration of the block."""
    task = asyncio.current_task()
    if task is None:
        yield
        return
    _inflight.add(task)
    _follow_load()
    try:
        yield
    finally:
        _inflight.discard(task)
        _follow_load()


async def drain(
    stop_listening: Callable[[], None],
    stop: Callable[[], None],
    flush: Callable[[], Awaitable[None]] | None = None,
    connections: Callable[[float], int] | None = None,
) -> None:
    """Stop accepting, wait for the running requests and the open client connections (up to
    the grace period), cancel what is left (each ends itself with `SHUTDOWN_FAILURE`), write
    what is queued (`flush`: the request log), then stop the server.

    `connections(now)` counts the client connections still open, and closes those idle for
    `IDLE_LINGER_S` as of `now` (this loop's clock)."""
    mark_stopping()
    grace = grace_s()
    loop = asyncio.get_running_loop()
    log.warning(
        "shutting down: no new connections; %d request(s) running get up to %.0f s",
        len(_inflight),
        grace,
    )
    stop_listening()
    deadline = loop.time() + grace
    still_open = 0
    while loop.time() < deadline:
        still_open = 0
        if connections is not None:
            try:
                still_open = connections(loop.time())
            except Exception:  # noqa: BLE001 - a drain must end: fall back to requests only
                log.warning("could not inspect the open connections", exc_info=True)
                connections = None
        if not _inflight and not still_open:
            break
        await asyncio.sleep(0.05)
    if still_open and not _inflight:
        log.warning("grace period over: closing %d open connection(s)", still_open)
    if _inflight:
        log.warning("grace period over: ending %d request(s) with an error", len(_inflight))
        for task in list(_inflight):
            task.cancel()
        end = loop.time() + 2.0
        while _inflight and loop.time() < end:
            await asyncio.sleep(0.02)
    if flush is not None:
        try:
            async with asyncio.timeout(5.0):
                await flush()
        except Exception:  # noqa: BLE001 - the process stops either way
            log.warning("could not write the queued request log at shutdown", exc_info=True)
    stop()
