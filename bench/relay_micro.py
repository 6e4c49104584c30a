"""The Python cost of relaying one streamed event, in isolation (issue 24).

    python bench/relay_micro.py [--events 200000] [--rounds 3]

Two measurements, each the old way beside the new, in one process (no sockets, no loop wake-ups:
what is left is the interpreter's own work per event, which the end-to-end long-streams runs
cannot separate from their run-to-run spread):

* **read**: a committed stream's chunks through `providers.upstream._chunks`, one chunk arriving
  per wait: reading `providers.http1.Body` directly (`ready` / `wait`) against httpx's
  `Response.aiter_raw` over the same body (the path before the twelfth run).
* **plain**: one plain Chat delta of a pass-through after commit: `CommitScanner.plain` (the
  shortcut of `_stream`) against what `_stream` did with it before, `feed` plus the usage,
  tool-call, usage-chunk and masking passes over the decision's frames.
* **write**: one streamed body chunk of a Daphne worker's response to a real loopback socket
  (the socket's `send` included, drained every 64 chunks): `server.daphne_main._body_now` (the
  chunk framed and handed to the connection) against what it did before the sixteenth run,
  Daphne's `WebRequest.handle_reply` with a body message and Twisted's `Request.write`.

Prints µs per event, per round.

`--masking` (issue #43) instead times what the exact-value masking adds to one plain delta of a
pass-through, `Masker.holds` after `CommitScanner.plain`: with the bench's one value (its upstream
key; an ocx client key is never among the values) and with 8 values (one compiled alternation
from 5 on), on a plain ASCII delta and on one with a `\\u` escape (decoded, then searched again),
and the first request whose values are not cached yet (`_sorted_values` + `_plan`, each an
lru_cache of 256 entries): once per config change, or per request for a caller's forwarded
token (not an ocx key) when more than 256 such tokens take turns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from providers import upstream  # noqa: E402
from providers.http1 import Body  # noqa: E402
from providers.masking import NO_MASK  # noqa: E402
from providers.wire.commit import CommitScanner  # noqa: E402
from providers.wire.toolcalls import undeclared_at  # noqa: E402


class _Conn:
    """What `Body` reads: one chunk arrives per `wait` (a paced stream), then the end."""

    def __init__(self, n: int) -> None:
        self.chunks: list[bytes] = []
        self.left = n
        self.done = False
        self.error: Exception | None = None
        self.closed = False
        self.keep_alive = True
        self.busy = True
        self.buffered = 0
        self.transport = None
        self.pool = self
        self.sink = None
        self.sink_error = None

    def take(self) -> bytes:
        chunk = self.chunks[0]
        self.chunks.clear()
        return chunk

    def discard(self) -> None:
        self.chunks.clear()

    def close(self) -> None:
        self.closed = True

    def _release(self, conn: Any, reuse: bool) -> None:
        pass

    async def wait(self) -> None:
        await asyncio.sleep(0)
        if self.left:
            self.chunks.append(b'data: {"x":1}\n\n')
            self.left -= 1
        else:
            self.done = True


async def read_us(direct: bool, n: int) -> float:
    resp = httpx.Response(200, stream=Body(_Conn(n)))  # type: ignore[arg-type]
    saved = upstream.Body
    if not direct:
        upstream.Body = type("NotOurs", (), {})  # type: ignore[misc,assignment]
    try:
        t0 = time.perf_counter()
        async for _ in upstream._chunks(resp, 60_000, 60_000):
            pass
        return (time.perf_counter() - t0) / n * 1e6
    finally:
        upstream.Body = saved  # type: ignore[misc]


def chat_delta(i: int) -> bytes:
    payload = {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": f" word{i}"}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def plain_us(shortcut: bool, n: int) -> float:
    chunks = [chat_delta(i) for i in range(1000)]
    scanner = CommitScanner("chat")
    scanner.forward_raw()
    scanner.feed(chunks[0])  # commits
    usage = None
    rounds = max(1, n // len(chunks))
    t0 = time.perf_counter()
    for _ in range(rounds):
        for chunk in chunks:
            if shortcut:
                if not scanner.plain(chunk):
                    raise SystemExit("a plain delta was not taken as plain")
                continue
            decision = scanner.feed(chunk)
            usage = upstream._scan_usage(decision.events, usage)
            undeclared_at("chat", decision.events, frozenset())
            upstream._masked_frames(upstream._client_events(decision.events, True), NO_MASK)
    return (time.perf_counter() - t0) / (rounds * len(chunks)) * 1e6


def masking_us(n: int) -> dict[str, float]:
    """µs per call of each masking case (`--masking`)."""
    from providers import masking

    few = [run_key(0)]  # what the bench config knows: one upstream key (shared by 2 providers)
    many = [run_key(i) for i in range(7)] + ["sk-forwarded-" + "c" * 40]
    ascii_delta = chat_delta(7)
    escaped = ascii_delta.replace(b" word7", b" caf\\u00e9 word7")
    scanner = CommitScanner("chat")
    scanner.forward_raw()
    scanner.feed(ascii_delta)
    out: dict[str, float] = {}

    def per_call(fn: Any, count: int) -> float:
        t0 = time.process_time()
        for _ in range(count):
            fn()
        return (time.process_time() - t0) / count * 1e6

    out["plain() alone"] = per_call(lambda: scanner.plain(ascii_delta), n)
    for label, values in (("1 value", few), ("8 values", many)):
        m = masking.Masker(lambda values=values: values)
        m.holds(ascii_delta)
        out[f"holds, {label}, ASCII delta"] = per_call(lambda m=m: m.holds(ascii_delta), n)
        out[f"holds, {label}, \\u escape"] = per_call(lambda m=m: m.holds(escaped), n // 10)
    # Values first seen: sorted and their plan built (cached afterwards).
    callers = iter(range(10**9))
    for label, known in (("2 values", few), ("8 values", many[:-1])):

        def first_request(known: list[str] = known) -> None:
            values = [*known, f"sk-forwarded-{next(callers):040d}"]
            masking.Masker(lambda: values).holds(ascii_delta)

        out[f"values first seen, {label}"] = per_call(first_request, n // 100)
    return out


def run_key(i: int) -> str:
    return f"sk-upstream-{i}-" + "x" * 32


def write_us(n: int) -> tuple[float, float]:
    """(new, old) µs per body chunk written through a Daphne connection set up as in a worker."""
    import os
    import socket

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ocxsite.settings")
    import django

    django.setup()
    from daphne import http_protocol
    from daphne.server import Server
    from twisted.internet import tcp
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import MemoryReactor

    from server import body_now, daphne_main

    daphne_main.install()
    daphne_main.install_lifecycle()  # the worker's socket writes (`_write_through`)

    async def measure() -> tuple[float, float]:
        scopes: list[dict[str, Any]] = []
        started = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await receive()
            start = {"type": "http.response.start", "status": 200, "headers": []}
            await send(start)
            await send({"type": "http.response.body", "body": b"data: 0\n\n", "more_body": True})
            scopes.append(scope)
            started.set()
            await asyncio.sleep(3600)

        server = Server(application=app, endpoints=["tcp:port=0:interface=127.0.0.1"])
        server.connections = {}
        factory = http_protocol.HTTPFactory(server)
        factory.timeOut = None
        listener = socket.create_server(("127.0.0.1", 0))
        peer = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
        ours.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ours.setblocking(False)
        peer.setblocking(False)
        channel = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
        channel.makeConnection(
            tcp.Server(ours, channel, ("127.0.0.1", 1), None, 1, MemoryReactor())
        )
        channel.dataReceived(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
        )
        await started.wait()
        request = channel._channel.requests[-1]
        new = scopes[0][body_now.SCOPE_KEY]

        def old(data: bytes) -> None:
            request.handle_reply({"type": "http.response.body", "body": data, "more_body": True})

        def drain() -> None:
            try:
                while peer.recv(1 << 20):
                    pass
            except BlockingIOError:
                pass

        frame = chat_delta(1)
        out = []
        for fn in (new, old):
            t0 = time.perf_counter()
            for i in range(n):
                fn(frame)
                if i % 64 == 63:
                    drain()
            out.append((time.perf_counter() - t0) / n * 1e6)
            drain()
        for sock in (peer, ours, listener):
            sock.close()
        return out[0], out[1]

    return asyncio.run(measure())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--masking", action="store_true", help="the masking pre-check only")
    args = p.parse_args()
    if args.masking:
        for r in range(args.rounds):
            got = masking_us(args.events)
            print(f"round {r}: " + " · ".join(f"{k} {v:.3f} µs" for k, v in got.items()))
        return 0
    for r in range(args.rounds):
        new_read = asyncio.run(read_us(True, args.events))
        old_read = asyncio.run(read_us(False, args.events))
        new_plain = plain_us(True, args.events)
        old_plain = plain_us(False, args.events)
        new_write, old_write = write_us(min(args.events, 50_000))
        print(
            f"round {r}: read {new_read:.2f} µs (aiter_raw {old_read:.2f}) · "
            f"plain delta {new_plain:.2f} µs (feed + checks {old_plain:.2f}) · "
            f"write {new_write:.2f} µs (Daphne's reply {old_write:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
