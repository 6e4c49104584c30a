"""`GET /api/status` and `ocx status`: what each combo would do now, and why (PRODUCT §8.6)."""

from __future__ import annotations

import datetime as dt
import random
import time
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from combos import selectors
from combos.engine.state import ComboState
from combos.engine.strategies import plan
from combos.engine.types import ComboSpec, ConfigSnapshot, TargetSpec
from ocxsite import live
from quota import windows as qw
from quota.models import QuotaTransition
from quota.tracker import Record


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat().replace("+00:00", "Z")


def _window(w: qw.Window) -> dict[str, Any]:
    return {
        "window": w.name,
        "scope": w.scope,
        "usedPercent": w.used_percent,
        "resetsAt": _iso(w.resets_at_ms),
        "source": w.source,
    }


def badge(
    target: TargetSpec,
    state: ComboState,
    records: dict[tuple[str, str], Record],
    now: int,
) -> dict[str, Any]:
    """Available / Cooling until … / Out of quota / Quota unknown, for one target."""
    cooling = state.cooling_until(target.key, now)
    if cooling is not None:
        return {"badge": "cooling", "until": _iso(cooling)}
    mine = [r for (provider, _), r in records.items() if provider == target.provider]
    if not mine:
        return {"badge": "quota_unknown"}
    limited = [r for r in mine if qw.eligibility(r.state, now=now) == "ineligible"]
    if limited and len(limited) == len(mine):
        return {
            "badge": "out_of_quota",
            "until": _iso(max((qw.recovery_at(r.state) or 0) for r in limited) or None),
        }
    return {"badge": "available"}


def combo_status(
    combo: ComboSpec,
    snapshot: ConfigSnapshot,
    records: dict[tuple[str, str], Record],
    now: int,
) -> dict[str, Any]:
    state = live.combo_state(combo.id)
    providers = {t.provider for t in combo.targets}
    relevant = {pair: r for pair, r in records.items() if pair[0] in providers}
    # Only `chatgpt` targets have per-caller credentials; every other provider has its own one.
    per_caller = {
        name
        for name in providers
        if (spec := snapshot.providers.get(name)) is not None and spec.adapter == "chatgpt"
    }
    own = {name: _own_records(name, snapshot, relevant) for name in providers - per_caller}
    credentials = sorted({c for (p, c) in relevant if p in per_caller}) or ["default"]
    would: dict[str, str | None] = {}
    for credential in credentials:

        def predicate(target: TargetSpec, credential: str = credential) -> str | None:
            if target.key == combo.override:
                return None  # a manual pin is independent of the quota state (§8.5)
            mine: list[Record | None] = (
                [relevant.get((target.provider, credential))]
                if target.provider in per_caller
                else list(own.get(target.provider, []))
            )
            limited = [r for r in mine if r is not None]
            if any(qw.eligibility(r.state, now=now) == "ineligible" for r in limited):
                return "quota_exhausted"
            return None

        # A dry run of the pure planner on the current state: nothing is written.
        _, decision = plan(
            combo, snapshot.providers, state, now=now, rng=random.Random(0), predicate=predicate
        )
        would[credential] = None if decision.target is None else decision.target.key
    exhausted = [
        {"provider": p, "credential": c, **_window(w)}
        for (p, c), r in relevant.items()
        for w in r.state.exhausted
    ]
    transitions = [r.state.last_transition for r in relevant.values() if r.state.last_transition]
    last = max(transitions, key=lambda t: t.at_ms) if transitions else None
    changes = [t for t in (qw.next_change_at(r.state) for r in relevant.values()) if t]
    cooldowns = [u for u in state.cooldowns.values() if u > now]
    return {
        "id": combo.id,
        "model": combo.public_id,
        "mode": f"pin {combo.override}" if combo.override else "auto",
        "strategy": combo.strategy,
        "wouldServe": would,
        "targets": [{"target": t.key, **badge(t, state, relevant, now)} for t in combo.targets],
        "lastTransition": None
        if last is None
        else {
            "from": last.from_status,
            "to": last.to_status,
            "reason": last.reason,
            "at": _iso(last.at_ms),
        },
        "exhaustedWindows": exhausted,
        "nextChangeAt": _iso(min(changes + cooldowns) if changes or cooldowns else None),
    }


def _own_records(
    name: str, snapshot: ConfigSnapshot, relevant: dict[tuple[str, str], Record]
) -> list[Record]:
    """The records of a provider-scoped credential: its current key's when it resolves here."""
    spec = snapshot.providers.get(name)
    secret = None if spec is None else selectors.credential_for(spec)
    if secret:
        record = relevant.get((name, qw.credential_fingerprint(secret)))
        return [] if record is None else [record]
    return [r for (p, _), r in relevant.items() if p == name]


def status_report(combo_id: str | None = None) -> dict[str, Any]:
    now = int(time.time() * 1000)
    snapshot = selectors.config_snapshot()
    records = live.quota_records()
    combos = [c for c in snapshot.combos.values() if combo_id in (None, c.id)]
    recent = [
        {
            "provider": t.provider,
            "credential": t.credential,
            "from": t.from_state,
            "to": t.to_state,
            "reason": t.reason,
            "message": t.message,
            "at": t.at.isoformat().replace("+00:00", "Z"),
        }
        for t in QuotaTransition.objects.all()[:20]
    ]
    return {
        "liveState": "redis" if live.shared() else "this process",
        "combos": [combo_status(c, snapshot, records, now) for c in combos],
        "recentTransitions": recent,
    }


def quota_report() -> dict[str, Any]:
    now = int(time.time() * 1000)
    out = []
    for (provider, credential), record in sorted(live.quota_records().items()):
        out.append(
            {
                "provider": provider,
                "credential": credential,
                "status": record.state.status,
                "eligibility": qw.eligibility(record.state, now=now),
                "nextChangeAt": _iso(qw.next_change_at(record.state)),
                "exhausted": [_window(w) for w in record.state.exhausted],
                "windows": [_window(w) for w in record.windows],
            }
        )
    from quota.models import QuotaSnapshot

    stored = [
        {
            "provider": s.provider,
            "credential": s.credential,
            "window": s.window,
            "scope": s.scope,
            "usedPercent": s.used_percent,
            "resetsAt": s.resets_at.isoformat().replace("+00:00", "Z") if s.resets_at else None,
            "observedAt": s.observed_at.isoformat().replace("+00:00", "Z"),
        }
        for s in QuotaSnapshot.objects.all()
    ]
    return {"credentials": out, "snapshots": stored}


LABELS = {
    "available": "Available",
    "cooling": "Cooling until {until}",
    "out_of_quota": "Out of quota until {until}",
    "quota_unknown": "Quota unknown",
}


def live_badges(combo_id: str) -> SafeString:
    """HTML badges for the admin: one per target, refreshed live by `ocx-live.js`."""
    snapshot = selectors.config_snapshot()
    combo = snapshot.combos.get(combo_id)
    if combo is None:
        return format_html("—")
    now = int(time.time() * 1000)
    records = live.quota_records()
    state = live.combo_state(combo_id)
    parts = []
    for t in combo.targets:
        b = badge(t, state, records, now)
        text = LABELS[b["badge"]].format(until=b.get("until") or "?")
        parts.append(
            format_html(
                '<span class="ocx-badge ocx-{}" data-target="{}">{}: {}</span>',
                b["badge"],
                t.key,
                t.key,
                text,
            )
        )
    return format_html(
        '<span class="ocx-live" data-combo="{}">{}</span>',
        combo_id,
        format_html_join(" ", "{}", ((p,) for p in parts)),
    )
