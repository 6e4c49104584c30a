"""A real HTTP receiver on a loopback port of its own (port 0): what Slack, a webhook or an
OTLP collector would get. Records every POST; answers with the scripted statuses, then 200."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    url: str
    received: list[Received] = field(default_factory=list)
    # Statuses of the next answers (then 200 for ever): [500, 500, 500] fails three times.
    statuses: list[int] = field(default_factory=list)
    attempts: int = 0

    def wait_for(self, count: int, timeout: float = 20) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            assert time.monotonic() < deadline, f"{len(self.received)} of {count} received"
            time.sleep(0.02)
        return list(self.received)

    def wait_until(self, check: Callable[[list[Received]], bool], timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not check(list(self.received)):
            assert time.monotonic() < deadline, f"not received; got {self.texts()}"
            time.sleep(0.05)

    def texts(self) -> list[str]:
        import json

        out = []
        for r in self.received:
            try:
                out.append(str(json.loads(r.body).get("text")))
            except ValueError:
                out.append(repr(r.body[:100]))
        return out


def serve() -> tuple[Receiver, Callable[[], None]]:
    lock = threading.Lock()
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the standard library's name
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with lock:
                receiver.attempts += 1
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                if status == 200:
                    receiver.received.append(
                        Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
            self.send_response(status)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = Receiver(f"http://127.0.0.1:{httpd.server_address[1]}")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        httpd.shutdown()
        httpd.server_close()

    return receiver, stop
