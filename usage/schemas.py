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
    # USD: the cost (a chatgpt subscription target costs 0) and the value at API prices; a
    # request whose target has no price adds nothing and counts in unpricedRequests.
    costUsd: float
    apiValueUsd: float
    unpricedRequests: int
    # Requests whose tokens are ocx's estimate (an abandoned stream, a bad usage figure).
    estimatedRequests: int


class UsageReportOut(Schema):
    since: str
    until: str
    by: list[str]
    # Each row: the grouping values (`user`, `team`, `key` + `keyId`, `combo`, `target`, `model`,
    # `status`; `at` when bucketed) and the UsageTotals counters.
    rows: list[dict[str, Any]]
    totals: UsageTotals
