"""Schemas of `GET /api/usage` (camelCase JSON)."""

from __future__ import annotations

from typing import Any

from ninja import Schema


class UsageTotals(Schema):
    requests: int
    inputTokens: int
    cachedInputTokens: int
    outputTokens: int
    reasoningTokens: int
    unknownUsageRequests: int


class UsageReportOut(Schema):
    since: str
    until: str
    by: list[str]
    # Each row: the grouping values (`user`, `key` + `keyId`, `combo`, `target`, `model`,
    # `status`; `at` when bucketed) and the UsageTotals counters.
    rows: list[dict[str, Any]]
    totals: UsageTotals
