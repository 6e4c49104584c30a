"""A config write changes only what it touched in every worker (issue #24, config at scale).

Two runtimes, each on its own event loop, share the real notice path (Redis) and database: one
is the writing process's (`runtime._runtime`), the other a worker that learns of the write only
from the notice. Their config poll is ten minutes, so nothing else can bring a change in. The
reload counters prove that a key, combo or provider write is applied entry by entry, and that a
missed notice (a gap in the version sequence) falls back to a whole reload.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from accounts import access, key_services
from accounts.access import KeyInfo, digest
from combos import services as combo_services
from gateway import confignotify, runtime
from gateway.config_delta import KeyMap, KeysPatch, patched_keys
from providers import services as provider_services
from providers.services import Delta
from tests.gateway.test_confignotify import REDIS_URL, LoopThread, channel_settings, needs_redis

__all__ = ["channel_settings"]  # a fixture used here

PROVIDER = {
    "adapter": "openai-responses",
    "baseUrl": "http://127.0.0.1:9/v1",
    "models": {"m1": {"contextWindow": 8000}},
}


class Worker:
    def __init__(self) -> None:
        self.loop = LoopThread()
        self.rt = runtime.Runtime()
        self.loop.run(self.rt.ready())
        assert self.rt.listener is not None and self.rt.listener.subscribed.is_set()

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        return dict(self.rt.reloads), dict(self.rt.patches)

    def close(self) -> None:
        if self.rt.listener is not None:
            self.loop.run(self.rt.listener.stop())
        self.loop.close()


@pytest.fixture
def workers(
    channel_settings: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Worker, Worker]]:
    settings.OCX_CONFIG_POLL_MS = 600_000  # only the write path can bring a change in
    provider_services.provider_set(name="p", raw=PROVIDER)
    access.client_key_create(username="someone")
    writer, other = Worker(), Worker()
    monkeypatch.setattr(runtime, "_runtime", writer.rt)
    try:
        yield writer, other
    finally:
        writer.close()
        other.close()


@needs_redis
@pytest.mark.django_db(transaction=True)
def test_key_writes_update_one_entry_in_every_worker_without_a_reload(
    workers: tuple[Worker, Worker],
) -> None:
    writer, other = workers
    before = [w.counts()[0] for w in workers]

    key, secret = access.client_key_create(username="ann", allowed_models=[])
    for w in workers:  # served by every worker when the write returns
        assert w.rt.keys[digest(secret)].user == "ann"

    key_services.client_key_update(key_id=key.pk, rpm_limit=7)
    assert other.rt.keys[digest(secret)].rpm_limit == 7

    key_services.user_budgets_set(username="ann", budgets=[{"period": "day", "tokens": 1000}])
    assert len(other.rt.keys[digest(secret)].budgets) == 1

    user = get_user_model().objects.get(username="ann")
    user.is_active = False
    user.save()
    # Kept, marked: the proxy answers 401 user_inactive (issue 28 item 3).
    assert not other.rt.keys[digest(secret)].user_active
    user.is_active = True
    user.save()
    assert other.rt.keys[digest(secret)].user_active

    assert access.client_key_revoke(key_id=key.pk)
    for w in workers:  # a revoked key stops at once, everywhere
        assert digest(secret) not in w.rt.keys
    assert len(other.rt.keys) == 1  # the fixture's key is untouched

    assert [w.counts()[0] for w in workers] == before  # not one whole reload
    assert other.rt.patches["keys"] >= 7
    assert writer.rt.keys_version == other.rt.keys_version


@needs_redis
@pytest.mark.django_db(transaction=True)
def test_combo_and_provider_writes_update_one_entry_without_a_reload(
    workers: tuple[Worker, Worker],
) -> None:
    writer, other = workers
    before = [w.counts()[0] for w in workers]
    raw = {"targets": [{"provider": "p", "model": "m1"}]}

    combo_services.combo_set(combo_id="fast", raw=raw)
    combo_services.combo_set(combo_id="slow", raw=raw)
    for w in workers:
        assert w.rt.snapshot is not None and set(w.rt.snapshot.combos) == {"fast", "slow"}

    changed = {**PROVIDER, "timeouts": {"connectMs": 1234}}
    provider_services.provider_set(name="p", raw=changed)
    snapshot = other.rt.snapshot
    assert snapshot is not None
    assert snapshot.providers["p"].timeouts.connect_ms == 1234
    assert snapshot.combos["fast"].targets[0].provider == "p"

    combo_services.combo_delete(combo_id="slow")
    for w in workers:
        assert w.rt.snapshot is not None and set(w.rt.snapshot.combos) == {"fast"}
        assert w.rt.snapshot.version == writer.rt.snapshot.version  # type: ignore[union-attr]

    assert [w.counts()[0] for w in workers] == before
    assert other.rt.patches["config"] == 4


@needs_redis
@pytest.mark.django_db(transaction=True)
def test_a_missed_notice_falls_back_to_a_whole_reload(
    workers: tuple[Worker, Worker], channel_settings: str
) -> None:
    _, other = workers
    listener = other.rt.listener
    assert listener is not None
    other.loop.run(listener.stop())  # the other worker misses the next write
    _, missed = access.client_key_create(username="bob")
    assert digest(missed) not in other.rt.keys

    other.rt.listener = confignotify.Listener(
        REDIS_URL or "", channel_settings, other.rt._on_notice
    )
    other.loop.run(other.rt.listener.start())
    reloads = other.rt.reloads["keys"]
    _, secret = access.client_key_create(username="carol")
    # The next notice's `from` is past what it serves: a gap, so the key map reloads whole.
    assert {digest(missed), digest(secret)} <= set(other.rt.keys)
    assert other.rt.reloads["keys"] == reloads + 1

    # A notice without the changes (a bulk write) reloads that domain only.
    config_reloads, keys_reloads = other.rt.reloads["config"], other.rt.reloads["keys"]
    provider_services.disabled_models_set(models=["p/m1"])
    assert other.rt.snapshot is not None
    assert other.rt.snapshot.disabled_models == frozenset({"p/m1"})
    assert other.rt.reloads == {"config": config_reloads + 1, "keys": keys_reloads}


@pytest.mark.django_db(transaction=True)
def test_a_delta_applies_only_on_the_version_just_before_it(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Redis: the writing process applies its own write entry by entry; an already
    served delta is a no-op; a delta past the version served (one was missed) reloads."""
    settings.OCX_REDIS_URL = None
    settings.OCX_CONFIG_POLL_MS = 600_000
    loop = LoopThread()
    rt = runtime.Runtime()
    monkeypatch.setattr(runtime, "_runtime", rt)
    try:
        loop.run(rt.ready())
        reloads = dict(rt.reloads)
        _, secret = access.client_key_create(username="dan")
        assert digest(secret) in rt.keys and rt.reloads == reloads

        version = rt.keys_version
        stale = Delta("keys", version - 1, version, (("key", "999999"),))
        loop.run(rt.bring_in(stale))  # already served: nothing read
        assert rt.reloads == reloads and rt.keys_version == version

        monkeypatch.setattr(runtime, "_runtime", None)  # this write is missed
        _, missed = access.client_key_create(username="eve")
        monkeypatch.setattr(runtime, "_runtime", rt)
        assert digest(missed) not in rt.keys
        _, third = access.client_key_create(username="fay")
        # Its `from` is past what the runtime serves (a gap): the map reloads whole.
        assert rt.reloads["keys"] == reloads["keys"] + 1
        assert {digest(secret), digest(missed), digest(third)} <= set(rt.keys)
    finally:
        loop.close()


