"""Routing events (cooldowns and hops) as they happened, for the events page's history and the
dashboard. Written in batches off the hot path (`Runtime.emit` → a `BatchWriter`); bounded to
the newest `KEEP` rows. Quota transitions have their own table (`quota.QuotaTransition`)."""

from __future__ import annotations

from django.db import models

KEEP = 5000


class RoutingEvent(models.Model):
    at = models.DateTimeField(help_text="when it happened (UTC)")
    kind = models.CharField(max_length=16, help_text="cooldown or hop")
    combo = models.CharField(max_length=64, blank=True, default="")
    target = models.CharField(max_length=512, blank=True, default="")
    status = models.IntegerField(null=True, blank=True, help_text="upstream status of a hop")
    reason = models.CharField(max_length=256, blank=True, default="")
    until = models.DateTimeField(null=True, blank=True, help_text="end of a cooldown")

    class Meta:
        ordering = ("-at", "-id")
        indexes = [models.Index(fields=["at"], name="routing_event_at")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.kind} {self.combo} {self.target}"
