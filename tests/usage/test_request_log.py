"""The request log (PRODUCT §9.3): one entry per proxy request with its route trace, written in
batches off the hot path (bounded queue: full ⇒ drop and count), with a retention.

End-to-end tests use a real `ocx serve` and `ocx mock-upstream`; the queue and retention tests are
unit-level.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import Mock, Server, sse_events

P1_KEY = "sk-test-reqlog-p1-aaaaaaaaaaaaaaaa"
P2_KEY = "sk-test-reqlog-p2-bbbbbbbbbbbbbbbb"
PROMPT = "PROMPT-TEXT-never-in-the-log-7c1e"


def provider(base_url: str, *models: str, api_key: str, disabled: bool = False) -> dict[str, Any]:
    return {
        "adapter": "openai-responses",
        "baseUrl": base_url,
        "apiKey": api_key,
        "disabled": disabled,
        "timeouts": {"firstByteMs": 2000, "idleMs": 2000},
        "models": {m: {"contextWindow": 100000} for m in models},
    }


def setup(server: Server, mock: Mock, *, user: str = "logdev") -> tuple[str, str, dict[str, str]]:
    """Providers p0 (disabled), p1, p2 on the mock; combo over p0/fz, p1/fa, p2/fb.
    Returns (combo id, client key, client headers)."""
    key = server.create_key(user=user)
    server.put_provider("p0", provider(mock.url + "/v1", "fz", api_key=P1_KEY, disabled=True))
    server.put_provider("p1", provider(mock.url + "/v1", "fa", api_key=P1_KEY))
    server.put_provider("p2", provider(mock.url + "/v1", "fb", api_key=P2_KEY))
    combo_id = "log" + uuid.uuid4().hex[:8]
    server.put_combo(
        combo_id,
        {
            "targets": [
                {"provider": "p0", "model": "fz"},
                {"provider": "p1", "model": "fa"},
                {"provider": "p2", "model": "fb"},
            ]
        },
    )
    server.http.get("/v1/models")
    server.wait_synced()
    return combo_id, key, {"Authorization": f"Bearer {key}"}


def ask(
    server: Server, combo_id: str, headers: dict[str, str], *, stream: bool = False
) -> httpx.Response:
    body = {"model": f"combo/{combo_id}", "input": PROMPT, "stream": stream}
    return server.http.post("/v1/responses", json=body, headers=headers)


def entries(server: Server, **params: Any) -> list[dict[str, Any]]:
    r = server.api.get("/api/requests", params=params)
    assert r.status_code == 200, r.text
    return r.json()["requests"]


def logged(server: Server, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
    """The one entry of `request_id` (writes are batched every ≤ 0.5 s: poll briefly)."""
    deadline = time.monotonic() + timeout
    while True:
        found = entries(server, request_id=request_id)
        if found:
            assert len(found) == 1, found
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no request log entry for {request_id}")
        time.sleep(0.05)


def assert_clean(text: str, *secrets: str) -> None:
    for secret in (PROMPT, P1_KEY, P2_KEY, *secrets):
        assert secret not in text, f"{secret!r} leaked into the request log"


def test_hop_is_one_entry_with_the_full_route_trace(server: Server, mock: Mock) -> None:
    mock.script("fa", [{"status": 500}])
    mock.script(
        "fb", [], then={"usage": {"input_tokens": 11, "output_tokens": 7, "cached_tokens": 3}}
    )
    combo_id, key, headers = setup(server, mock)

    r = ask(server, combo_id, headers)

    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == "p2/fb"
    request_id = r.headers["x-ocx-request-id"]
    entry = logged(server, request_id)
    time.sleep(0.6)  # one more batch period: still exactly one entry
    assert len(entries(server, request_id=request_id)) == 1

    assert entry["requestId"] == request_id
    assert entry["user"] == "logdev"
    assert entry["keyPrefix"] == key[:10]
    assert entry["model"] == f"combo/{combo_id}"
    assert entry["combo"] == combo_id
    assert entry["target"] == "p2/fb"
    assert entry["status"] == 200
    assert entry["outcome"] == "ok"
    assert entry["stream"] is False
    assert entry["usage"] == {"inputTokens": 11, "outputTokens": 7, "cachedTokens": 3}
    assert entry["skipped"] == [["p0/fz", "provider_disabled"]]
    first, second = entry["attempts"]
    assert first["target"] == "p1/fa"
    assert first["status"] == 500
    assert first["outcome"] == "hop"
    assert first["reason"]
    assert isinstance(first["cooledUntil"], int) and first["cooledUntil"] > time.time() * 1000
    assert second["target"] == "p2/fb"
    assert second["status"] == 200
    assert second["outcome"] == "served"
    assert second["cooledUntil"] is None
    assert all(isinstance(a["ms"], int) and a["ms"] >= 0 for a in entry["attempts"])
    at = dt.datetime.fromisoformat(entry["at"].replace("Z", "+00:00"))
    assert abs((dt.datetime.now(dt.UTC) - at).total_seconds()) < 60
    assert_clean(json.dumps(entry), key)

    # The next request finds p1/fa cooling: a skipped target with its reason.
    r = ask(server, combo_id, headers)
    assert r.status_code == 200, r.text
    entry = logged(server, r.headers["x-ocx-request-id"])
    assert ["p1/fa", "cooling"] in entry["skipped"]
    assert ["p0/fz", "provider_disabled"] in entry["skipped"]
    assert [a["target"] for a in entry["attempts"]] == ["p2/fb"]


def test_streamed_request_records_usage(server: Server, mock: Mock) -> None:
    mock.script(
        "fa", [], then={"usage": {"input_tokens": 21, "output_tokens": 5, "cached_tokens": 2}}
    )
    combo_id, key, headers = setup(server, mock)

    r = ask(server, combo_id, headers, stream=True)

    assert r.status_code == 200, r.text
    assert [e for e, _ in sse_events(r.text)].count("response.completed") == 1
    entry = logged(server, r.headers["x-ocx-request-id"])
    assert entry["stream"] is True
    assert entry["target"] == "p1/fa"
    assert entry["status"] == 200
    assert entry["usage"] == {"inputTokens": 21, "outputTokens": 5, "cachedTokens": 2}
    assert [(a["target"], a["outcome"]) for a in entry["attempts"]] == [("p1/fa", "served")]
    assert_clean(json.dumps(entry), key)


def test_failure_after_commit_is_logged(server: Server, mock: Mock) -> None:
    mock.script("fa", [{"fail": "after_output", "error": {"code": "server_error"}}])
    combo_id, key, headers = setup(server, mock)

    r = ask(server, combo_id, headers, stream=True)

    assert r.status_code == 200  # committed: the failure was reported in-stream
    assert "response.failed" in [e for e, _ in sse_events(r.text)]
    entry = logged(server, r.headers["x-ocx-request-id"])
    assert entry["outcome"] == "failed_after_commit"
    assert entry["target"] == "p1/fa"
    assert len(entry["attempts"]) == 1
    attempt = entry["attempts"][0]
    assert attempt["target"] == "p1/fa"
    assert attempt["outcome"] == "failed_after_commit"
    assert attempt["reason"]
    assert mock.hits("fb") == 0  # no hop after commit
    assert_clean(json.dumps(entry), key)


def test_error_responses_are_logged_with_their_status(server: Server, mock: Mock) -> None:
    combo_id, key, headers = setup(server, mock)
    r = server.http.post(
        "/v1/responses", json={"model": "combo/nope-" + combo_id, "input": PROMPT}, headers=headers
    )
    assert r.status_code == 404
    entry = logged(server, r.headers["x-ocx-request-id"])
    assert entry["status"] == 404
    assert entry["target"] is None
    assert entry["attempts"] == []
    assert_clean(json.dumps(entry), key)


BAD_REQUEST = {
    "status": 400,
    "body": {"error": {"type": "invalid_request_error", "code": "bad", "message": "bad input"}},
}


def test_filters(server: Server, mock: Mock) -> None:
    user = "filter-" + uuid.uuid4().hex[:6]
    combo_id, key, headers = setup(server, mock, user=user)
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    ok_ids = []
    for _ in range(3):
        r = ask(server, combo_id, headers)
        assert r.status_code == 200, r.text
        ok_ids.append(r.headers["x-ocx-request-id"])
    mock.script("fa", [BAD_REQUEST])  # a 400 stops the route (no hop)
    bad = ask(server, combo_id, headers)
    assert bad.status_code == 400, bad.text
    bad_id = bad.headers["x-ocx-request-id"]
    for request_id in (*ok_ids, bad_id):
        logged(server, request_id)

    by_user = entries(server, user=user)
    assert {e["requestId"] for e in by_user} == {*ok_ids, bad_id}
    assert {e["requestId"] for e in entries(server, combo=combo_id)} == {*ok_ids, bad_id}
    assert {e["requestId"] for e in entries(server, user=user, status=200)} == set(ok_ids)
    assert [e["requestId"] for e in entries(server, user=user, status=400)] == [bad_id]
    assert [e["requestId"] for e in entries(server, request_id=ok_ids[1])] == [ok_ids[1]]
    # Newest first, `limit` caps the list.
    assert [e["requestId"] for e in entries(server, user=user, limit=2)] == [bad_id, ok_ids[2]]
    assert entries(server, combo="no-such-combo-" + combo_id) == []
    since = before.isoformat().replace("+00:00", "Z")
    assert {e["requestId"] for e in entries(server, user=user, since=since)} == {*ok_ids, bad_id}
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    assert entries(server, user=user, since=future) == []
    assert server.api.get("/api/requests", params={"limit": 0}).status_code == 400
    assert server.api.get("/api/requests", params={"limit": 1001}).status_code == 400
    # Management auth is required.
    assert server.http.get("/api/requests").status_code == 401
    assert (
        server.http.get("/api/requests", headers={"Authorization": f"Bearer {key}"}).status_code
        == 401
    )
    assert_clean(json.dumps(by_user), key)


# ---------------------------------------------------------------------------------------------
# The bounded queue: full ⇒ drop and count, never wait


async def test_batch_writer_drops_and_counts_when_full() -> None:
    from server.background import BatchWriter

    written: list[list[int]] = []
    drops: list[None] = []
    writer: BatchWriter[int] = BatchWriter(
        "test", written.append, maxsize=2, on_drop=lambda: drops.append(None)
    )
    # Synchronously, inside a running loop: the writer task has not run yet, so the queue
    # fills at 2 and the other 3 submissions are dropped without waiting.
    accepted = [writer.submit(i) for i in range(5)]

    assert accepted == [True, True, False, False, False]
    assert writer.dropped == 3
    assert len(drops) == 3
    assert writer.queue.qsize() == 2
    assert writer._task is not None
    writer._task.cancel()
    await writer.drain()
    assert written == [[0, 1]]
    assert writer.written == 2


async def test_batch_writer_writes_a_full_batch_at_once_and_the_rest_at_the_flush_time() -> None:
    from server.background import BatchWriter

    written: list[list[int]] = []
    loop = asyncio.get_running_loop()
    writer: BatchWriter[int] = BatchWriter("test", written.append, maxsize=100, batch=3)
    writer.flush_s = 30.0  # a whole batch must not wait for it
    for i in range(7):
        writer.submit(i)
    started = loop.time()
    while len(written) < 2:
        await asyncio.sleep(0.01)
        assert loop.time() - started < 5, written
    assert written == [[0, 1, 2], [3, 4, 5]]
    assert writer.queue.qsize() == 0  # 6 is held by the writer until the flush time
    writer.flush_s = 0.05
    writer.submit(7)  # wakes nothing: not a whole batch
    await asyncio.sleep(0.1)
    assert written == [[0, 1, 2], [3, 4, 5]]
    writer.submit(8)
    writer.submit(9)  # with 6 held: a whole batch
    while len(written) < 3:
        await asyncio.sleep(0.01)
        assert loop.time() - started < 5, written
    assert written[2] == [6, 7, 8]
    while len(written) < 4:  # 9 alone, after the (now short) flush time
        await asyncio.sleep(0.01)
        assert loop.time() - started < 5, written
    assert written[3] == [9]
    assert writer._task is not None
    writer._task.cancel()


async def test_request_log_writer_counts_drops_in_metrics(settings: Any) -> None:
    from server import metrics
    from usage import requestlog

    settings.OCX_REQUEST_LOG_QUEUE = 2
    writer = requestlog.new_writer()
    before = metrics.REQUEST_LOG_DROPPED._value.get()
    for i in range(5):
        writer.submit(requestlog.RequestEntry(request_id=f"r{i}", at=time.time()))
    assert metrics.REQUEST_LOG_DROPPED._value.get() - before == 3
    assert writer._task is not None
    writer._task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer._task


# ---------------------------------------------------------------------------------------------
# Retention


@pytest.mark.django_db
def test_retention_deletes_old_entries(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from django.utils import timezone

    from usage import requestlog
    from usage.models import RequestLog

    settings.OCX_REQUEST_LOG_RETENTION_DAYS = 3
    now = timezone.now()
    RequestLog.objects.create(request_id="old", at=now - dt.timedelta(days=4))
    RequestLog.objects.create(request_id="edge", at=now - dt.timedelta(days=2, hours=23))
    RequestLog.objects.create(request_id="recent", at=now - dt.timedelta(hours=1))
    monkeypatch.setattr(requestlog, "_last_retention", float("-inf"))  # force the check

    requestlog.write_entries([requestlog.RequestEntry(request_id="new", at=time.time())])

    assert set(RequestLog.objects.values_list("request_id", flat=True)) == {
        "edge",
        "recent",
        "new",
    }
    # The check runs at most every RETENTION_EVERY_S: a second write right after skips it.
    RequestLog.objects.create(request_id="old2", at=now - dt.timedelta(days=10))
    requestlog.write_entries([requestlog.RequestEntry(request_id="new2", at=time.time())])
    assert RequestLog.objects.filter(request_id="old2").exists()
    monkeypatch.setattr(requestlog, "_last_retention", float("-inf"))
    requestlog.write_entries([])
    assert not RequestLog.objects.filter(request_id="old2").exists()


@pytest.mark.django_db
def test_written_rows_keep_every_column(settings: Any) -> None:
    """The writer's prepared INSERT (not the ORM) stores each column as the model reads it:
    the time to the microsecond, unknown token counts as NULL, the route trace as JSON, an
    over-long client-chosen model cut to its column; the usage-only fields are not columns."""
    from usage import requestlog
    from usage.models import RequestLog

    settings.OCX_USAGE = False
    at = int(time.time()) - 60 + 0.123456  # recent: the retention check may run on this write
    attempts = [{"target": "p1/fa", "status": 429, "reason": "rate_limited", "ms": 12}]
    requestlog.write_entries(
        [
            requestlog.RequestEntry(
                request_id="r1",
                at=at,
                key_prefix="ocx_abcd",
                user="alice",
                requested_model="m" * 300,
                combo="main",
                target="p2/fb",
                status=200,
                outcome="ok",
                stream=True,
                duration_ms=42,
                input_tokens=7,
                output_tokens=None,
                cached_tokens=0,
                reasoning_tokens=3,
                key_id=9,
                ttft_ms=5,
                attempts=attempts,
                skipped=[["p0/fz", "disabled"]],
            ),
            requestlog.RequestEntry(request_id="r2", at=at + 1),
        ]
    )
    row = RequestLog.objects.get(request_id="r1")
    assert row.at == dt.datetime.fromtimestamp(int(at), tz=dt.UTC).replace(microsecond=123456)
    assert (row.key_prefix, row.user, row.combo, row.target) == (
        "ocx_abcd",
        "alice",
        "main",
        "p2/fb",
    )
    assert row.requested_model == "m" * 256
    assert (row.status, row.outcome, row.stream, row.duration_ms) == (200, "ok", True, 42)
    assert (row.input_tokens, row.output_tokens, row.cached_tokens) == (7, None, 0)
    assert row.attempts == attempts and row.skipped == [["p0/fz", "disabled"]]
    other = RequestLog.objects.get(request_id="r2")
    assert (other.stream, other.attempts, other.input_tokens) == (False, [], None)


@pytest.mark.django_db
def test_a_lost_postgresql_connection_during_copy_is_djangos_operational_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch writer keeps and retries a batch only on Django's OperationalError: the COPY,
    run on psycopg's own cursor, must not let the driver's error through (the batch and its
    usage counts would be dropped)."""
    from django.db import OperationalError, connection

    from usage import requestlog

    if connection.vendor != "postgresql":
        pytest.skip("COPY is the PostgreSQL path")
    import psycopg

    def lost(self: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(psycopg.Cursor, "copy", lost)
    with pytest.raises(OperationalError):
        requestlog.write_entries([requestlog.RequestEntry(request_id="r1", at=time.time())])


def test_requests_refused_before_routing_are_logged_too(server: Server, mock: Mock) -> None:
    """A bad key (401) and a key over its rpm budget (429) leave an entry, so failed
    authentication and throttled users show in the admin and /api/requests; the presented
    token does not. Model listings are not proxy requests and are not logged."""
    combo_id, key, headers = setup(server, mock)
    listing = server.http.get("/v1/models", headers=headers)
    assert listing.status_code == 200
    bogus = "ocx_" + "x" * 40
    r = ask(server, combo_id, {"Authorization": f"Bearer {bogus}"})
    assert r.status_code == 401
    entry = logged(server, r.headers["x-ocx-request-id"])
    assert (entry["status"], entry["outcome"]) == (401, "invalid_api_key")
    assert (entry["user"], entry["keyPrefix"], entry["model"]) == ("", "", "")
    assert entry["attempts"] == [] and entry["target"] is None
    assert_clean(json.dumps(entry), key, bogus, bogus[:10])
    assert entries(server, request_id=listing.headers["x-ocx-request-id"]) == []

    limited = server.create_key(user="log-rpm", rpm_limit=1)
    if 60 - time.time() % 60 < 3:  # the budget is a fixed one-minute window
        time.sleep(60 - time.time() % 60 + 0.2)
    first = ask(server, combo_id, {"Authorization": f"Bearer {limited}"})
    second = ask(server, combo_id, {"Authorization": f"Bearer {limited}"})
    assert (first.status_code, second.status_code) == (200, 429)
    entry = logged(server, second.headers["x-ocx-request-id"])
    assert (entry["status"], entry["outcome"]) == (429, "client_rate_limited")
    assert entry["user"] == "log-rpm" and limited.startswith(entry["keyPrefix"])
    assert entry["attempts"] == [] and entry["target"] is None
    assert_clean(json.dumps(entry), limited)


async def test_batch_writer_takes_what_is_queued_without_a_loop_turn_per_item() -> None:
    # With a wait per item a loop busy with 2,000 requests a second moved a few hundred items
    # a second into batches: the queue outgrew the writer until it dropped entries.
    from server.background import BatchWriter

    gathered: list[int] = []
    writer: BatchWriter[int] = BatchWriter(
        "test", lambda batch: gathered.append(len(batch)), maxsize=1000, batch=200
    )
    writer.flush_s = 30.0
    for i in range(450):
        writer.submit(i)
    turns = 0
    try:
        while writer.queue.qsize() > 50:  # two whole batches taken, the last 50 wait
            await asyncio.sleep(0)
            turns += 1
            assert turns < 40, (turns, writer.queue.qsize())
    finally:
        assert writer._task is not None
        writer._task.cancel()
        await asyncio.gather(writer._task, return_exceptions=True)
    assert gathered[:1] == [200]


def test_request_ids_are_uuid7_in_time_order() -> None:
    # Time-ordered, so the request log's request_id index grows at its end (a UUID4 put each
    # row on a random page of it).
    import uuid

    from usage.requestlog import new_request_id

    t = 1_764_600_000_000_000_000  # ns
    ids = [new_request_id(t + i * 1_000_000) for i in range(50)]  # one a millisecond
    assert ids == sorted(ids)
    for rid in ids:
        parsed = uuid.UUID(hex=rid)
        assert len(rid) == 32 and parsed.hex == rid
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert int(ids[0][:12], 16) == t // 1_000_000
    same_ms = {new_request_id(t) for _ in range(1000)}
    assert len(same_ms) == 1000  # 74 random bits within a millisecond


async def test_batch_writer_with_a_queue_smaller_than_a_batch_writes_when_it_is_full() -> None:
    # It waited for a whole batch the queue could never hold, and dropped what came meanwhile.
    from server.background import BatchWriter

    written: list[list[int]] = []
    writer: BatchWriter[int] = BatchWriter("test", written.append, maxsize=10, batch=200)
    writer.flush_s = 30.0
    try:
        for i in range(25):
            accepted = writer.submit(i)
            assert accepted, i  # the writer takes the queue whenever it fills
            for _ in range(5):
                await asyncio.sleep(0)
        async with asyncio.timeout(5):
            while writer.queue.qsize() < 10:
                assert writer.submit(-1)
                await asyncio.sleep(0)
    finally:
        assert writer._task is not None
        writer._task.cancel()
        await asyncio.gather(writer._task, return_exceptions=True)
    assert writer.dropped == 0
