"""What each combo would do now, and why: `/api/status`, `ocx status`, admin badges (§8.6/§8.7).

Every target state comes from `routing.eligibility.target_state` with the inputs the
proxy gives it (the provider's credential, the caller credential's quota record, the combo's
routing state and pin), and `wouldServe` is a dry run of the selector's own `plan` on that
state: nothing is written. For `chatgpt` targets the credential is the caller's own, so the
view is per credential fingerprint seen in the quota records ("default": a caller with a
token and no quota data yet).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from combos import live, selectors
from quota import windows as qw
from quota.models import QuotaTransition
from quota.tracker import Record
from routing.eligibility import (
    RESOLVED,
    Access,
    TargetState,
    credential_problem,
    target_state,
)
from routing.state import ComboState, stamped
from routing.strategies import plan
from routing.types import ComboSpec, ConfigSnapshot

DEFAULT_CREDENTIAL = "default"


@dataclass(frozen=True)
class CredentialView:
    """One caller credential's view of a combo: each target's state (configured order), the
    target the next request would be dispatched to (None: nothing now), and, when the router
    would first wait for a cooldown, the target and milliseconds it waits for."""

    credential: str
    targets: tuple[TargetState, ...]
    would_serve: str | None
    wait_for: str | None = None
    wait_ms: int = 0


@dataclass(frozen=True)
class ComboView:
    combo: ComboSpec
    views: tuple[CredentialView, ...]


def quota_access(record: Record | None, *, now: int) -> Access:
    """The quota part of `Access` for a credential's record, as the next request would see it
    (a due recovery probe is one the next request takes)."""
    if record is None:
        return RESOLVED
    state = record.state
    verdict = qw.eligibility(state, now=now)
    if verdict == "eligible":
        return Access(credential=state.credential, quota="available")
    if verdict == "probe":
        return Access(credential=state.credential, quota="probe_due", probe_granted=True)
    return Access(
        credential=state.credential,
        quota="probing" if state.status == "probing" else "limited",
        quota_until=qw.next_change_at(state),
    )


def _per_caller(combo: ComboSpec, snapshot: ConfigSnapshot) -> set[str]:
    # Only `chatgpt` targets use the caller's own credential; others have their own one.
    return {
        t.provider
        for t in combo.targets
        if (spec := snapshot.providers.get(t.provider)) is not None and spec.adapter == "chatgpt"
    }


def credentials(
    combo: ComboSpec, snapshot: ConfigSnapshot, live_state: live.LiveSnapshot
) -> list[str]:
    """The caller credentials worth a view: every fingerprint with quota data on a `chatgpt`
    target of the combo, else the one default view."""
    per_caller = _per_caller(combo, snapshot)
    seen = sorted({c for (p, c) in live_state.records if p in per_caller})
    return seen or [DEFAULT_CREDENTIAL]


def accesses(
    combo: ComboSpec,
    snapshot: ConfigSnapshot,
    records: Mapping[tuple[str, str], Record],
    *,
    now: int,
    credential: str = DEFAULT_CREDENTIAL,
) -> dict[str, Access]:
    """`Access` per target key, built as the proxy builds it for a caller holding `credential`
    (for `chatgpt` targets; other providers resolve their own key, env var first)."""
    out: dict[str, Access] = {}
    for target in combo.targets:
        provider = snapshot.providers.get(target.provider)
        if provider is None:
            out[target.key] = RESOLVED
            continue
        if provider.adapter == "chatgpt":
            missing = credential_problem(provider, None, caller_token=True)
            fp = None if credential == DEFAULT_CREDENTIAL else credential
        else:
            secret = selectors.credential_for(provider)
            missing = credential_problem(provider, secret, caller_token=True)
            fp = qw.credential_fingerprint(secret) if secret else None
        record = None if fp is None else records.get((provider.name, fp))
        quota = quota_access(record, now=now)
        out[target.key] = Access(
            missing=missing,
            credential=fp,
            quota=quota.quota,
            quota_until=quota.quota_until,
            probe_granted=quota.probe_granted,
        )
    return out


def quota_resets(
    combo: ComboSpec,
    by_target: Mapping[str, Access],
    records: Mapping[tuple[str, str], Record],
    *,
    now: int,
) -> dict[str, int | None]:
    """The reset-window ranking input, as the proxy's quota gate computes it."""
    out: dict[str, int | None] = {}
    for target in combo.targets:
        fp = by_target[target.key].credential
        record = None if fp is None else records.get((target.provider, fp))
        if record is not None:
            out[target.key] = qw.soonest_reset(record.windows, now=now)
    return out


