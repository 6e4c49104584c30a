"""Alert destinations and the outbox of messages to them (PRODUCT §9.9)."""

from __future__ import annotations

from django.db import models

KINDS = ("slack", "webhook", "email")
EVENTS = (
    "budget",
    "target_cooled",
    "target_recovered",
    "combo_unavailable",
    "quota_low",
    "key_expiring",
    "provider_auth_failed",
)
PENDING, SENT, FAILED = "pending", "sent", "failed"


class AlertDestination(models.Model):
    """Where alerts go: a Slack/Mattermost incoming webhook, a signed JSON webhook or e-mail."""

    name = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=8, choices=[(k, k) for k in KINDS])
    url = models.CharField(max_length=2000, blank=True, default="", help_text="slack, webhook")
    to = models.JSONField(default=list, blank=True, help_text="e-mail addresses (email)")
    events = models.JSONField(default=list, help_text="the events it wants")
    # Sealed like provider keys (providers.sealing); write-only: never shown or returned.
    secret = models.TextField(blank=True, default="", help_text="webhook HMAC key (sealed)")
    teams = models.JSONField(default=list, blank=True, help_text="only events of these teams")
    combos = models.JSONField(default=list, blank=True, help_text="only events of these combos")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AlertMessage(models.Model):
    """One message to one destination: the outbox row the sender delivers (and retries)."""

    destination = models.ForeignKey(
        AlertDestination, on_delete=models.CASCADE, related_name="messages"
    )
    event = models.CharField(max_length=32)
    # The folding key: one message per key and destination per OCX_ALERT_MIN_INTERVAL.
    key = models.CharField(max_length=300)
    payload = models.JSONField(default=dict)
    created = models.DateTimeField(db_index=True)
    # Events of the same key folded into this message (within the interval).
    folded = models.PositiveIntegerField(default=0)
    status = models.CharField(
        max_length=8, default=PENDING, choices=[(s, s) for s in (PENDING, SENT, FAILED)]
    )
    attempts = models.PositiveIntegerField(default=0)
    next_at = models.DateTimeField(help_text="next delivery attempt")
    last_error = models.CharField(max_length=500, blank=True, default="")
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        indexes = [
            models.Index(fields=["status", "next_at"], name="alerts_msg_due"),
            models.Index(fields=["destination", "key", "created"], name="alerts_msg_fold"),
        ]

    def __str__(self) -> str:
        return f"{self.event} → {self.destination_id}"


class SenderLease(models.Model):
    """Which process sends: one sender across workers and servers (a renewed lease row)."""

    name = models.CharField(max_length=32, primary_key=True)
    holder = models.CharField(max_length=80)
    until = models.DateTimeField()
