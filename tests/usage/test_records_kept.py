"""No record lost to one bad row (issue #26, point 3).

Strings a client sends (the model name can carry `\\u0000` or a lone surrogate) are cleaned
before they reach the request-log and usage writers; a batch the database still refuses is
written row by row, and only the rows that fail are dropped (counted in `/metrics`, logged with
the request id). Runs on SQLite, and on PostgreSQL when DATABASE_URL points at it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tests.conftest import Mock, Server

KEY = "sk-test-records-kept-aaaaaaaaaaaaaaaa"


def _rows(server: Server, user: str, want: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        r = server.api.get("/api/requests", params={"user": user, "limit": 100})
        assert r.status_code == 200, r.text
        found: list[dict[str, Any]] = r.json()["requests"]
        if len(found) >= want or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _usage(server: Server, user: str, want: int, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = server.api.get("/api/usage", params={"by": "user"})
        assert r.status_code == 200, r.text
        mine = [row for row in r.json()["rows"] if row["user"] == user]
        if (mine and mine[0]["requests"] >= want) or time.monotonic() > deadline:
            return mine[0] if mine else {}
        time.sleep(0.1)


def test_a_nul_in_the_model_loses_no_other_record(server: Server, mock: Mock) -> None:
    user = "rk" + uuid.uuid4().hex[:8]
    key = server.create_key(user=user)
    model = "rk-" + uuid.uuid4().hex[:6]
    server.put_provider(
        "rkp",
        {
            "adapter": "openai-responses",
            "baseUrl": mock.url + "/v1",
            "apiKey": KEY,
            "models": {model: {"contextWindow": 100000}},
        },
    )
    server.wait_synced()
    mock.script(model, [], then={"usage": {"input_tokens": 10, "output_tokens": 3}})
    headers = {"Authorization": f"Bearer {key}", "content-type": "application/json"}
    ids = []
    for _ in range(5):
        r = server.http.post(
            "/v1/responses", json={"model": f"rkp/{model}", "input": "hi"}, headers=headers
        )
        assert r.status_code == 200, r.text
        ids.append(r.headers["x-ocx-request-id"])
    # Sent together with the five (one batch): a NUL and a lone surrogate, as JSON escapes.
    r = server.http.post(
        "/v1/responses", content=b'{"model": "combo/x\\u0000", "input": "hi"}', headers=headers
    )
    assert r.status_code == 404, r.text
    r = server.http.post("/v1/responses", content=b'{"model": "y\\ud800"}', headers=headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_model"

    rows = _rows(server, user, 7)
    by_id = {row["requestId"]: row for row in rows}
    assert set(ids) <= set(by_id)
    assert len(rows) == 7
    for rid in ids:
        assert by_id[rid]["usage"]["inputTokens"] == 10
    models = sorted(row["model"] for row in rows if row["status"] in (400, 404))
    assert models == ["combo/x\ufffd", "y\ufffd"]
    usage = _usage(server, user, 7)
    assert usage["requests"] == 7
    assert usage["inputTokens"] == 50 and usage["outputTokens"] == 15


def _entries(n: int, bad: int | None = None) -> list[Any]:
    from usage import requestlog

    out = []
    for i in range(n):
        model = "m\ud800" if i == bad else "m"
        out.append(
            requestlog.RequestEntry(
                request_id=f"rk-{uuid.uuid4().hex[:8]}-{i}",
                at=time.time(),
                user="rk-unit",
                requested_model=model,
                status=200,
                input_tokens=4,
                output_tokens=2,
            )
        )
    return out


def test_clean_entry_cleans_every_string() -> None:
    from usage import requestlog

    e = requestlog.RequestEntry(
        request_id="r",
        at=0.0,
        requested_model="p/a\x00b\udc80",
        target="p/a\x00",
        attempts=[{"target": "p/\x00", "status": 400}],
        skipped=[["p/\ud800", "disabled"]],
    )
    requestlog.clean_entry(e)
    assert e.requested_model == "p/a\ufffdb\ufffd"
    assert e.target == "p/a\ufffd"
    assert e.attempts == [{"target": "p/\ufffd", "status": 400}]
    assert e.skipped == [["p/\ufffd", "disabled"]]
    assert requestlog.clean_text("plain") == "plain"


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's database calls in this thread (the test database's connection)."""
    from server import background

    async def in_thread(fn: Callable[..., Any], *args: object) -> Any:
        return fn(*args)

    monkeypatch.setattr(background, "in_thread", in_thread)


def _run(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never suspends (`direct`) in this thread and context: the test's
    own database connection and transaction."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise AssertionError("the coroutine waited")


@pytest.mark.django_db
def test_a_refused_batch_is_written_row_by_row(
    direct: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A row the cleaning missed (here: cleaning switched off) fails the batch on both
    databases; the writer then writes the others one by one and drops only that row."""
    from server import metrics
    from usage import requestlog
    from usage.models import RequestLog, UsageRollup

    monkeypatch.setattr(requestlog, "clean_entry", lambda e: e)
    writer = requestlog.new_writer()
    batch = _entries(6, bad=3)
    before = metrics.RECORDS_REJECTED.labels("request log")._value.get()
    with caplog.at_level(logging.ERROR, logger="ocx.background"):
        _run(writer.flush(batch))

    ids = set(RequestLog.objects.values_list("request_id", flat=True))
    tokens = sum(r.input_tokens for r in UsageRollup.objects.filter(user="rk-unit"))
    assert ids == {e.request_id for i, e in enumerate(batch) if i != 3}
    assert tokens == 5 * 4
    assert writer.rejected == 1 and writer.written == 5
    assert metrics.RECORDS_REJECTED.labels("request log")._value.get() - before == 1
    assert batch[3].request_id in caplog.text