def credential_view(
    combo: ComboSpec,
    snapshot: ConfigSnapshot,
    live_state: live.LiveSnapshot,
    *,
    now: int,
    credential: str = DEFAULT_CREDENTIAL,
    rng: random.Random | None = None,
) -> CredentialView:
    """Target states and the selector's next pick for one caller credential (a dry run)."""
    state = live_state.combo_state(combo.id)
    by_target = accesses(combo, snapshot, live_state.records, now=now, credential=credential)
    reasons = live_state.reasons.get(combo.id)

    def step(current: ComboState) -> tuple[ComboState, Any]:
        return plan(
            combo,
            snapshot.providers,
            current,
            now=now,
            rng=rng or random.Random(0),
            budget_ms=combo.wait_for_cooldown_ms,
            quota_resets=quota_resets(combo, by_target, live_state.records, now=now),
            access=lambda t: by_target[t.key],
        )

    # The same state transform the attempt loop's `select` applies (nothing is stored).
    _, decision = stamped(combo, snapshot.version, step)(state)
    states = tuple(
        target_state(
            t,
            providers=snapshot.providers,
            state=state,
            now=now,
            override=combo.override,
            access=by_target[t.key],
            reasons=reasons,
        )
        for t in combo.targets
    )
    return CredentialView(
        credential=credential,
        targets=states,
        would_serve=None if decision.target is None else decision.target.key,
        wait_for=decision.wait_for,
        wait_ms=decision.wait_ms,
    )


def combo_view(
    combo: ComboSpec,
    snapshot: ConfigSnapshot,
    live_state: live.LiveSnapshot,
    *,
    now: int,
    rng: random.Random | None = None,
) -> ComboView:
    return ComboView(
        combo,
        tuple(
            credential_view(combo, snapshot, live_state, now=now, credential=c, rng=rng)
            for c in credentials(combo, snapshot, live_state)
        ),
    )


def combo_views(
    combo_id: str | None = None,
    *,
    local: bool = True,
    only: Collection[str] | None = None,
    snapshot: ConfigSnapshot | None = None,
) -> list[ComboView]:
    """The selector for dashboards: every combo's (or one combo's, or those in `only`) target
    states now. `snapshot`: the config already read for this page (else read here)."""
    snapshot = snapshot or selectors.config_snapshot()
    combos = [
        c
        for c in snapshot.combos.values()
        if combo_id in (None, c.id) and (only is None or c.id in only)
    ]
    live_state = live.load([c.id for c in combos], local=local)
    now = int(time.time() * 1000)
    return [combo_view(c, snapshot, live_state, now=now) for c in combos]


# -- JSON and HTML renderings ------------------------------------------------------------------

LABELS = {
    "pinned": "Pinned",
    "disabled": "Disabled",
    "no_credential": "No credential",
    "out_of_quota": "Out of quota until {until}",
    "cooling": "Cooling until {until}",
    "probing": "Probing",
    "available": "Available",
}


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat().replace("+00:00", "Z")


