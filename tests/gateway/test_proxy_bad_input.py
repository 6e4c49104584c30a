"""End-to-end: bad client input gets a clear OpenAI-shaped 4xx and reaches no upstream; an
upstream answering garbage gives a clean 5xx or a hop, never a crash (PRODUCT §4.1, §5)."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server, sse_events

PRIMARY_KEY = "sk-test-primary-aaaaaaaaaaaaaaaaaaaa"
BACKUP_KEY = "sk-test-backup-bbbbbbbbbbbbbbbbbbbbb"


def sync(server: Server) -> None:
    # Any /v1 request starts the worker's runtime (and its config poller); 401 is fine here.
    server.http.get("/v1/models")
    server.wait_synced()


def setup_combo(
    server: Server, mock: Mock, targets: list[tuple[str, str]], adapter: str = "openai-responses"
) -> tuple[str, dict[str, str]]:
    key = server.create_key()
    by_provider: dict[str, list[str]] = {}
    for name, model in targets:
        by_provider.setdefault(name, []).append(model)
    for name, models in by_provider.items():
        server.put_provider(
            name,
            {
                "adapter": adapter,
                "baseUrl": mock.url + "/v1",
                "apiKey": PRIMARY_KEY if name == "p1" else BACKUP_KEY,
                "timeouts": {"firstByteMs": 1000, "idleMs": 1000},
                "models": {m: {"contextWindow": 100000} for m in models},
            },
        )
    combo_id = "b" + uuid.uuid4().hex[:8]
    server.put_combo(combo_id, {"targets": [{"provider": p, "model": m} for p, m in targets]})
    sync(server)
    return combo_id, {"Authorization": f"Bearer {key}"}


@pytest.fixture
def routed(server: Server, mock: Mock) -> tuple[str, dict[str, str]]:
    return setup_combo(server, mock, [("p1", "in1")])


def assert_client_error(r: httpx.Response, status: int, mock: Mock) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-ocx-request-id"])
    body = r.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert {"type", "code", "message"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"
    assert mock.log() == []  # no upstream was contacted
    return error


# ---------------------------------------------------------------------------------------------
# Bad client input


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "x", "input": "hi"',
        b"not json at all",
        b"",
        b'{"model": "x",}',
    ],
    ids=["truncated", "text", "empty", "trailing-comma"],
)
def test_malformed_json(
    server: Server, mock: Mock, routed: tuple[str, dict[str, str]], path: str, raw: bytes
) -> None:
    _, headers = routed
    r = server.http.post(path, content=raw, headers={**headers, "content-type": "application/json"})
    assert assert_client_error(r, 400, mock)["code"] == "invalid_json"


@pytest.mark.parametrize(
    "content_type",
    ["multipart/form-data; boundary=zz", "application/x-www-form-urlencoded"],
)
def test_a_form_content_type_reaches_ocx_not_the_server_form_parser(
    server: Server, mock: Mock, routed: tuple[str, dict[str, str]], content_type: str
) -> None:
    # Twisted would decode the body as a form first and answer a malformed multipart body
    # with its own HTML 400 (server.daphne_main switches that parsing off).
    _, headers = routed
    r = server.http.post(
        "/v1/chat/completions",
        content=b"not a form",
        headers={**headers, "content-type": content_type},
    )
    assert assert_client_error(r, 400, mock)["code"] == "invalid_json"


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"combo/x"', b"42", b"null", b"true"])
def test_non_object_json(
    server: Server, mock: Mock, routed: tuple[str, dict[str, str]], raw: bytes
) -> None:
    _, headers = routed
    r = server.http.post("/v1/responses", content=raw, headers=headers)
    error = assert_client_error(r, 400, mock)
    assert "object" in error["message"]


@pytest.mark.parametrize(
    "body",
    [{"input": "hi"}, {"model": None}, {"model": 7}, {"model": ""}, {"model": "  "}],
    ids=["missing", "null", "number", "empty", "blank"],
)
def test_missing_or_invalid_model(
    server: Server, mock: Mock, routed: tuple[str, dict[str, str]], body: dict[str, Any]
) -> None:
    _, headers = routed
    r = server.http.post("/v1/responses", json=body, headers=headers)
    error = assert_client_error(r, 400, mock)
    assert "model" in error["message"]


def test_invalid_utf8(server: Server, mock: Mock, routed: tuple[str, dict[str, str]]) -> None:
    combo_id, headers = routed
    raw = b'{"model": "combo/' + combo_id.encode() + b'", "input": "\xff\xfe bad"}'
    r = server.http.post(
        "/v1/responses", content=raw, headers={**headers, "content-type": "application/json"}
    )
    error = assert_client_error(r, 400, mock)
    assert "UTF-8" in error["message"]


def test_stream_must_be_boolean(
    server: Server, mock: Mock, routed: tuple[str, dict[str, str]]
) -> None:
    combo_id, headers = routed
    body = {"model": f"combo/{combo_id}", "input": "hi", "stream": "yes"}
    r = server.http.post("/v1/responses", json=body, headers=headers)
    assert "stream" in assert_client_error(r, 400, mock)["message"]


def test_oversized_body(server: Server, mock: Mock, routed: tuple[str, dict[str, str]]) -> None:
    # The default limit is 32 MiB (OCX_PROXY_MAX_BODY); sending a little more is fast on loopback.
    combo_id, headers = routed
    filler = b"x" * (32 * 1024 * 1024 + 1024)
    raw = b'{"model": "combo/' + combo_id.encode() + b'", "input": "' + filler + b'"}'
    try:
        r = server.http.post(
            "/v1/responses", content=raw, headers={**headers, "content-type": "application/json"}
        )
    except httpx.TransportError:
        pytest.fail("the proxy dropped the connection instead of answering 413")
    assert assert_client_error(r, 413, mock)["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/responses"),
        ("PUT", "/v1/responses"),
        ("DELETE", "/v1/chat/completions"),
        ("GET", "/v1/chat/completions"),
        ("POST", "/v1/models"),
    ],
)
def test_wrong_method(
    server: Server,
    mock: Mock,
    routed: tuple[str, dict[str, str]],
    method: str,
    path: str,
) -> None:
    combo_id, headers = routed
    r = server.http.request(
        method, path, headers=headers, json={"model": f"combo/{combo_id}", "input": "hi"}
    )
    assert assert_client_error(r, 405, mock)["code"] == "method_not_allowed"


def test_unknown_endpoint(server: Server, mock: Mock, routed: tuple[str, dict[str, str]]) -> None:
    combo_id, headers = routed
    r = server.http.post(
        "/v1/completions", json={"model": f"combo/{combo_id}", "prompt": "hi"}, headers=headers
    )
    assert assert_client_error(r, 404, mock)["code"] == "not_found"


def test_bad_input_still_requires_a_key(server: Server, mock: Mock) -> None:
    setup_combo(server, mock, [("p1", "in2")])
    r = server.http.post("/v1/responses", content=b"{not json")
    assert r.status_code == 401
    assert mock.log() == []


def test_proxy_still_serves_after_bad_input(
    server: Server, mock: Mock, routed: tuple[str, dict[str, str]]
) -> None:
    combo_id, headers = routed
    for raw in (b"{", b"[]", b"\xff"):
        assert server.http.post("/v1/responses", content=raw, headers=headers).status_code == 400
    r = server.http.post(
        "/v1/responses", json={"model": f"combo/{combo_id}", "input": "hi"}, headers=headers
    )
    assert r.status_code == 200
    assert mock.hits("in1") == 1


# ---------------------------------------------------------------------------------------------
# An upstream answering garbage


def ask(
    server: Server, combo_id: str, headers: dict[str, str], *, stream: bool = False
) -> httpx.Response:
    body = {"model": f"combo/{combo_id}", "input": "hi", "stream": stream}
    return server.http.post("/v1/responses", json=body, headers=headers)


def assert_upstream_error(r: httpx.Response) -> dict[str, Any]:
    assert 500 <= r.status_code <= 599, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert {"type", "code", "message"} <= set(error)
    return error


@pytest.mark.parametrize(
    "step",
    [
        {"status": 500, "body": "<html><body>Internal Server Error</body></html>"},
        {"status": 502, "body": ""},
        {"status": 503, "body": '{"error": {"message": '},
        {"status": 500, "body": [1, 2, 3]},
        {"status": 500, "body": {"error": "just a string"}},
    ],
    ids=["html", "empty", "truncated-json", "json-list", "string-error"],
)
@pytest.mark.parametrize("stream", [False, True])
def test_garbage_error_body_hops(
    server: Server, mock: Mock, step: dict[str, Any], stream: bool
) -> None:
    mock.script("ga", [step], then=step)
    combo_id, headers = setup_combo(server, mock, [("p1", "ga"), ("p2", "gb")])
    r = ask(server, combo_id, headers, stream=stream)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/gb"
    assert r.headers["x-ocx-attempts"] == "2"

    # With nothing left to try, the garbage becomes a clean OpenAI-shaped error.
    single, headers = setup_combo(server, mock, [("p1", "ga")])
    r = ask(server, single, headers, stream=stream)
    assert r.status_code == step["status"]
    assert_upstream_error(r)


def test_malformed_frame_before_output_is_held_then_forwarded(server: Server, mock: Mock) -> None:
    # Same protocol: a malformed frame before any output neither commits nor hops; it is held
    # with the buffer and forwarded as received once real output commits (PRODUCT §5.4).
    mock.script("ma", [{"malformed_after_events": 0}])
    combo_id, headers = setup_combo(server, mock, [("p1", "ma"), ("p2", "mb")])
    r = ask(server, combo_id, headers, stream=True)
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/ma"
    assert r.text.startswith("data: {not json\n\n")
    assert sse_events(r.text)[-1][0] == "response.completed"
    assert mock.hits("mb") == 0


def test_malformed_frame_then_zero_output_failure_hops(server: Server, mock: Mock) -> None:
    # Held garbage followed by a zero-output failure: still a hop, and the garbage of the
    # failed attempt never reaches the client.
    mock.script("mf", [{"malformed_after_events": 0, "fail": "before_output"}])
    combo_id, headers = setup_combo(server, mock, [("p1", "mf"), ("p2", "mg")])
    r = ask(server, combo_id, headers, stream=True)
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p2/mg"
    assert "{not json" not in r.text
    assert sse_events(r.text)[-1][0] == "response.completed"


def test_malformed_chat_stream_before_output_is_forwarded(server: Server, mock: Mock) -> None:
    mock.script("mc", [{"malformed_after_events": 0}])
    combo_id, headers = setup_combo(server, mock, [("p1", "mc"), ("p2", "md")], "openai-chat")
    r = server.http.post(
        "/v1/chat/completions",
        json={
            "model": f"combo/{combo_id}",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
        headers=headers,
    )
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p1/mc"
    assert r.text.startswith("data: {not json\n\n")
    assert sse_events(r.text)[-1][1] == "[DONE]"
    assert mock.hits("md") == 0


def test_malformed_translated_stream_before_output_hops(server: Server, mock: Mock) -> None:
    # Translated (Chat upstream, Responses client): garbage before output is a failed attempt.
    mock.script("mt", [{"malformed_after_events": 0}], then={"malformed_after_events": 0})
    combo_id, headers = setup_combo(server, mock, [("p1", "mt"), ("p2", "mu")], "openai-chat")
    r = ask(server, combo_id, headers, stream=True)
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p2/mu"
    assert "{not json" not in r.text
    assert sse_events(r.text)[-1][0] == "response.completed"

    single, headers = setup_combo(server, mock, [("p1", "mt")], "openai-chat")
    r = ask(server, single, headers, stream=True)
    assert_upstream_error(r)


@pytest.mark.parametrize("chat_client", [False, True])
def test_malformed_non_stream_success_body_hops(
    server: Server, mock: Mock, chat_client: bool
) -> None:
    # A 200 whose JSON body is truncated (same protocol and translated).
    mock.script("na", [{"malformed_after_events": 0}])
    combo_id, headers = setup_combo(server, mock, [("p1", "na"), ("p2", "nb")])
    if chat_client:
        r = server.http.post(
            "/v1/chat/completions",
            json={"model": f"combo/{combo_id}", "messages": [{"role": "user", "content": "hi"}]},
            headers=headers,
        )
    else:
        r = ask(server, combo_id, headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/nb"
    r.json()


def test_non_json_success_body_hops(server: Server, mock: Mock) -> None:
    mock.script("ha", [{"status": 200, "body": "<html>captive portal</html>"}])
    combo_id, headers = setup_combo(server, mock, [("p1", "ha"), ("p2", "hb")])
    r = ask(server, combo_id, headers)
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p2/hb"
    assert r.json()["output"][0]["content"][0]["text"] == "mock reply from hb"


@pytest.mark.parametrize("stream", [False, True])
def test_connection_reset_hops(server: Server, mock: Mock, stream: bool) -> None:
    mock.script("ra", [{"reset": True}])
    combo_id, headers = setup_combo(server, mock, [("p1", "ra"), ("p2", "rb")])
    r = ask(server, combo_id, headers, stream=stream)
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p2/rb"
    assert mock.hits("ra") == 1


@pytest.mark.parametrize("stream", [False, True])
def test_cut_before_output_hops(server: Server, mock: Mock, stream: bool) -> None:
    mock.script("ca", [{"cut_after_events": 2}])
    combo_id, headers = setup_combo(server, mock, [("p1", "ca"), ("p2", "cb")])
    r = ask(server, combo_id, headers, stream=stream)
    assert r.status_code == 200
    assert r.headers["x-ocx-target"] == "p2/cb"
