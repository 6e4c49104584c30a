"""Writes of alert destinations, shared by the API, the CLI and the admin, and *Send test*."""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction

from alerts import delivery, events
from alerts.models import EVENTS, KINDS, AlertDestination
from combos.models import Combo
from providers.sealing import seal

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAME_RULE = "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
_UNSET: Any = object()


def _strings(field: str, value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValidationError({field: ["a list of non-empty strings"]})
    return list(dict.fromkeys(v.strip() for v in value))


def _url(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValidationError({"url": ["required for slack and webhook destinations"]})
    try:
        parts = urlsplit(value.strip())
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port out of range, a bad IPv6 literal
        ok = False
    if not ok or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value.strip()):
        # The value itself is not echoed: a Slack webhook URL is a credential.
        raise ValidationError({"url": ["an http:// or https:// URL with a host"]})
    return value.strip()


def destination_set(
    *,
    name: str,
    kind: object = _UNSET,
    url: object = _UNSET,
    to: object = _UNSET,
    events_wanted: object = _UNSET,
    secret: object = _UNSET,
    teams: object = _UNSET,
    combos: object = _UNSET,
) -> AlertDestination:
    """Create the destination `name` or change it: only the arguments given change (a new one
    needs kind, url or to, and events). `secret` is write-only: None or "" removes it.

    Raises ValidationError naming the field (nothing is changed then)."""
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        raise ValidationError({"name": [f"{NAME_RULE} (got {name!r})"]})
    with transaction.atomic():
        row = AlertDestination.objects.select_for_update().filter(name=name).first()
        if row is None:
            if kind is _UNSET or events_wanted is _UNSET:
                raise ValidationError({"alert": ["a new destination needs kind and events"]})
            row = AlertDestination(name=name)
        apply_changes(
            row,
            kind=kind,
            url=url,
            to=to,
            events_wanted=events_wanted,
            secret=secret,
            teams=teams,
            combos=combos,
        )
        row.save()
    return row


def apply_changes(
    row: AlertDestination,
    *,
    kind: object = _UNSET,
    url: object = _UNSET,
    to: object = _UNSET,
    events_wanted: object = _UNSET,
    secret: object = _UNSET,
    teams: object = _UNSET,
    combos: object = _UNSET,
) -> None:
    """Check the changes and set them on `row` (not saved; the admin's form saves it).
    Raises ValidationError naming the field."""
    if kind is not _UNSET:
        if kind not in KINDS:
            raise ValidationError({"kind": [f"one of {', '.join(KINDS)} (got {kind!r})"]})
        row.kind = str(kind)
    if url is not _UNSET:
        row.url = "" if url is None or url == "" else _url(url)
    if to is not _UNSET:
        addresses = _strings("to", to)
        for address in addresses:
            try:
                validate_email(address)
            except ValidationError:
                raise ValidationError({"to": [f"not an e-mail address: {address!r}"]}) from None
        row.to = addresses
    if events_wanted is not _UNSET:
        wanted = _strings("events", events_wanted)
        unknown = [e for e in wanted if e not in EVENTS]
        if unknown or not wanted:
            raise ValidationError(
                {"events": [f"one or more of {', '.join(EVENTS)} (got {unknown or wanted!r})"]}
            )
        row.events = wanted
    if teams is not _UNSET:
        names = _strings("teams", teams)
        known = set(Group.objects.filter(name__in=names).values_list("name", flat=True))
        missing = [t for t in names if t not in known]
        if missing:
            raise ValidationError({"teams": [f"unknown team(s): {', '.join(missing)}"]})
        row.teams = names
    if combos is not _UNSET:
        ids = _strings("combos", combos)
        known = set(Combo.objects.filter(combo_id__in=ids).values_list("combo_id", flat=True))
        missing = [c for c in ids if c not in known]
        if missing:
            raise ValidationError({"combos": [f"unknown combo(s): {', '.join(missing)}"]})
        row.combos = ids
    if secret is not _UNSET:
        if secret is not None and not isinstance(secret, str):
            raise ValidationError({"secret": ["a string"]})
        row.secret = seal(secret) if secret else ""
    _check(row)
    row.full_clean()


def _check(row: AlertDestination) -> None:
    if row.kind == "email":
        if not row.to:
            raise ValidationError({"to": ["an email destination needs at least one address"]})
        if row.url:
            raise ValidationError({"url": ["an email destination has no url (give to)"]})
    else:
        if not row.url:
            raise ValidationError({"url": [f"a {row.kind} destination needs a url"]})
        if row.to:
            raise ValidationError({"to": [f"a {row.kind} destination has no to (give url)"]})
    if row.secret and row.kind != "webhook":
        raise ValidationError({"secret": ["only a webhook destination signs its messages"]})


def destination_delete(*, name: str) -> bool:
    """Remove the destination and its messages; False when there is none."""
    deleted, _ = AlertDestination.objects.filter(name=name).delete()
    return bool(deleted)


def send_test(*, name: str) -> str | None:
    """Send a test message to `name` now, past the outbox (blocking; the admin and the API).
    Returns None when it was delivered, else why not (never the URL or the secret)."""
    row = AlertDestination.objects.filter(name=name).first()
    if row is None:
        return f"no alert destination {name}"
    payload = dict(events.test_alert(name, int(time.time() * 1000)))
    try:
        if row.kind == "email":
            delivery.send_email(to=list(row.to), payload=payload, folded=0)
        else:
            delivery.post_now(kind=row.kind, url=row.url, sealed=row.secret, payload=payload)
    except delivery.DeliveryError as exc:
        return str(exc)
    return None
