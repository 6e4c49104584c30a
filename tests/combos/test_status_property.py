"""`wouldServe` is the router's own next pick (PRODUCT §8.7): a property over random states.

For random providers (disabled, credential stored / in a set or unset environment variable,
per-caller `chatgpt`), combos (strategy, weights, last resorts, pin, wait budget and policy),
routing states (cooldowns, half-open probe leases, round-robin rotation, least-used counts) and
quota records (available, limited, recovery due, probe in flight), the status view's
`wouldServe` must equal the first target the attempt loop dispatches: `attempts.route` on a
`MemoryStateStore` holding the same state, with the quota gate, credential pairs and access the
proxy builds for the request, and the same rng seed. When the router would first wait for a
cooldown, status names no target and the same wait.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from combos import live
from combos.status import credential_view
from gateway.access import credential_pair as _credential_pair
from gateway.access import fingerprint
from gateway.access import target_access as _access
from providers.upstream import Caller
from quota import windows as qw
from quota.tracker import MemoryJsonStore, QuotaTracker, Record
from routing.attempts import Outcome, route
from routing.state import ComboState, MemoryStateStore
from routing.strategies import POLICY_BEFORE_LAST_RESORT
from routing.types import STRATEGIES, ComboSpec, ConfigSnapshot, ProviderSpec, TargetSpec

NOW = 1_800_000_000_000
SET_ENV = "OCX_PROP_STATUS_KEY_SET"
UNSET_ENV = "OCX_PROP_STATUS_KEY_UNSET"
CALLER = Caller(headers={"authorization": "Bearer caller-token"}, request_id="prop")
CREDENTIALS = ("stored", "env_set", "env_unset", "none")
QUOTAS = ("none", "available", "limited", "due", "probing", "probe_lapsed")


@pytest.fixture(autouse=True, scope="module")
def _env() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in (SET_ENV, UNSET_ENV)}
    os.environ[SET_ENV] = "sk-prop-env"
    os.environ.pop(UNSET_ENV, None)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


class _Slept(Exception):
    def __init__(self, ms: int) -> None:
        self.ms = ms


class _Dispatched(Exception):
    def __init__(self, target: TargetSpec) -> None:
        self.target = target


@st.composite
def providers(draw: st.DrawFn) -> dict[str, ProviderSpec]:
    out = {}
    for i in range(draw(st.integers(1, 4))):
        name = f"p{i}"
        adapter = draw(st.sampled_from(("openai-responses", "openai-chat", "chatgpt")))
        how = draw(st.sampled_from(CREDENTIALS))
        out[name] = ProviderSpec(
            name=name,
            adapter=adapter,
            base_url="http://127.0.0.1:9/v1",
            api_key="sk-stored" if how == "stored" else None,
            api_key_env={"env_set": SET_ENV, "env_unset": UNSET_ENV}.get(how),
            disabled=draw(st.booleans()) and draw(st.booleans()),
        )
    return out


def _quota_record(provider: str, credential: str, kind: str, reset_in: int) -> Record | None:
    base = qw.CredentialQuota(provider=provider, credential=credential)
    window = qw.Window(
        name="five_hour",
        used_percent=100.0,
        window_minutes=300,
        resets_at_ms=NOW + 60_000,
        observed_at_ms=NOW - 1_000,
        source=qw.SOURCE_CODEX_HEADERS,
    )
    if kind == "none":
        return None
    if kind == "available":
        # Windows with room left: their resets rank targets under `reset-window`.
        return Record(base, (replace(window, used_percent=40.0, resets_at_ms=NOW + reset_in),))
    if kind == "limited":
        return Record(
            qw.CredentialQuota(provider, credential, "limited", (window,), NOW + 60_000), (window,)
        )
    past = qw.CredentialQuota(provider, credential, "limited", (), NOW - 1_000)
    if kind == "due":
        return Record(past)
    lease = NOW + 30_000 if kind == "probing" else NOW - 1
    return Record(qw.CredentialQuota(provider, credential, "probing", (), None, lease))


@st.composite
def cases(draw: st.DrawFn) -> tuple[ConfigSnapshot, ComboSpec, ComboState, dict[str, Any], int]:
    specs = draw(providers())
    keys = [f"{p}/m{j}" for p in specs for j in range(2)]
    chosen = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=4, unique=True))
    targets = tuple(
        TargetSpec(
            provider=k.split("/")[0],
            model=k.split("/")[1],
            weight=draw(st.integers(1, 3)),
            last_resort=draw(st.booleans()) and draw(st.booleans()),
        )
        for k in chosen
    )
    combo = ComboSpec(
        id="prop",
        targets=targets,
        strategy=draw(st.sampled_from(STRATEGIES)),
        sticky_limit=draw(st.integers(1, 3)),
        wait_for_cooldown_ms=draw(st.sampled_from((0, 0, 5_000))),
        cooldown_wait_policy=draw(st.sampled_from((None, POLICY_BEFORE_LAST_RESORT))),
        override=draw(st.sampled_from((None, None, None, *chosen))),
    )
    cooldowns: dict[str, int] = {}
    probes: dict[str, int] = {}
    for k in chosen:
        cool = draw(st.sampled_from(("none", "none", "cooling", "half_open", "half_open_leased")))
        if cool == "cooling":
            cooldowns[k] = NOW + draw(st.integers(1, 20_000))
        elif cool.startswith("half_open"):
            cooldowns[k] = NOW - draw(st.integers(0, 20_000))
            if cool == "half_open_leased":
                probes[k] = NOW + draw(st.sampled_from((-1, 30_000)))
    rotation = draw(st.booleans())
    state = ComboState(
        cooldowns=MappingProxyType(cooldowns),
        probes=MappingProxyType(probes),
        current_weights=MappingProxyType(
            {k: draw(st.integers(-3, 3)) for k in chosen} if rotation else {}
        ),
        active_key=draw(st.sampled_from((None, *chosen))) if rotation else None,
        success_counts=MappingProxyType({k: draw(st.integers(0, 3)) for k in chosen}),
    )
    records: dict[str, Any] = {}
    for name, spec in specs.items():
        if spec.adapter == "chatgpt":
            secret: str | None = CALLER.headers["authorization"]
        else:
            secret = spec.api_key or (os.environ.get(spec.api_key_env or "") or None)
        if secret:
            fp = fingerprint(secret)
            kind = draw(st.sampled_from(QUOTAS))
            record = _quota_record(name, fp, kind, draw(st.integers(1, 100_000)))
            if record is not None:
                records[f"quota:{name}:{fp}"] = record.to_json()
    snapshot = ConfigSnapshot(
        version=3,
        providers=MappingProxyType(specs),
        combos=MappingProxyType({combo.id: combo}),
    )
    return snapshot, combo, state, records, draw(st.integers(0, 2**32))


async def _router_first_pick(
    snapshot: ConfigSnapshot,
    combo: ComboSpec,
    state: ComboState,
    records: dict[str, Any],
    seed: int,
) -> tuple[str | None, int]:
    """The attempt loop's first dispatch, built exactly as `ProxyApp._route` builds it."""
    store = MemoryStateStore()
    await store.update(combo.id, lambda _: (state, None))
    quota = MemoryJsonStore()
    quota.data.update(records)
    tracker = QuotaTracker(quota)
    pairs = {t.key: _credential_pair(snapshot, t, CALLER) for t in combo.targets}
    gate = await tracker.gate((p for p in pairs.values() if p is not None), now=NOW, shared=True)

    async def dispatch(target: TargetSpec, _last: bool) -> Outcome:
        raise _Dispatched(target)

    async def sleep(ms: int) -> None:
        raise _Slept(ms)

    try:
        result = await route(
            combo,
            snapshot.providers,
            store,
            dispatch=dispatch,
            now=lambda: NOW,
            sleep=sleep,
            rng=random.Random(seed),
            quota_resets={k: gate.resets.get(p) for k, p in pairs.items() if p is not None},
            revision=snapshot.version,
            access=lambda t: _access(snapshot, t, CALLER, gate, pairs.get(t.key)),
        )
    except _Dispatched as picked:
        return picked.target.key, 0
    except _Slept as waited:
        return None, waited.ms
    assert result.unavailable
    return None, 0


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_would_serve_is_the_routers_first_pick(
    case: tuple[ConfigSnapshot, ComboSpec, ComboState, dict[str, Any], int],
) -> None:
    snapshot, combo, state, raw_records, seed = case
    records = {
        (k.split(":")[1], k.split(":")[2]): Record.from_json(v) for k, v in raw_records.items()
    }
    per_caller = any(snapshot.providers[t.provider].adapter == "chatgpt" for t in combo.targets)
    credential = fingerprint(CALLER.headers["authorization"]) if per_caller else "default"
    view = credential_view(
        combo,
        snapshot,
        live.LiveSnapshot("this process", {combo.id: state}, records),
        now=NOW,
        credential=credential,
        rng=random.Random(seed),
    )
    expected, waited = asyncio.run(_router_first_pick(snapshot, combo, state, raw_records, seed))
    assert view.would_serve == expected
    assert view.wait_ms == waited
    # The shown states agree with the pick: the served target is pinned or pickable.
    if expected is not None:
        shown = {ts.target: ts for ts in view.targets}[expected]
        assert shown.eligible
        assert shown.state in ("pinned", "available")
    for ts in view.targets:
        if ts.state in ("disabled", "no_credential", "out_of_quota", "cooling"):
            assert ts.target != expected
