"""Bounded background writers: the hot path enqueues, a task writes batches in a thread.

`submit()` never waits; a full queue drops the item and counts it (PRODUCT §9.3), so a slow
database can never delay a response. While the database is unreachable (a restart, a network
cut) a failed batch is kept and retried with a growing pause; the items kept and queued
together stay within `maxsize`, anything beyond is dropped and counted, and everything kept is
written once the database answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from asgiref.sync import sync_to_async
from django.db import Error as DbError
from django.db import InterfaceError, OperationalError, connection

from server import metrics

log = logging.getLogger("ocx.background")

T = TypeVar("T")
R = TypeVar("R")

# The database is unreachable (not a bad row): keep the batch and retry.
UNREACHABLE = (OperationalError, InterfaceError)
RETRY_S = (0.5, 10.0)  # first and longest pause between retries of a kept batch


async def in_thread(fn: Callable[..., R], *args: object) -> R:
    """Run a blocking ORM call in a worker thread, off the event loop.

    No request cycle closes a background thread's connection, so it lives on between calls; one
    that failed is closed here, so the next call reconnects instead of failing for good (a
    restarted database server)."""

    def call() -> R:
        try:
            return fn(*args)
        except DbError:
            with contextlib.suppress(DbError):  # the original error is the one to report
                connection.close()
            raise

    return await sync_to_async(call, thread_sensitive=False)()


class BatchWriter(Generic[T]):
    def __init__(
        self,
        name: str,
        write: Callable[[list[T]], None],
        *,
        maxsize: int,
        batch: int = 200,
        flush_s: float = 0.5,
        on_drop: Callable[[], None] | None = None,
        ident: Callable[[T], str] | None = None,
    ) -> None:
        self.name = name
        self._write = write
        # Names an item in the log when it alone is refused (the request id of a log entry).
        self._ident = ident or (lambda _item: "?")
        self.rejected = 0
        self.queue: asyncio.Queue[T] = asyncio.Queue(maxsize)
        self.batch = batch
        self.flush_s = flush_s
        self.on_drop = on_drop
        self.maxsize = maxsize
        self.dropped = 0
        self.written = 0
        self.pending: list[T] = []  # a batch the database refused while unreachable
        self._pause = 0.0
        self._task: asyncio.Task[None] | None = None
        # Set by `submit` once the queue holds what the batch being gathered still wants, or
        # is full (a queue smaller than a batch could otherwise never wake the writer).
        self._more = asyncio.Event()
        self._wanted = min(batch, maxsize)

    def submit(self, item: T) -> bool:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        if len(self.pending) + self.queue.qsize() >= self.maxsize:
            self._drop(1)
            return False
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self._drop(1)
            return False
        if self.queue.qsize() >= self._wanted:
            self._more.set()
        return True

    def _drop(self, n: int) -> None:
        self.dropped += n
        if self.on_drop is not None:
            for _ in range(n):
                self.on_drop()

    async def _run(self) -> None:
        while True:
            if self.pending:
                await asyncio.sleep(self._pause)
                batch, self.pending = self.pending, []
                await self.flush(batch)
                continue
            batch = [await self.queue.get()]
            # Gathered for up to `flush_s` or until the batch is full, taking what is queued
            # without a wait per item: with one (`wait_for(queue.get())` each) a loop busy
            # with 2,000 requests a second moved a few hundred items a second into batches,
            # and the queue grew by 2,000 entries a second until it dropped them
            # (bench/README.md, seventh run).
            deadline = time.monotonic() + self.flush_s
            while True:
                self._take(batch)
                remaining = deadline - time.monotonic()
                if len(batch) >= self.batch or remaining <= 0:
                    break
                self._wanted = min(self.batch - len(batch), self.maxsize)
                self._more.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._more.wait()
            self._wanted = min(self.batch, self.maxsize)
            await self.flush(batch)

    def _take(self, batch: list[T]) -> None:
        while len(batch) < self.batch:
            try:
                batch.append(self.queue.get_nowait())
            except asyncio.QueueEmpty:
                return

    async def flush(self, batch: list[T]) -> None:
        try:
            await in_thread(self._write, batch)
            self.written += len(batch)
        except UNREACHABLE as exc:
            room = max(0, self.maxsize - self.queue.qsize())
            self.pending = batch[:room]
            self._drop(len(batch) - len(self.pending))
            if not self._pause:
                log.warning(
                    "%s: database unreachable (%s); keeping %d item(s) to retry",
                    self.name,
                    type(exc).__name__,
                    len(self.pending),
                )
            self._pause = min(max(self._pause * 2, RETRY_S[0]), RETRY_S[1])
            return
        except Exception:  # noqa: BLE001 - a failed write must never take the proxy down
            log.exception(
                "%s: could not write %d item(s); writing them one by one", self.name, len(batch)
            )
            await self._one_by_one(batch)
        if self._pause:
            log.warning("%s: database reachable again, writing what was kept", self.name)
            self._pause = 0.0

    async def _one_by_one(self, batch: list[T]) -> None:
        """A refused batch, item by item: one bad row loses only itself (issue #26)."""
        for i, item in enumerate(batch):
            try:
                await in_thread(self._write, [item])
                self.written += 1
            except UNREACHABLE:
                # Gone meanwhile: the rest waits for the database like any kept batch.
                room = max(0, self.maxsize - self.queue.qsize())
                rest = batch[i:]
                self.pending = rest[:room]
                self._drop(len(rest) - len(self.pending))
                self._pause = max(self._pause, RETRY_S[0])
                return
            except Exception as exc:  # noqa: BLE001 - this item alone is dropped
                self.rejected += 1
                metrics.RECORDS_REJECTED.labels(self.name).inc()
                log.error(
                    "%s: dropped item %s the database refused (%s: %s)",
                    self.name,
                    self._ident(item),
                    type(exc).__name__,
                    str(exc)[:200],
                )

    async def drain(self) -> None:
        """Write everything queued now (tests and shutdown)."""
        items, self.pending = self.pending, []
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        if items:
            await self.flush(items)
