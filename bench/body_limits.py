"""A worker's memory under oversized unauthenticated bodies (issue #26 point 1).

    python bench/body_limits.py [--server daphne|uvicorn] [--requests 20] [--limits-off]

One ocx instance (as `bench/run.py` starts it). It prints the worker's RSS and peak RSS (VmHWM),
then sends `--requests` POSTs without a key, in turn to /v1/responses, /api/keys and /healthz,
each declaring a 300 MiB body and then really sending it (1 MiB writes) until the server answers
or closes, and prints the worker's RSS and peak again, with each request's status, the bytes
the client got to send and how long the answer took. `--limits-off` raises every body limit
above 300 MiB, which is how a worker behaved before the limits (the body read in full, then
401/403/405).
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402 - bench/run.py, the harness this reuses

DECLARED = 300 * 1024 * 1024
PATHS = ("/v1/responses", "/api/keys", "/healthz")
OFF = str(400 * 1024 * 1024)


def oversized(base: str, path: str) -> tuple[int, int, float]:
    """(status, bytes of body sent, seconds to the answer) of one 300 MiB POST without a key."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    started = time.monotonic()
    sent = 0
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {DECLARED}\r\n\r\n"
        )
        sock.sendall(head.encode())
        sock.setblocking(False)
        piece = b"x" * (1 << 20)
        answer = b""
        while sent < DECLARED:
            try:
                answer += sock.recv(65536)
                break  # the server answered: stop sending, as an HTTP client does
            except BlockingIOError:
                pass
            except ConnectionResetError:
                break
            try:
                sent += sock.send(piece[: DECLARED - sent])
            except BlockingIOError:
                time.sleep(0.001)
            except (BrokenPipeError, ConnectionResetError):
                break
        sock.setblocking(True)
        try:
            while b"\r\n" not in answer and (chunk := sock.recv(65536)):
                answer += chunk
        except ConnectionResetError:
            pass
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    return status, sent, time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default="daphne")
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--limits-off", action="store_true", help="every limit above 300 MiB")
    args = p.parse_args()
    env = {}
    if args.limits_off:
        env = {
            name: OFF
            for name in (
                "OCX_PROXY_MAX_BODY",
                "OCX_API_MAX_BODY",
                "OCX_OTHER_MAX_BODY",
                "OCX_UNAUTH_MAX_BODY",
            )
        }
    _, mock_base = run.start_mock()
    t = run.start_ocx("ocx", mock_base, server=args.server, extra_env=env)
    worker = t.workers()[0]

    def show(stage: str) -> None:
        rss = run.rss_bytes([worker]) / 2**20
        hwm = run.hwm_bytes([worker]) / 2**20
        print(f"{stage:28s} RSS {rss:6.1f} MiB   peak {hwm:6.1f} MiB", flush=True)

    show(f"{args.server}: before")
    statuses: dict[int, int] = {}
    sent_total = 0
    slowest = 0.0
    for i in range(args.requests):
        status, sent, took = oversized(t.base, PATHS[i % len(PATHS)])
        statuses[status] = statuses.get(status, 0) + 1
        sent_total += sent
        slowest = max(slowest, took)
    show(f"{args.server}: after {args.requests}")
    print(
        f"answers {dict(sorted(statuses.items()))}, body sent {sent_total / 2**20:.1f} MiB"
        f" in all, slowest answer {slowest * 1000:.0f} ms",
        flush=True,
    )


if __name__ == "__main__":
    try:
        main()
    finally:
        run.cleanup()