def label(ts: TargetState) -> str:
    """The badge text: "Cooling until 2026-01-02 03:04:05 UTC", "Available", "No credential" …"""
    if ts.until is None:
        # "Out of quota" with no reset time known says no more than that.
        return LABELS[ts.state].replace(" until {until}", "")
    until = dt.datetime.fromtimestamp(ts.until / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return LABELS[ts.state].format(until=until)


def state_json(ts: TargetState) -> dict[str, Any]:
    return {
        "target": ts.target,
        "state": ts.state,
        "label": label(ts),
        "eligible": ts.eligible,
        "skip": ts.skip,
        "until": iso(ts.until),
        "reason": ts.reason,
        "credential": ts.credential,
        "detail": ts.detail,
    }


def _window(w: qw.Window) -> dict[str, Any]:
    return {
        "window": w.name,
        "scope": w.scope,
        "usedPercent": w.used_percent,
        "resetsAt": iso(w.resets_at_ms),
        "source": w.source,
    }


def combo_status(
    combo: ComboSpec,
    snapshot: ConfigSnapshot,
    live_state: live.LiveSnapshot,
    now: int,
    *,
    rng: random.Random | None = None,
) -> dict[str, Any]:
    view = combo_view(combo, snapshot, live_state, now=now, rng=rng)
    state = live_state.combo_state(combo.id)
    providers = {t.provider for t in combo.targets}
    relevant = {pair: r for pair, r in live_state.records.items() if pair[0] in providers}
    exhausted = [
        {"provider": p, "credential": c, **_window(w)}
        for (p, c), r in relevant.items()
        for w in r.state.exhausted
    ]
    transitions = [r.state.last_transition for r in relevant.values() if r.state.last_transition]
    last = max(transitions, key=lambda t: t.at_ms) if transitions else None
    changes = [t for t in (qw.next_change_at(r.state) for r in relevant.values()) if t]
    cooldowns = [u for u in state.cooldowns.values() if u > now]
    first = view.views[0]
    out: dict[str, Any] = {
        "id": combo.id,
        "model": combo.public_id,
        "mode": f"pin {combo.override}" if combo.override else "auto",
        "strategy": combo.strategy,
        "wouldServe": {v.credential: v.would_serve for v in view.views},
        "waitFor": {
            v.credential: {"target": v.wait_for, "ms": v.wait_ms}
            for v in view.views
            if v.wait_for is not None
        },
        "targets": [state_json(ts) for ts in first.targets],
        "lastTransition": None
        if last is None
        else {
            "from": last.from_status,
            "to": last.to_status,
            "reason": last.reason,
            "at": iso(last.at_ms),
        },
        "exhaustedWindows": exhausted,
        "nextChangeAt": iso(min(changes + cooldowns) if changes or cooldowns else None),
    }
    if len(view.views) > 1:
        out["targetsByCredential"] = {
            v.credential: [state_json(ts) for ts in v.targets] for v in view.views
        }
    return out


NO_LIVE_STATE_NOTE = (
    "This process cannot see a running server's in-process routing state (no REDIS_URL): "
    "cooldowns, probes and quota below are not shown; ask the server: GET /api/status."
)


REDIS_UNREACHABLE_NOTE = (
    "Redis (REDIS_URL) is unreachable: the live routing state cannot be read; the view below "
    "is the configured one. Each worker routes on its own state meanwhile (GET /api/status)."
)


WORKER_COPY_NOTE = (
    "Redis (REDIS_URL) is unreachable: this is the answering worker's own copy of the routing "
    "state, which it routes on until Redis is back; other workers keep their own."
)


UNKNOWN_HERE = (
    "credential unknown from here: ${var} is read from the server's environment, which this "
    "command cannot see"
)


def _assume_server_env(snapshot: ConfigSnapshot) -> tuple[ConfigSnapshot, dict[str, str]]:
    """The snapshot with every key variable this process lacks taken as set (the server may
    well have it), and provider → variable for those."""
    hidden = {
        name: p.api_key_env
        for name, p in snapshot.providers.items()
        if p.api_key_env and not os.environ.get(p.api_key_env)
    }
    if not hidden:
        return snapshot, {}
    providers = {
        name: replace(p, api_key_env=None, api_key="unknown-from-here") if name in hidden else p
        for name, p in snapshot.providers.items()
    }
    return replace(snapshot, providers=MappingProxyType(providers)), hidden


def status_report(
    combo_id: str | None = None, *, local: bool = True, env_visible: bool = True
) -> dict[str, Any]:
    """`GET /api/status` (local: the server's own view) and `ocx status` (local=False; and
    env_visible=False when no server answered: a key variable this process lacks is said to be
    unknown from here, not missing)."""
    now = int(time.time() * 1000)
    snapshot = selectors.config_snapshot()
    hidden: dict[str, str] = {}
    if not env_visible:
        snapshot, hidden = _assume_server_env(snapshot)
    combos = [c for c in snapshot.combos.values() if combo_id in (None, c.id)]
    live_state = live.load([c.id for c in combos], local=local)
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
    report: dict[str, Any] = {
        "liveState": live_state.source,
        "combos": [combo_status(c, snapshot, live_state, now) for c in combos],
        "recentTransitions": recent,
    }
    for combo in report["combos"]:
        for t in combo["targets"]:
            var = hidden.get(t["target"].split("/", 1)[0])
            if var is not None:
                t["detail"] = UNKNOWN_HERE.replace("${var}", var)
    if live_state.source == "none":
        report["note"] = NO_LIVE_STATE_NOTE
    elif live_state.source == "redis unreachable":
        report["note"] = REDIS_UNREACHABLE_NOTE
    elif live_state.source == "this worker":
        report["note"] = WORKER_COPY_NOTE
    return report


def quota_report() -> dict[str, Any]:
    from quota.models import QuotaSnapshot

    now = int(time.time() * 1000)
    out = []
    for (provider, credential), record in sorted(live.load((), reasons=False).records.items()):
        out.append(
            {
                "provider": provider,
                "credential": credential,
                "status": record.state.status,
                "eligibility": qw.eligibility(record.state, now=now),
                "nextChangeAt": iso(qw.next_change_at(record.state)),
                "exhausted": [_window(w) for w in record.state.exhausted],
                "windows": [_window(w) for w in record.windows],
            }
        )
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


def badge_label(ts: TargetState) -> SafeString | str:
    """The label with its end time as a `<time>` the browser shows in local time, counting
    down (`ocx/localtime.js`); "Cooling until 14:05:03 UTC (in 42 s)" before it runs."""
    text = LABELS[ts.state]
    if ts.until is None or "{until}" not in text:
        return label(ts)
    from combos.times import until_html

    return format_html("{}{}", text.split("{until}")[0], until_html(ts.until))


RESETTABLE = frozenset({"cooling", "probing"})


def reset_button(combo_id: str, target: str) -> SafeString:
    """A "Clear" button for a cooling target; it submits the admin form around it to the reset
    view (`formaction`: the change form and the combo list are forms with a CSRF token)."""
    from django.urls import reverse

    return format_html(
        '<button type="submit" class="ocx-reset" formaction="{}" formmethod="post" '
        'name="target" value="{}" title="Clear the cooldown of {} now">Clear</button>',
        reverse("admin:combos_combo_reset", args=[combo_id]),
        target,
        target,
    )


def badges_html(states: Iterable[TargetState], combo_id: str) -> SafeString:
    parts = [
        format_html(
            '<span class="ocx-badge ocx-{}" data-target="{}" title="{}">{}: {}</span>{}',
            ts.state,
            ts.target,
            ts.detail or "",
            ts.target,
            badge_label(ts),
            reset_button(combo_id, ts.target) if ts.state in RESETTABLE else "",
        )
        for ts in states
    ]
    return format_html(
        '<span class="ocx-live" data-combo="{}">{}</span>',
        combo_id,
        format_html_join(" ", "{}", ((p,) for p in parts)),
    )


def live_badges(combo_id: str) -> SafeString:
    """HTML badges for the admin: one per target, refreshed live by `ocx-live.js`."""
    return page_badges([combo_id]).get(combo_id) or format_html("—")


def page_badges(
    combo_ids: Collection[str], snapshot: ConfigSnapshot | None = None
) -> dict[str, SafeString]:
    """The badges of a page of combos, from one config read and one live-state read."""
    views = combo_views(only=set(combo_ids), snapshot=snapshot)
    return {v.combo.id: badges_html(v.views[0].targets, v.combo.id) for v in views if v.views}
