"""What goes over the wire to each kind of destination, and sending it once.

- `slack`: `{"text": …}` (Slack and Mattermost incoming webhooks);
- `webhook`: a JSON body; with a secret, `x-ocx-signature` is the hex HMAC-SHA256 of the body;
- `email`: Django's e-mail backend (`OCX_EMAIL_*`), one message to the destination's `to`.

A failure raises `DeliveryError` with a short reason that never holds the URL (a Slack webhook
URL is itself a credential) or the secret.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import smtplib
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import EmailMessage

from providers.sealing import unseal

SIGNATURE_HEADER = "x-ocx-signature"
TIMEOUT = httpx.Timeout(10.0, connect=5.0)


class DeliveryError(Exception):
    """One failed delivery; the message is safe to store and show."""


def absolute(link: str) -> str:
    return f"{settings.OCX_PUBLIC_URL}{link}" if link.startswith("/") else link


def _text(payload: dict[str, Any], folded: int) -> str:
    more = f" (and {folded} more like it)" if folded else ""
    return f"[ocx] {payload.get('text', '')}{more}"


def slack_body(payload: dict[str, Any], folded: int) -> bytes:
    text = _text(payload, folded)
    link = payload.get("link")
    if link:
        text += f"\n{absolute(str(link))}"
    return json.dumps({"text": text}).encode()


def webhook_body(payload: dict[str, Any], folded: int) -> bytes:
    at = payload.get("at")
    body = {
        "event": payload.get("event"),
        "text": payload.get("text"),
        "link": absolute(str(payload.get("link") or "")) or None,
        "at": (
            dt.datetime.fromtimestamp(int(at) / 1000, dt.UTC).isoformat().replace("+00:00", "Z")
            if at
            else None
        ),
        "folded": folded,
        "details": payload.get("data") or {},
    }
    return json.dumps(body, separators=(",", ":")).encode()


def signature(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def sealed_secret(sealed: str) -> str | None:
    """The webhook secret in clear (None: none set, or SECRET_KEY changed since it was set)."""
    return unseal(sealed) if sealed else None


def request(
    *, kind: str, sealed: str, payload: dict[str, Any], folded: int
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a slack or webhook message."""
    if kind == "slack":
        return slack_body(payload, folded), {"content-type": "application/json"}
    body = webhook_body(payload, folded)
    headers = {"content-type": "application/json", "user-agent": "ocx-alerts"}
    secret = sealed_secret(sealed)
    if sealed and secret is None:
        raise DeliveryError("the webhook secret cannot be read (SECRET_KEY changed): set it again")
    if secret:
        headers[SIGNATURE_HEADER] = signature(secret, body)
    return body, headers


def _check(response: httpx.Response) -> None:
    if not 200 <= response.status_code < 300:
        raise DeliveryError(f"HTTP {response.status_code}")


# No connection, a timeout, or a URL the client cannot use (a host IDNA refuses …).
SEND_ERRORS = (httpx.HTTPError, httpx.InvalidURL, UnicodeError, ValueError)


def _unreachable(exc: Exception) -> DeliveryError:
    return DeliveryError(f"{type(exc).__name__}: could not reach the destination")


async def post(
    client: httpx.AsyncClient,
    *,
    kind: str,
    url: str,
    sealed: str,
    payload: dict[str, Any],
    folded: int,
) -> None:
    """Send a slack or webhook message once; any answer but 2xx is a failure."""
    body, headers = request(kind=kind, sealed=sealed, payload=payload, folded=folded)
    try:
        response = await client.post(url, content=body, headers=headers, timeout=TIMEOUT)
    except SEND_ERRORS as exc:
        raise _unreachable(exc) from None
    _check(response)


def post_now(*, kind: str, url: str, sealed: str, payload: dict[str, Any]) -> None:
    """`post` from a thread (the admin's and the API's *Send test*)."""
    body, headers = request(kind=kind, sealed=sealed, payload=payload, folded=0)
    try:
        with httpx.Client(timeout=TIMEOUT) as client:
            response = client.post(url, content=body, headers=headers)
    except SEND_ERRORS as exc:
        raise _unreachable(exc) from None
    _check(response)


def send_email(*, to: list[str], payload: dict[str, Any], folded: int) -> None:
    """One e-mail through Django's backend (blocking: call in a thread)."""
    text = _text(payload, folded)
    link = absolute(str(payload.get("link") or ""))
    subject = text.splitlines()[0][:150]
    body = f"{text}\n\n{link}\n" if link else f"{text}\n"
    details = payload.get("data")
    if details:
        body += "\n" + json.dumps(details, indent=2, sort_keys=True) + "\n"
    try:
        sent = EmailMessage(subject=subject, body=body, to=to).send()
    except (smtplib.SMTPException, OSError) as exc:
        raise DeliveryError(
            f"{type(exc).__name__}: the mail server refused or was unreachable"
        ) from None
    if sent != 1:
        raise DeliveryError("the e-mail backend sent nothing")
