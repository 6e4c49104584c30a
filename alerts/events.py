"""What each alert says: one builder per event, called by the producers (usage, gateway,
accounts), each returning an `Alert`: the event, its folding key, the text, the numbers and the
admin page it links to. Pure: no Django, no I/O; times are passed in (epoch ms)."""

from __future__ import annotations

import datetime as dt
from typing import Any, TypedDict
from urllib.parse import quote


class Alert(TypedDict, total=False):
    event: str  # one of alerts.models.EVENTS
    key: str  # folding key: one message per key and destination per interval
    once: bool  # never again for this key (a budget's period, a key's expiry, a window's reset)
    text: str  # one line a person reads (Slack text, e-mail subject and body)
    link: str  # admin path, made absolute with OCX_PUBLIC_URL when sent
    at: int  # epoch ms
    # The filter dimensions this event has (absent: the destination's filter does not apply).
    teams: list[str]
    combos: list[str]
    scope: str  # a budget's counter label (k12, u3, t5): its teams are looked up when written
    data: dict[str, Any]  # the numbers, camelCase (webhook `details`)
    folded: int  # events of this key folded into this one before it was queued


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat().replace("+00:00", "Z")


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else round(value, 6)


def _combo_link(combo: str) -> str:
    return f"/admin/combos/combo/?q={quote(combo)}"


def budget(event: dict[str, Any]) -> Alert:
    """A budget crossed 80 % or 100 % (`usage.budget_gate`'s event); once per budget, threshold
    and period. A key's budget names its user (`ScopedBudget.owner`)."""
    scope = str(event.get("label") or "")
    kind = str(event.get("scope") or "")
    number = scope[1:] if scope[1:].isdigit() else ""
    link = {
        "key": f"/admin/accounts/clientkey/{number}/change/",
        "user": f"/admin/auth/user/{number}/change/",
        "team": f"/admin/accounts/team/{number}/change/",
    }.get(kind, "/admin/usage/budgetevent/")
    if not number:
        link = "/admin/usage/budgetevent/"
    budget_json = event.get("budget") or {}
    window = event.get("window") or ""
    what = ":".join(str(budget_json.get(k, "")) for k in ("kind", "period", "provider"))
    return Alert(
        event="budget",
        key=f"budget:{scope or event.get('owner')}:{what}:{window}:{event['percent']}"
        f":{event['resetsAt']}",
        once=True,
        text=f"Budget {event['percent']}%: {event['message']}",
        link=link,
        at=int(event.get("at") or 0),
        scope=scope,
        data={
            "owner": event.get("owner"),
            "scope": kind,
            "percent": event["percent"],
            "used": _num(float(event["used"])),
            "limit": _num(float(event["limit"])),
            "budget": budget_json,
            "window": window or None,
            "resetsAt": _iso(int(event["resetsAt"])),
        },
    )


def target_cooled(combo: str, target: str, until_ms: int, reason: str, now_ms: int) -> Alert:
    seconds = max(0, round((until_ms - now_ms) / 1000))
    return Alert(
        event="target_cooled",
        key=f"target_cooled:{combo}:{target}",
        text=f"Target {target} of combo {combo} is cooling down for {seconds} s "
        f"(until {_iso(until_ms)}): {reason}",
        link=_combo_link(combo),
        at=now_ms,
        combos=[combo],
        data={
            "combo": combo,
            "target": target,
            "reason": reason,
            "until": _iso(until_ms),
            "seconds": seconds,
        },
    )


def target_recovered(combo: str, target: str, now_ms: int) -> Alert:
    return Alert(
        event="target_recovered",
        key=f"target_recovered:{combo}:{target}",
        text=f"Target {target} of combo {combo} served again after its cooldown",
        link=_combo_link(combo),
        at=now_ms,
        combos=[combo],
        data={"combo": combo, "target": target},
    )


def combo_unavailable(
    combo: str, why: dict[str, str], retry_after_s: str | None, now_ms: int
) -> Alert:
    reasons = "; ".join(f"{t}: {w}" for t, w in why.items()) or "no eligible target"
    wait = f"; earliest retry in {retry_after_s} s" if retry_after_s else ""
    return Alert(
        event="combo_unavailable",
        key=f"combo_unavailable:{combo}",
        text=f"Combo {combo} has no target left ({reasons}){wait}",
        link=_combo_link(combo),
        at=now_ms,
        combos=[combo],
        data={
            "combo": combo,
            "targets": why,
            "retryAfterSeconds": int(retry_after_s) if retry_after_s else None,
        },
    )


def quota_low(
    provider: str,
    credential: str,
    window: str,
    used_percent: float,
    threshold: int,
    resets_at_ms: int | None,
    now_ms: int,
) -> Alert:
    """A credential's quota window is past the threshold (once per window and reset)."""
    resets = f"; it resets at {_iso(resets_at_ms)}" if resets_at_ms else ""
    return Alert(
        event="quota_low",
        key=f"quota_low:{provider}:{credential}:{window}:{resets_at_ms or ''}",
        once=resets_at_ms is not None,
        text=f"Quota of provider {provider} (credential {credential}): the {window} window is "
        f"{_num(round(used_percent, 1))}% used (threshold {threshold}%){resets}",
        link=f"/admin/providers/provider/?q={quote(provider)}",
        at=now_ms,
        data={
            "provider": provider,
            "credential": credential,
            "window": window,
            "usedPercent": _num(round(used_percent, 1)),
            "threshold": threshold,
            "resetsAt": _iso(resets_at_ms) if resets_at_ms else None,
        },
    )


def key_expiring(
    *,
    key_id: int,
    prefix: str,
    name: str,
    user: str,
    teams: list[str],
    expires_ms: int,
    days: int,
    now_ms: int,
) -> Alert:
    """A client key expires within `days` (7 or 1): once per key, expiry and warning."""
    label = f"key {prefix}… ({name}) of {user}" if name else f"key {prefix}… of {user}"
    left_h = max(0, (expires_ms - now_ms) // 3_600_000)
    days_left, hours_left = divmod(left_h, 24)
    when = f"{days_left} day(s) {hours_left} hour(s)" if days_left else f"{hours_left} hour(s)"
    return Alert(
        event="key_expiring",
        key=f"key_expiring:{key_id}:{days}d:{expires_ms}",
        once=True,
        text=f"Client {label} expires in {when}, at {_iso(expires_ms)}",
        link=f"/admin/accounts/clientkey/{key_id}/change/",
        at=now_ms,
        teams=teams,
        data={
            "keyId": key_id,
            "prefix": prefix,
            "name": name,
            "user": user,
            "expiresAt": _iso(expires_ms),
            "warning": f"{days}d",
        },
    )


def provider_auth_failed(provider: str, target: str, combo: str, status: int, now_ms: int) -> Alert:
    """An upstream refused the stored key (401/403): the secret needs attention."""
    where = f" (combo {combo}, target {target})" if combo else f" (target {target})"
    return Alert(
        event="provider_auth_failed",
        key=f"provider_auth_failed:{provider}",
        text=f"Provider {provider} refused its stored key with HTTP {status}{where}",
        link=f"/admin/providers/provider/?q={quote(provider)}",
        at=now_ms,
        combos=[combo] if combo else [],
        data={"provider": provider, "target": target, "combo": combo or None, "status": status},
    )


def test_alert(destination: str, now_ms: int) -> Alert:
    return Alert(
        event="test",
        key=f"test:{destination}:{now_ms}",
        text=f"Test message from ocx to destination {destination}",
        link="/admin/alerts/alertdestination/",
        at=now_ms,
        data={"destination": destination},
    )
