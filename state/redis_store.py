"""Shared state on Redis: the compare-and-set primitive (`RedisCas`) behind both the routing
state store (`state.redis_state`) and the quota `JsonStore` (`RedisJsonStore`)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, TypeVar

from quota.tracker import Update
from state.resp import RespClient

T = TypeVar("T")
TTL_MS = 8 * 24 * 3600 * 1000  # longer than a weekly window
MAX_ATTEMPTS = 100
MAX_LOCKS = 10_000

# Writes ARGV[2] (or deletes, when empty) only if the key holds ARGV[1] ('' = absent); on a
# mismatch returns the value it holds instead, so the caller retries without another GET.
_CAS = """
local current = redis.call('GET', KEYS[1])
if current == false then current = '' end
if current ~= ARGV[1] then return {0, current} end
if ARGV[2] == ARGV[1] then return {1} end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return {1}
"""
_UNSEEN = object()
# A value read from Redis in this request (this task's context) for an update later in it.
_PRIMED: ContextVar[tuple[str, bytes | None, object] | None] = ContextVar(
    "ocx_primed", default=None
)


class RedisCas:
    """Optimistic read-modify-write of string values: apply a pure function to the value, then a
    Lua compare-and-set writes only if the key still holds that value; retry otherwise.

    The first try applies the function to the value this process last read or wrote for the
    key — a guess, never trusted: the compare-and-set checks it, and on a mismatch hands back
    the real value to retry with. So an update is one round trip when no other worker wrote
    in between, and a decision is always made on the value the write was checked against.
    Within one process, updates of the same key that write wait for each other, so their
    retries only happen between workers; a step that writes nothing is only a check and does
    not wait."""

    def __init__(self, url: str, *, socket_timeout: float = 5.0) -> None:
        self.redis = RespClient(url, timeout_s=socket_timeout)
        self._cas = self.redis.script(_CAS)
        self._locks: dict[str, asyncio.Lock] = {}
        self._seen: dict[str, bytes | None] = {}

    def note(self, key: str, raw: bytes | None) -> None:
        """Remember a value just read from Redis (the next update's first guess)."""
        if len(self._seen) > MAX_LOCKS:
            self._seen.clear()  # only guesses: losing them costs one GET each
        self._seen[key] = raw

    def prime(self, key: str, raw: bytes | None) -> None:
        """A value this request just read from Redis (in the same round trip as another read),
        for its next update of the key: a step on it that writes nothing needs no check of its
        own. Only when it is what this worker already holds for the key and no write of the
        key is under way here: a reply to this worker's own write can arrive between Redis
        running the read and this call, so a different value may be the older one. Only for
        the calling task (a context variable and the task), and only until this worker writes
        the key (`update` compares identity with what it holds then)."""
        lock = self._locks.get(key)
        if lock is not None and lock.locked():
            return
        seen = self._seen.get(key, _UNSEEN)
        if seen is _UNSEEN:
            self.note(key, raw)  # a first guess, checked as any other
            return
        if seen == raw:
            _PRIMED.set((key, seen, asyncio.current_task()))
        else:
            self.note(key, raw)  # most likely another worker's write: the next guess, checked

    async def update(
        self, key: str, fn: Callable[[bytes | None], tuple[str | None, T]], *, ttl_ms: int
    ) -> T:
        """`fn(current raw value or None) -> (new value, None to delete, result)`; returning
        the unchanged value (or None for an absent key) writes nothing."""
        if len(self._locks) > MAX_LOCKS:
            # One lock per key ever seen would grow with every ChatGPT account: keep busy ones.
            self._locks = {k: v for k, v in self._locks.items() if v.locked()}
            self._seen = {k: v for k, v in self._seen.items() if k in self._locks}
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        guess = self._seen.get(key, _UNSEEN)
        decided: tuple[bytes | None, str | None, T] | None = None
        primed = _PRIMED.get()
        fresh: object = _UNSEEN
        if primed is not None and primed[0] == key and primed[2] is asyncio.current_task():
            _PRIMED.set(None)  # one update decides on it, the request's next ones check
            fresh = primed[1]
        if fresh is not _UNSEEN and fresh is guess and not lock.locked():
            # Read in this request, and no write of this worker since: decided on it.
            assert guess is None or isinstance(guess, bytes)
            new, result = fn(guess)
            if (new or "").encode() == (b"" if guess is None else guess):
                return result
            decided = (guess, new, result)  # a write: checked under the lock as any other
        elif guess is not _UNSEEN and not lock.locked():
            # A step that writes nothing (a healthy pick: no rotation, no probe, no cooldown)
            # only checks that the key still holds the value it was decided on. Checks cannot
            # conflict with each other, so they need not queue behind this worker's other
            # updates of the key (at c=16 that queue capped a worker's throughput at one
            # round trip per request). A check that finds another value goes the locked way.
            assert guess is None or isinstance(guess, bytes)
            new, result = fn(guess)
            expected = b"" if guess is None else guess
            if (new or "").encode() != expected:
                decided = (guess, new, result)  # a write: reused below if the guess holds
            else:
                reply = await self._cas(keys=[key], args=[expected, expected, ttl_ms])
                if reply[0] == 1:
                    return result
                # Replies come in the order Redis ran the scripts: this is the latest value.
                self._seen[key] = reply[1] or None
        async with lock:
            raw = self._seen.get(key, _UNSEEN)
            if raw is _UNSEEN:
                raw = await self.redis.get(key)
            for attempt in range(MAX_ATTEMPTS):
                if attempt > 1:
                    # A worker whose guesses are right wins every race against one that must
                    # learn the value first; a random pause breaks that lockstep.
                    await asyncio.sleep(random.uniform(0, 0.001) * min(attempt, 10))
                assert raw is None or isinstance(raw, bytes)
                if decided is not None and decided[0] is raw:
                    _, new, result = decided
                else:
                    new, result = fn(raw)
                decided = None
                expected = b"" if raw is None else raw
                reply = await self._cas(keys=[key], args=[expected, new or "", ttl_ms])
                if reply[0] == 1:
                    self._seen[key] = None if new is None else new.encode()
                    return result
                raw = reply[1] or None  # the value Redis holds (bytes: resp never decodes)
                self._seen[key] = raw
        raise ConflictError(f"{key} is too contended")


def unprime() -> None:
    """Forget this request's primed value (its pick was made elsewhere: Redis was out)."""
    _PRIMED.set(None)


class ConflictError(RuntimeError):
    """The compare-and-set kept losing to other writers (should never happen in practice)."""


class RedisJsonStore:
    def __init__(self, url: str, prefix: str = "ocx") -> None:
        self.prefix = prefix
        self._cas = RedisCas(url)
        self._redis = self._cas.redis

    def _k(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    @staticmethod
    def _decode(raw: bytes | str | None) -> dict[str, Any] | None:
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    async def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]:
        return (await self.get_many_along(keys, ()))[0]

    async def get_many_along(
        self, keys: list[str], along: Sequence[str]
    ) -> tuple[list[dict[str, Any] | None], list[bytes | None]]:
        """`get_many`, and the raw values of the Redis names `along` in the same `MGET` (what
        another store of the request reads, one round trip for both)."""
        if not keys and not along:
            return [], []
        names = [self._k(k) for k in keys]
        raws = await self._redis.mget(names + list(along))
        for name, raw in zip(names, raws, strict=False):
            self._cas.note(name, raw)
        return [self._decode(r) for r in raws[: len(names)]], raws[len(names) :]

    async def update(self, key: str, fn: Update[T]) -> T:
        def step(raw: bytes | None) -> tuple[str | None, T]:
            current = self._decode(raw)
            new, result = fn(current)
            if new == current:
                return (None if raw is None else raw.decode()), result
            return (None if new is None else json.dumps(new, separators=(",", ":"))), result

        return await self._cas.update(self._k(key), step, ttl_ms=TTL_MS)

    async def keys(self) -> list[str]:
        prefix = self._k("quota:")
        out = []
        async for raw in self._redis.scan_iter(match=prefix + "*", count=500):
            name = raw.decode() if isinstance(raw, bytes) else raw
            out.append(name[len(self.prefix) + 1 :])
        return out
