"""Masking by value whatever the encoding (issue #43, point 1), end to end.

An upstream's JSON encoder may spell a credential with escapes (`\\/`, `\\uXXXX` of any
character, either case of hex digits): decoded, it is the key. A raw upstream here (a real
socket, bytes as written) sends such spellings in an error frame after output, in a plain
output delta, in a non-streaming answer and in an error before commit; none reaches the client,
the request log or the server's log, escaped or not. A frame without a secret is passed on
byte for byte (the escapes of ordinary text are left alone).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.conftest import Server

SECRET = "prov-esc/SECRET-key-ABCD1234wxyz"


def _u(text: str, upper: bool = False) -> str:
    return "".join(("\\u%04X" if upper else "\\u%04x") % ord(c) for c in text)


# Spellings an upstream's encoder can produce (each decodes to SECRET).
SPELLINGS = {
    "slash": SECRET.replace("/", "\\/"),
    "one-u": "prov-esc\\/\\u0053ECRET-key-ABCD1234wxyz",
    "all-u-upper": _u(SECRET, upper=True),
    "mixed": "pr" + _u("ov-esc/SEC") + "RET-key-" + _u("ABCD", upper=True) + "1234w\\u0078yz",
}
# Ordinary escaped text: must reach the client exactly as sent.
PLAIN_DELTA = 'data: {"type":"response.output_text.delta","delta":"caf\\u00e9 \\/ ok"}\n\n'


def frame(obj: str) -> str:
    return f"data: {obj}\n\n"


class _Upstream:
    """A raw HTTP/1.1 upstream: every POST gets the next scripted (status, content type, body)."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, str, bytes]] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("content-length") or 0))
                status, kind, body = upstream.answers.pop(0)
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def upstream() -> Iterator[_Upstream]:
    raw = _Upstream()
    yield raw
    raw.http.shutdown()


def _setup(server: Server, upstream: _Upstream) -> tuple[str, dict[str, str]]:
    tag = uuid.uuid4().hex[:6]
    server.put_provider(
        f"esc{tag}",
        {
            "adapter": "openai-responses",
            "baseUrl": upstream.url,
            "apiKey": SECRET,
            "timeouts": {"firstByteMs": 3000, "idleMs": 3000},
            "models": {"m": {"contextWindow": 100000}},
        },
    )
    server.wait_synced()
    return f"esc{tag}/m", {"Authorization": f"Bearer {server.create_key()}"}


def _stream(*frames: str) -> tuple[int, str, bytes]:
    return 200, "text/event-stream", "".join(frames).encode()


CREATED = frame('{"type":"response.created","response":{"id":"r1","status":"in_progress"}}')
DELTA = frame('{"type":"response.output_text.delta","delta":"Hello"}')


def _logged(server: Server, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 5
    while True:
        found = server.api.get("/api/requests", params={"request_id": request_id}).json()
        if found["requests"] or time.monotonic() > deadline:
            return found["requests"][0]  # type: ignore[no-any-return]
        time.sleep(0.05)


def _nowhere(server: Server, *texts: str) -> None:
    for text in (*texts, "".join(server.output)):
        decoded = text.replace("\\/", "/")
        assert SECRET not in decoded
        for spelling in SPELLINGS.values():
            assert spelling not in text


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_escaped_key_in_an_error_after_output(
    server: Server, upstream: _Upstream, spelling: str
) -> None:
    model, headers = _setup(server, upstream)
    failed = (
        '{"type":"response.failed","response":{"id":"r1","status":"failed","error":'
        '{"code":"invalid_api_key","message":"Incorrect API key provided: '
        + SPELLINGS[spelling]
        + '"}}}'
    )
    upstream.answers.append(_stream(CREATED, DELTA, frame(failed)))
    r = server.http.post(
        "/v1/responses", json={"model": model, "input": "hi", "stream": True}, headers=headers
    )
    assert r.status_code == 200, r.text
    assert '"Hello"' in r.text
    assert "Incorrect API key provided: …wxyz" in r.text
    _nowhere(server, r.text, str(_logged(server, r.headers["x-ocx-request-id"])))


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_escaped_key_in_a_plain_delta(server: Server, upstream: _Upstream, spelling: str) -> None:
    model, headers = _setup(server, upstream)
    leak = frame(
        '{"type":"response.output_text.delta","delta":"your key is ' + SPELLINGS[spelling] + '"}'
    )
    done = frame('{"type":"response.completed","response":{"id":"r1","status":"completed"}}')
    upstream.answers.append(_stream(CREATED, DELTA, PLAIN_DELTA, leak, PLAIN_DELTA, done))
    r = server.http.post(
        "/v1/responses", json={"model": model, "input": "hi", "stream": True}, headers=headers
    )
    assert r.status_code == 200, r.text
    assert "your key is …wxyz" in r.text
    # A frame without a secret is forwarded as received, escapes and all.
    assert r.text.count(PLAIN_DELTA) == 2
    _nowhere(server, r.text)


def test_escaped_key_in_a_non_streaming_answer(server: Server, upstream: _Upstream) -> None:
    model, headers = _setup(server, upstream)
    answer = (
        '{"id":"r1","object":"response","status":"completed","output":[{"type":"message",'
        '"role":"assistant","content":[{"type":"output_text","text":"key '
        + SPELLINGS["mixed"]
        + '"}]}]}'
    )
    upstream.answers.append((200, "application/json", answer.encode()))
    r = server.http.post("/v1/responses", json={"model": model, "input": "hi"}, headers=headers)
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["content"][0]["text"] == "key …wxyz"
    _nowhere(server, r.text)


@pytest.mark.parametrize("stream", [False, True])
def test_escaped_key_in_an_error_before_commit(
    server: Server, upstream: _Upstream, stream: bool
) -> None:
    model, headers = _setup(server, upstream)
    body = (
        '{"error":{"message":"Incorrect API key provided: '
        + SPELLINGS["all-u-upper"]
        + '","type":"invalid_request_error","code":"invalid_api_key"}}'
    )
    upstream.answers.append((401, "application/json", body.encode()))
    r = server.http.post(
        "/v1/responses", json={"model": model, "input": "hi", "stream": stream}, headers=headers
    )
    assert r.status_code == 401, r.text
    assert "Incorrect API key provided: …wxyz" in r.json()["error"]["message"]
    _nowhere(server, r.text, json.dumps(_logged(server, r.headers["x-ocx-request-id"])))
