"""Schemas of `/api/alerts` (camelCase JSON)."""

from __future__ import annotations

from ninja import Field, Schema
from pydantic import ConfigDict


class AlertIn(Schema):
    """Fields left out keep their stored values (a new destination needs kind, url or to, and
    events); `secret` is write-only: null or "" removes it."""

    model_config = ConfigDict(extra="forbid")

    kind: str | None = Field(None, description="slack, webhook or email")
    url: str | None = Field(None, description="incoming-webhook or webhook URL (slack, webhook)")
    to: list[str] | None = Field(None, description="e-mail addresses (email)")
    events: list[str] | None = Field(None, description="the events it wants (docs/alerts.md)")
    secret: str | None = Field(None, description="webhook HMAC-SHA256 key; never returned")
    teams: list[str] | None = Field(None, description="only events of these teams")
    combos: list[str] | None = Field(None, description="only events of these combos")


class AlertPut(Schema):
    model_config = ConfigDict(extra="forbid")

    name: str
    alert: AlertIn


class AlertOut(Schema):
    name: str
    kind: str
    url: str | None = None
    to: list[str] | None = None
    events: list[str]
    teams: list[str]
    combos: list[str]
    hasSecret: bool | None = None
    pending: int
    failed: int


class AlertListOut(Schema):
    alerts: list[AlertOut]


class AlertPutOut(Schema):
    success: bool
    alert: AlertOut


class AlertDeleteOut(Schema):
    success: bool
    name: str


class AlertTestOut(Schema):
    success: bool
    name: str
    error: str | None = None
