"""The audit trail's recorder. Each app registers its kinds of object (`register`: how to read
one whole object, which of its fields are secrets) and the models whose writes touch one
(`watch`, `watch_m2m`). The first write that touches an object in a transaction reads the
object as it was; when the transaction commits the object is read again and one entry records
the difference, field by field (secrets as "***"). So a write that deletes and re-creates child
rows (a combo's targets) records what really changed, once, and a rolled-back write nothing.

Writes that bypass model signals (`QuerySet.update`) call `touch` before they write."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connection, models, transaction
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save
from django.utils import timezone

from audit import context

log = logging.getLogger("ocx.audit")
SECRET = "***"
PRUNE_EVERY_S = 3600.0
# (label, fields) of an object, or None: there is none (not yet, or no longer).
Snapshot = tuple[str, dict[str, object]] | None


@dataclass(frozen=True)
class Kind:
    name: str
    read: Callable[[str], Snapshot]
    secrets: frozenset[str] = frozenset()


@dataclass
class _Pending:
    before: Snapshot
    actor: str
    via: str
    callback: Callable[[], None] | None = None
    done: bool = field(default=False)


_kinds: dict[str, Kind] = {}
_last_prune = 0.0


def register(kind: str, read: Callable[[str], Snapshot], *, secrets: Iterable[str] = ()) -> None:
    _kinds[kind] = Kind(kind, read, frozenset(secrets))


def watch(
    model: type[models.Model], kind: str, id_of: Callable[[Any], object], *, owner: bool = False
) -> None:
    """Saves and deletes of `model` rows touch the `kind` object `id_of(row)` (None: none).
    `owner`: a row is the object itself (a new row is a new object), not a part of one."""

    def before(sender: object, instance: Any, **kwargs: Any) -> None:
        if kwargs.get("raw"):
            return  # fixtures loading
        fields = kwargs.get("update_fields")
        if fields is not None and set(fields) <= {"last_login"}:
            return  # a sign-in changes nothing the trail records
        if owner and instance.pk is None:
            return  # a new object: recorded once saved
        obj_id = id_of(instance)
        if obj_id is not None:
            touch(kind, obj_id)

    def after(sender: object, instance: Any, **kwargs: Any) -> None:
        if kwargs.get("raw"):
            return
        fields = kwargs.get("update_fields")
        if fields is not None and set(fields) <= {"last_login"}:
            return
        obj_id = id_of(instance)
        if obj_id is None:
            return
        if owner and kwargs.get("created"):
            touch(kind, obj_id, new=True)
        _settle()

    uid = f"audit-{kind}-{model._meta.label_lower}"
    pre_save.connect(before, sender=model, dispatch_uid=uid + "-pre-save", weak=False)
    pre_delete.connect(before, sender=model, dispatch_uid=uid + "-pre-delete", weak=False)
    post_save.connect(after, sender=model, dispatch_uid=uid + "-post-save", weak=False)
    post_delete.connect(after, sender=model, dispatch_uid=uid + "-post-delete", weak=False)


def watch_m2m(
    through: type[models.Model],
    kind: str,
    ids_of: Callable[[Any, bool, set[Any] | None], list[Any]],
) -> None:
    """Changes of a many-to-many relation touch the `kind` objects `ids_of(instance, reverse,
    pk_set)` (pk_set None: a clear)."""

    def changed(sender: object, instance: Any, action: str, reverse: bool, **kwargs: Any) -> None:
        pk_set = kwargs.get("pk_set")
        if action.startswith("pre_"):
            for obj_id in ids_of(instance, reverse, pk_set):
                touch(kind, obj_id)
        else:
            _settle()

    m2m_changed.connect(
        changed,
        sender=through,
        dispatch_uid=f"audit-{kind}-{through._meta.label_lower}",
        weak=False,
    )


def _pending() -> dict[tuple[str, str], _Pending]:
    found: dict[tuple[str, str], _Pending] | None = getattr(connection, "ocx_audit", None)
    if found is None:
        found = {}
        connection.ocx_audit = found  # type: ignore[attr-defined]
    return found


def _live(entry: _Pending) -> bool:
    """An entry whose transaction was rolled back lost its commit callback: it is stale."""
    if entry.done:
        return False
    if entry.callback is None:
        return True  # outside a transaction: settled right after the write
    return any(item[1] is entry.callback for item in connection.run_on_commit)


def touch(kind: str, obj_id: object, *, new: bool = False) -> None:
    """The `kind` object `obj_id` is about to change: read it as it is (once per transaction)
    and record the difference after the commit. `new`: it did not exist before."""
    if kind not in _kinds:
        return
    key = (kind, str(obj_id))
    pending = _pending()
    entry = pending.get(key)
    if entry is not None and _live(entry):
        return
    actor, via = context.current()
    entry = _Pending(before=None if new else _read(kind, key[1]), actor=actor, via=via)
    pending[key] = entry
    if connection.in_atomic_block:

        def flush() -> None:
            _flush(key, entry)

        entry.callback = flush
        transaction.on_commit(flush, robust=True)


def _settle() -> None:
    """Outside a transaction a write is committed as soon as it returns: record it now."""
    if connection.in_atomic_block:
        return
    for key, entry in list(_pending().items()):
        if entry.callback is None and not entry.done:
            _flush(key, entry)


def _read(kind: str, obj_id: str) -> Snapshot:
    try:
        return _kinds[kind].read(obj_id)
    except (ValueError, TypeError):
        return None


def _flush(key: tuple[str, str], entry: _Pending) -> None:
    entry.done = True
    pending = _pending()
    if pending.get(key) is entry:
        del pending[key]
    kind = _kinds[key[0]]
    after = _read(key[0], key[1])
    changes = diff(entry.before, after, kind.secrets)
    if entry.before is None and after is None:
        return
    if entry.before is not None and after is not None and not changes:
        return  # saved, but nothing the trail records changed
    action = "create" if entry.before is None else "delete" if after is None else "update"
    label = (after or entry.before or ("", {}))[0]
    try:
        _write(
            actor=entry.actor,
            via=entry.via,
            action=action,
            object_type=key[0],
            object_id=key[1],
            object_label=label,
            changes=changes,
        )
    except DatabaseError:
        log.exception("audit: could not record %s %s %s", action, key[0], label)


def _write(**values: Any) -> None:
    from audit import services

    services.record(**values, now=timezone.now())
    global _last_prune
    if time.monotonic() - _last_prune > PRUNE_EVERY_S:
        _last_prune = time.monotonic()
        services.prune(now=timezone.now())


def diff(before: Snapshot, after: Snapshot, secrets: frozenset[str]) -> dict[str, list[object]]:
    """{field: [old, new]} of the fields that differ; a secret's values read "***" (or null
    when there is none)."""
    old = before[1] if before else {}
    new = after[1] if after else {}
    out: dict[str, list[object]] = {}
    for name in sorted(old.keys() | new.keys()):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if name in secrets:
            out[name] = [SECRET if a else None, SECRET if b else None]
        else:
            out[name] = [a, b]
    return out


def plain(value: object) -> object:
    """A value as it goes into the trail's JSON."""
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    try:
        json.dumps(value)
    except TypeError:
        return str(value)
    return value


def row_fields(row: models.Model, *, exclude: Iterable[str] = ()) -> dict[str, object]:
    """Every concrete field of `row` but its id and `exclude`, by attribute name (`user_id`)."""
    skip = {"id", *exclude}
    return {
        f.name: plain(getattr(row, f.attname))
        for f in row._meta.concrete_fields
        if f.name not in skip
    }
