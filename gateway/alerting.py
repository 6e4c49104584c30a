"""The proxy's alerts: what the `/v1` path noticed, handed to the runtime's `AlertQueue`
(in memory, never waits; `alerts.outbox` writes it in the background).

- `target_cooled` (a cooldown set), `target_recovered` (a cooled or half-open target served),
- `combo_unavailable` (no target left: the 503), `provider_auth_failed` (401/403 of a stored
  key; a caller's own refused token is not the provider's),
- `quota_low` (a credential's window past `OCX_ALERT_QUOTA_PERCENT`, once per window reset).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from alerts import events
from alerts.outbox import AlertQueue
from quota.windows import Window
from routing.attempts import AttemptRecord
from routing.eligibility import TargetState

AUTH_REASONS = frozenset({"auth", "forbidden"})


def cooled(queue: AlertQueue, event: dict[str, object], now_ms: int) -> None:
    """A `cooldown` routing event (`Runtime.emit`)."""
    queue.offer(
        events.target_cooled(
            str(event["combo"]),
            str(event["target"]),
            int(event["until"]),  # type: ignore[call-overload]
            str(event.get("reason") or ""),
            now_ms,
        )
    )


def recovered(queue: AlertQueue, combo: str, now: Callable[[], int]) -> Callable[[str], None]:
    """The attempt loop's `on_recovered` for one request."""

    def on_recovered(target: str) -> None:
        queue.offer(events.target_recovered(combo, target, now()))

    return on_recovered


def after_route(
    queue: AlertQueue,
    combo: str,
    attempts: Sequence[AttemptRecord],
    states: Sequence[TargetState] | None,
    retry_after: str | None,
    now_ms: int,
) -> None:
    """A finished route: refused stored keys, and a combo with no target left."""
    for record in attempts:
        if record.reason in AUTH_REASONS and record.status in (401, 403):
            provider = record.target.split("/", 1)[0]
            queue.offer(
                events.provider_auth_failed(provider, record.target, combo, record.status, now_ms)
            )
    if states is not None and combo:
        why = {ts.target: ts.state + (f" ({ts.reason})" if ts.reason else "") for ts in states}
        queue.offer(events.combo_unavailable(combo, why, retry_after, now_ms))


class QuotaWatch:
    """Remembers which window resets were alerted in this worker (the outbox's `once` key keeps
    it to one message across workers), so a request past the threshold queues nothing new."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self._seen: dict[tuple[str, str, str], int | None] = {}

    def check(
        self, queue: AlertQueue, pair: tuple[str, str], windows: Sequence[Window], now_ms: int
    ) -> None:
        for w in windows:
            if w.used_percent is None or w.used_percent < self.threshold or w.informational:
                continue
            name = w.name if not w.limit_id else f"{w.name} ({w.limit_id})"
            seen_key = (pair[0], pair[1], name)
            if seen_key in self._seen and self._seen[seen_key] == w.resets_at_ms:
                continue
            self._seen[seen_key] = w.resets_at_ms
            queue.offer(
                events.quota_low(
                    pair[0], pair[1], name, w.used_percent, self.threshold, w.resets_at_ms, now_ms
                )
            )
