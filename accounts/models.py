from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models

from usage.budgets import validate_budgets


class ClientKey(models.Model):
    """An `ocx_…` key a developer puts in Codex; stored as a SHA-256 hash only."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="client_keys")
    name = models.CharField(max_length=64, blank=True, default="")
    prefix = models.CharField(max_length=16, help_text="first characters, to recognise a key")
    digest = models.CharField(max_length=64, unique=True)
    allowed_models = models.JSONField(default=list, blank=True)
    rpm_limit = models.PositiveIntegerField(null=True, blank=True)
    # [{"tokens": N, "period": "day"}, {"windowPercent": P, "provider": "…"}] (usage.budgets)
    budgets = models.JSONField(default=list, blank=True, validators=[validate_budgets])
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    revoked = models.DateTimeField(null=True, blank=True)
    # After this instant the key is refused (401 key_expired); null: never.
    expires = models.DateTimeField(null=True, blank=True)
    # Rotation keeps the row (its id counts the key's usage and budgets) and swaps the digest;
    # the previous secret's digest stays valid until `previous_until` (the grace period).
    previous_digest = models.CharField(max_length=64, blank=True, default="", editable=False)
    previous_until = models.DateTimeField(
        "previous secret valid until", null=True, blank=True, editable=False
    )
    rotated = models.DateTimeField("last rotated", null=True, blank=True, editable=False)

    class Meta:
        db_table = "ocxsite_clientkey"  # its table since before the move from ocxsite
        ordering = ("-created",)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class UserBudget(models.Model):
    """A user's budgets, shared by all their keys (usage.budgets)."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, models.CASCADE, related_name="ocx_budget")
    budgets = models.JSONField(default=list, blank=True, validators=[validate_budgets])
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "ocxsite_userbudget"  # its table since before the move from ocxsite
        ordering = ("user__username",)

    def __str__(self) -> str:
        return f"budgets of {self.user}"


class ManagementToken(models.Model):
    """An `ocxm_…` token of a staff user for the management API."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, models.CASCADE, related_name="mgmt_tokens")
    name = models.CharField(max_length=64, blank=True, default="")
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "ocxsite_managementtoken"  # its table since before the move from ocxsite
        ordering = ("-created",)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class TeamProfile(models.Model):
    """What ocx adds to a Django group (a team): budgets shared by its members, and the models
    its members' keys are narrowed to. Members are the group's users (`user.groups`)."""

    group = models.OneToOneField(Group, models.CASCADE, related_name="ocx_team")
    # Same shapes as ClientKey.budgets (usage.budgets); every team of a user applies.
    budgets = models.JSONField(default=list, blank=True, validators=[validate_budgets])
    # [] = no narrowing; else a member's request must name one of these (and pass its key's).
    allowed_models = models.JSONField(default=list, blank=True)
    # Team managers (docs/people.md): they manage the keys, members and usage of this team.
    managers = models.ManyToManyField(
        settings.AUTH_USER_MODEL, related_name="managed_teams", blank=True
    )
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("group__name",)

    def __str__(self) -> str:
        return f"team {self.group.name}"


class Team(Group):
    """A Django group seen as an ocx team (the admin's "Teams"); no table of its own."""

    class Meta:
        proxy = True
        verbose_name = "team"
        verbose_name_plural = "teams"
        ordering = ("name",)


class SsoIdentity(models.Model):
    """The identity provider's account (issuer and subject, OpenID Connect's stable id) a user
    signs in with (docs/people.md#sso): matched before any user name."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, models.CASCADE, related_name="sso")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "SSO identity"
        verbose_name_plural = "SSO identities"
        constraints = [
            models.UniqueConstraint(fields=("issuer", "subject"), name="accounts_sso_subject")
        ]

    def __str__(self) -> str:
        return f"{self.issuer} {self.subject}"
