"""Units of the PostgreSQL-outage behaviour (issue 16): the 503 JSON mapping and the bounded,
retrying background writers. The end-to-end test is test_pg_outage.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from django.db import InterfaceError, OperationalError

from server import background
from server.background import BatchWriter
from server.db_unavailable import DatabaseUnavailableMiddleware


def test_middleware_maps_unreachable_database_to_503_json(rf: Any) -> None:
    mw = DatabaseUnavailableMiddleware(lambda request: None)  # type: ignore[arg-type,return-value]
    for exc in (OperationalError("could not connect to 10.0.0.5"), InterfaceError("closed")):
        r = mw.process_exception(rf.get("/admin/"), exc)
        assert r is not None and r.status_code == 503
        assert r["Retry-After"] == "5"
        body = json.loads(r.content)
        assert body["error"].startswith("database unavailable")
        assert "10.0.0.5" not in r.content.decode()
    assert mw.process_exception(rf.get("/admin/"), ValueError("bug")) is None


def test_batch_writer_keeps_and_retries_while_the_database_is_down(monkeypatch: Any) -> None:
    monkeypatch.setattr(background, "RETRY_S", (0.01, 0.02))
    written: list[int] = []
    down = {"failures": 3}
    dropped: list[int] = []

    def write(batch: list[int]) -> None:
        if down["failures"]:
            down["failures"] -= 1
            raise OperationalError("server closed the connection")
        written.extend(batch)

    async def run() -> BatchWriter[int]:
        writer: BatchWriter[int] = BatchWriter(
            "t", write, maxsize=5, batch=3, flush_s=0.01, on_drop=lambda: dropped.append(1)
        )
        for i in range(3):
            assert writer.submit(i)
        deadline = asyncio.get_running_loop().time() + 5
        while not writer.pending and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        # Kept (3) + queued must stay within maxsize (5): two more fit, the third is dropped.
        assert [writer.submit(i) for i in (3, 4, 5)] == [True, True, False]
        while len(written) < 5 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        return writer

    writer = asyncio.run(run())
    assert sorted(written) == [0, 1, 2, 3, 4]
    assert writer.dropped == 1 and len(dropped) == 1
    assert writer.written == 5


def test_batch_writer_drops_a_batch_the_database_refuses(monkeypatch: Any) -> None:
    def write(batch: list[int]) -> None:
        raise ValueError("bad row")  # not an outage: retrying would never help

    async def run() -> BatchWriter[int]:
        writer: BatchWriter[int] = BatchWriter("t", write, maxsize=5, flush_s=0.01)
        writer.submit(1)
        await asyncio.sleep(0.1)
        return writer

    writer = asyncio.run(run())
    assert writer.pending == [] and writer.written == 0
