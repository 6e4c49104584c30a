"""A small asyncio client for streaming benchmarks: time to first byte and first token.

    python bench/stream_client.py --url http://127.0.0.1:P/v1/chat/completions --api chat \
        --model combo/bench --key ocx_... --concurrency 16 --duration 8 [--json]

It speaks HTTP/1.1 on raw asyncio streams (keep-alive, chunked or Content-Length bodies), so
its own cost per stream is small and the numbers do not include an HTTP library's overhead.
Each of `--concurrency` connections sends streaming requests back to back until the time is
up (or `--requests` in all). Per request it records:

* TTFB: request written -> status line and headers read;
* TTFT: request written -> first SSE event that carries text (Chat: a chunk whose
  `choices[0].delta.content` is non-empty; Responses: `response.output_text.delta`);
* total: request written -> end of the body.

A stream counts as complete only if it ends with its terminal event (`data: [DONE]` for Chat,
`response.completed` for Responses); a 200 without it is reported as `truncated`.
The output is a JSON object (percentiles in milliseconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from urllib.parse import urlsplit

BODIES = {
    "chat": {
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Say hello in one short sentence."},
        ],
    },
    "responses": {
        "max_output_tokens": 64,
        "instructions": "You are a terse assistant.",
        "input": [{"role": "user", "content": "Say hello in one short sentence."}],
    },
}


class Result:
    __slots__ = ("status", "ttfb", "ttft", "total", "complete", "error")

    def __init__(self) -> None:
        self.status = 0
        self.ttfb: float | None = None
        self.ttft: float | None = None
        self.total: float | None = None
        self.complete = False
        self.error: str | None = None


def _is_token(api: str, data: str) -> bool:
    if api == "chat":
        if '"content"' not in data:
            return False
        try:
            obj = json.loads(data)
            return bool(obj["choices"][0]["delta"].get("content"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return False
    return "response.output_text.delta" in data


def _is_terminal(api: str, data: str) -> bool:
    if api == "chat":
        return data.strip() == "[DONE]"
    return "response.completed" in data


class Conn:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def ensure(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.writer is None or self.writer.is_closing() or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self.reader, self.writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def one_request(conn: Conn, request: bytes, api: str) -> Result:
    res = Result()
    reader, writer = await conn.ensure()
    t0 = time.perf_counter()
    writer.write(request)
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("connection closed before the status line")
    res.status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    res.ttfb = time.perf_counter() - t0
    buf = ""

    def feed(text: str) -> None:
        nonlocal buf
        buf += text
        while "\n" in buf:
            line, buf = buf.split("\n", 1)
            line = line.rstrip("\r")
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if res.ttft is None and _is_token(api, data):
                res.ttft = time.perf_counter() - t0
            if _is_terminal(api, data):
                res.complete = True

    keep = headers.get("connection", "").lower() != "close"
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readline()
            if not size_line:
                raise ConnectionError("connection closed inside a chunked body")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                break
            chunk = await reader.readexactly(size + 2)
            feed(chunk[:-2].decode("utf-8", "replace"))
    elif "content-length" in headers:
        feed((await reader.readexactly(int(headers["content-length"]))).decode("utf-8", "replace"))
    else:
        feed((await reader.read()).decode("utf-8", "replace"))
        keep = False
    feed("\n")
    res.total = time.perf_counter() - t0
    if not keep:
        conn.close()
    return res


def build_request(url: str, api: str, model: str, key: str | None) -> tuple[str, int, bytes]:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    body = json.dumps({"model": model, "stream": True, **BODIES[api]}).encode()
    lines = [
        f"POST {parts.path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {len(body)}",
    ]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    return host, port, ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def run(args: argparse.Namespace) -> dict[str, object]:
    host, port, request = build_request(args.url, args.api, args.model, args.key)
    results: list[Result] = []
    errors: dict[str, int] = {}
    deadline = time.perf_counter() + args.duration
    budget = [args.requests or 0]

    async def worker() -> None:
        conn = Conn(host, port)
        while time.perf_counter() < deadline:
            if args.requests:
                if budget[0] <= 0:
                    break
                budget[0] -= 1
            try:
                res = await asyncio.wait_for(one_request(conn, request, args.api), args.timeout)
                results.append(res)
            except (
                TimeoutError,
                OSError,
                ConnectionError,
                ValueError,
                IndexError,
                asyncio.IncompleteReadError,
            ) as exc:
                name = type(exc).__name__
                errors[name] = errors.get(name, 0) + 1
                conn.close()
                await asyncio.sleep(0.01)
        conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    elapsed = time.perf_counter() - started
    ok = [r for r in results if r.status == 200 and r.complete]
    truncated = sum(1 for r in results if r.status == 200 and not r.complete)
    non200 = sum(1 for r in results if r.status != 200)
    return {
        "url": args.url,
        "api": args.api,
        "concurrency": args.concurrency,
        "elapsed_s": round(elapsed, 3),
        "requests": len(results),
        "complete": len(ok),
        "truncated": truncated,
        "non200": non200,
        "errors": errors,
        "streams_per_s": round(len(ok) / elapsed, 1) if elapsed else 0.0,
        "ttfb_ms": _pcts([r.ttfb for r in ok]),
        "ttft_ms": _pcts([r.ttft for r in ok]),
        "total_ms": _pcts([r.total for r in ok]),
    }


def _pcts(values: list[float | None]) -> dict[str, float | None]:
    xs = sorted(v * 1000 for v in values if v is not None)
    if not xs:
        return {"p50": None, "p90": None, "p99": None, "n": 0}

    def q(p: float) -> float:
        return round(xs[min(len(xs) - 1, int(p / 100 * len(xs)))], 3)

    return {
        "p50": q(50),
        "p90": q(90),
        "p99": q(99),
        "mean": round(sum(xs) / len(xs), 3),
        "n": len(xs),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--api", choices=("chat", "responses"), default="chat")
    p.add_argument("--model", default="m")
    p.add_argument("--key", default=None)
    p.add_argument("--concurrency", "-c", type=int, default=1)
    p.add_argument("--duration", "-d", type=float, default=5.0)
    p.add_argument("--requests", "-n", type=int, default=0, help="stop after N requests in all")
    p.add_argument("--timeout", type=float, default=30.0, help="per request, seconds")
    args = p.parse_args(argv)
    out = asyncio.run(run(args))
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
