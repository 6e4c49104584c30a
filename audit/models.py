from __future__ import annotations

from django.db import models

VIA_CHOICES = [(v, v) for v in ("admin", "api", "cli", "portal", "sso")]
ACTION_CHOICES = [(a, a) for a in ("create", "update", "delete")]


class AuditEntry(models.Model):
    """One change of one object: `changes` is {field: [old, new]} (secrets as "***")."""

    at = models.DateTimeField(db_index=True)
    # A username; `cli:<OS user>` for a command; `-` for nobody signed in.
    actor = models.CharField(max_length=160, db_index=True)
    via = models.CharField(max_length=8, choices=VIA_CHOICES)
    action = models.CharField(max_length=8, choices=ACTION_CHOICES)
    object_type = models.CharField("object type", max_length=32, db_index=True)
    object_id = models.CharField("object id", max_length=255)
    object_label = models.CharField("object", max_length=255)
    changes = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ("-at", "-id")
        verbose_name = "audit entry"
        verbose_name_plural = "audit trail"
        indexes = [models.Index(fields=["object_type", "object_id"], name="audit_object")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_label}"