def test_notices_carry_the_delta_and_malformed_deltas_mean_reload() -> None:
    delta = Delta("config", 4, 5, (("combo", "fast"), ("provider", "p")))
    notice = confignotify.Notice(5, 9, "tok", delta)
    assert confignotify.decode(confignotify.encode(notice)) == notice
    whole = confignotify.Notice(5, 9, None, Delta("keys", 8, 9, None))
    assert confignotify.decode(confignotify.encode(whole)) == whole
    for bad in (
        '{"domain": "keys", "from": 1, "to": 2, "changes": [{"kind": "combo", "id": "x"}]}',
        '{"domain": "other", "from": 1, "to": 2, "changes": null}',
        '{"domain": "keys", "from": "1", "to": 2, "changes": null}',
        '{"domain": "keys", "from": 1, "to": 2, "changes": [{"kind": "key", "id": 3}]}',
    ):
        got = confignotify.decode(f'{{"configVersion": 1, "keysVersion": 2, "delta": {bad}}}')
        assert got == confignotify.Notice(1, 2, None, None)


def test_a_key_patch_replaces_the_entries_of_its_keys_and_users_by_index() -> None:
    import random

    def info(key_id: int, user_id: int) -> KeyInfo:
        return KeyInfo(
            id=key_id,
            prefix="ocx_x",
            user=f"u{user_id}",
            allowed_models=frozenset(),
            rpm_limit=None,
            user_id=user_id,
        )

    rng = random.Random(7)
    plain = {f"d{i}": info(i, i % 13) for i in range(300)}
    current: dict[str, KeyInfo] = KeyMap(plain)
    for _ in range(200):
        key_ids = frozenset(rng.sample(range(320), rng.randint(0, 3)))
        user_ids = frozenset(rng.sample(range(15), rng.randint(0, 1)))
        fresh = {f"d{i}": info(i, rng.randrange(15)) for i in key_ids if rng.random() < 0.6}
        # A rotated key: its previous secret is a second entry with the same id.
        fresh.update(
            {
                f"p{i}": info(i, fresh[f"d{i}"].user_id)
                for i in key_ids
                if f"d{i}" in fresh and rng.random() < 0.5
            }
        )
        patch = KeysPatch(key_ids, user_ids, fresh)
        # What a patch means: without every entry of those keys and users, plus the fresh ones.
        expected = {
            d: v for d, v in current.items() if v.id not in key_ids and v.user_id not in user_ids
        }
        expected.update(fresh)
        before = dict(current)
        patched = patched_keys(current, patch)
        assert patched == expected
        assert dict(current) == before  # the map served until now is left as it was
        assert patched is not current
        # Its indexes agree with its entries (a fresh index of the same entries).
        rebuilt = KeyMap(patched)
        assert patched.by_id == rebuilt.by_id and patched.by_user == rebuilt.by_user
        current = patched
    # A plain mapping (not indexed) is patched the same way.
    assert patched_keys(plain, KeysPatch(frozenset({1}), frozenset(), {})) == {
        d: v for d, v in plain.items() if v.id != 1
    }


def test_a_revoked_rotated_key_loses_both_secrets() -> None:
    """A rotated key holds two entries (new secret, previous one in its grace): a write of that
    key (revoke, rotate again) drops both, whichever the index met first."""
    current = KeyInfo(id=5, prefix="ocx_n", user="u", allowed_models=frozenset(), rpm_limit=None)
    previous = KeyInfo(
        id=5, prefix="ocx_n", user="u", allowed_models=frozenset(), rpm_limit=None, previous=True
    )
    other = KeyInfo(id=6, prefix="ocx_o", user="u", allowed_models=frozenset(), rpm_limit=None)
    for order in (("new", "old"), ("old", "new")):
        entries = {"old": previous, "new": current, "six": other}
        keys = KeyMap({d: entries[d] for d in (*order, "six")})
        assert keys.by_id[5] == {"new", "old"}
        revoked = patched_keys(keys, KeysPatch(frozenset({5}), frozenset(), {}))
        assert dict(revoked) == {"six": other}
        assert 5 not in revoked.by_id
