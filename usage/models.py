"""Usage rollups (PRODUCT §9.5): per-minute counters per dimension tuple, downsampled to hours
after a day. Every counter is only ever incremented (`services.record_requests`), so several
workers can write the same row concurrently."""

from __future__ import annotations

from django.db import models

MINUTE = 60
HOUR = 3600
# Fixed histogram upper bounds in ms (the last bucket is open): p50/p95 come from these.
LATENCY_BOUNDS_MS = (100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
TTFT_BOUNDS_MS = (50, 100, 250, 500, 1000, 2500, 5000, 10000)
DIMENSIONS = ("user", "key_id", "key_prefix", "combo", "target", "model", "status_class")
COUNTERS = (
    "requests",
    "errors",
    "hops",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "unknown_usage_requests",
    "latency_ms_sum",
    "ttft_ms_sum",
    "ttft_count",
    *(f"latency_b{i}" for i in range(len(LATENCY_BOUNDS_MS) + 1)),
    *(f"ttft_b{i}" for i in range(len(TTFT_BOUNDS_MS) + 1)),
    # Cost (issue 27): served requests whose target has no price, and the USD sums (floats).
    "unpriced_requests",
    "cost_usd",
    "api_value_usd",
    # Issue 42: requests whose usage is ocx's estimate (an abandoned stream, a bad figure).
    "estimated_requests",
)


def _counter() -> models.BigIntegerField[int, int]:
    return models.BigIntegerField(default=0)


class UsageRollup(models.Model):
    resolution = models.PositiveIntegerField(default=MINUTE, help_text="bucket size in seconds")
    bucket = models.DateTimeField(help_text="start of the bucket (UTC)")
    user = models.CharField(max_length=150, blank=True, default="")
    key_id = models.BigIntegerField(default=0)
    key_prefix = models.CharField(max_length=16, blank=True, default="")
    combo = models.CharField(max_length=64, blank=True, default="")
    target = models.CharField(max_length=512, blank=True, default="", help_text="provider/model")
    model = models.CharField(max_length=256, blank=True, default="", help_text="model requested")
    status_class = models.CharField(max_length=3, blank=True, default="")
    requests = _counter()
    errors = _counter()
    hops = _counter()
    input_tokens = _counter()
    cached_input_tokens = _counter()
    output_tokens = _counter()
    reasoning_tokens = _counter()
    unknown_usage_requests = _counter()
    latency_ms_sum = _counter()
    ttft_ms_sum = _counter()
    ttft_count = _counter()
    latency_b0 = _counter()
    latency_b1 = _counter()
    latency_b2 = _counter()
    latency_b3 = _counter()
    latency_b4 = _counter()
    latency_b5 = _counter()
    latency_b6 = _counter()
    latency_b7 = _counter()
    latency_b8 = _counter()
    latency_b9 = _counter()
    ttft_b0 = _counter()
    ttft_b1 = _counter()
    ttft_b2 = _counter()
    ttft_b3 = _counter()
    ttft_b4 = _counter()
    ttft_b5 = _counter()
    ttft_b6 = _counter()
    ttft_b7 = _counter()
    ttft_b8 = _counter()
    unpriced_requests = _counter()
    # USD: the requests' cost, and their value at API prices (= cost except on subscription
    # targets such as chatgpt, which cost 0). A request of unknown cost adds nothing.
    cost_usd = models.FloatField(default=0.0)
    api_value_usd = models.FloatField(default=0.0)
    estimated_requests = _counter()

    class Meta:
        ordering = ("-bucket",)
        constraints = [
            models.UniqueConstraint(
                fields=[
                    "resolution",
                    "bucket",
                    "user",
                    "key_id",
                    "combo",
                    "target",
                    "model",
                    "status_class",
                ],
                name="usage_rollup_unique_bucket",
            )
        ]
        indexes = [models.Index(fields=["bucket"], name="usage_rollup_bucket")]

    def __str__(self) -> str:
        return f"{self.bucket:%Y-%m-%d %H:%M} {self.user or '-'} {self.target or '-'}"


class RequestLog(models.Model):
    request_id = models.CharField(max_length=40, db_index=True)
    at = models.DateTimeField(db_index=True)
    key_prefix = models.CharField(max_length=16, blank=True, default="")
    user = models.CharField(max_length=150, blank=True, default="")
    requested_model = models.CharField(max_length=256, blank=True, default="")
    combo = models.CharField(max_length=64, blank=True, default="")
    target = models.CharField(max_length=512, blank=True, default="")
    status = models.PositiveIntegerField(default=0)
    outcome = models.CharField(max_length=32, blank=True, default="")
    stream = models.BooleanField(default=False)
    duration_ms = models.PositiveIntegerField(default=0)
    # From arrival to the response start (commit); null when it never got that far.
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    input_tokens = models.PositiveIntegerField(null=True, blank=True)
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    cached_tokens = models.PositiveIntegerField(null=True, blank=True)
    # USD, computed by the writer from the usage and the target's price (routing.pricing):
    # null = unknown (no usage report, or no price). A chatgpt target costs 0; `api_value_usd`
    # is what the request would have cost at API prices (= cost elsewhere).
    cost_usd = models.FloatField(null=True, blank=True)
    api_value_usd = models.FloatField(null=True, blank=True)
    # The tokens are ocx's estimate, not the upstream's report (`usage.estimate`): a stream the
    # client abandoned before its final usage, or figures that failed the checks.
    usage_estimated = models.BooleanField(default=False)
    # A `budget_exceeded` refusal: the budget that refused it ("team infra: $5.00 per day").
    budget = models.CharField(max_length=200, blank=True, default="")
    # Route trace: attempts [{target, status, reason, cooled_until, ms}], skipped [[key, why]].
    attempts = models.JSONField(default=list, blank=True)
    skipped = models.JSONField(default=list, blank=True)

    class Meta:
        db_table = "ocxsite_requestlog"  # its table since before the move from ocxsite
        ordering = ("-at",)

    def __str__(self) -> str:
        return self.request_id


class BudgetEvent(models.Model):
    """A budget crossing 80 % or 100 % (once per budget period)."""

    at = models.DateTimeField(db_index=True)
    owner = models.CharField(max_length=200)
    scope = models.CharField(max_length=8)
    percent = models.PositiveSmallIntegerField()
    budget = models.JSONField(default=dict)
    window = models.CharField(max_length=32, blank=True, default="")
    used = models.FloatField()
    limit = models.FloatField()
    resets_at = models.DateTimeField()
    message = models.TextField()

    class Meta:
        db_table = "ocxsite_budgetevent"  # its table since before the move from ocxsite
        ordering = ("-at",)

    def __str__(self) -> str:
        return self.message
