"""What the audit trail records of a combo: its settings and its targets in order (the routing
state and its resets are not configuration)."""

from __future__ import annotations

from audit import trail
from combos.models import Combo, ComboTarget


def read_combo(combo_id: str) -> trail.Snapshot:
    combo = Combo.objects.filter(combo_id=combo_id).first()
    if combo is None:
        return None
    fields = trail.row_fields(combo, exclude=("combo_id", "updated", "state_resets"))
    targets = ComboTarget.objects.filter(combo=combo).select_related("provider")
    fields["targets"] = [
        f"{t.provider.name}/{t.model}"
        + (f" weight {t.weight}" if t.weight != 1 else "")
        + (" last resort" if t.last_resort else "")
        for t in targets.order_by("position", "id")
    ]
    return f"combo {combo_id}", fields


def register() -> None:
    trail.register("combo", read_combo)
    trail.watch(Combo, "combo", lambda c: c.combo_id, owner=True)
    trail.watch(ComboTarget, "combo", _owner_id)


def _owner_id(row: ComboTarget) -> str | None:
    return Combo.objects.filter(pk=row.combo_id).values_list("combo_id", flat=True).first()
