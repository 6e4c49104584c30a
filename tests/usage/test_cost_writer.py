"""The request-log writer prices each batch before writing it (issue 27): the log rows and the
rollups get the cost of the config the worker serves, and a pricing fault never loses a batch."""

from __future__ import annotations

import time
from types import MappingProxyType
from typing import Any

import pytest

from routing import pricing
from routing.types import ConfigSnapshot, ModelPrice, ModelSpec, ProviderSpec
from usage import requestlog
from usage.models import RequestLog, UsageRollup

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    # The writer keeps its rates per snapshot: each test starts without any.
    monkeypatch.setattr(requestlog, "_prices", pricing.PriceBook())


LOCAL = ProviderSpec(
    name="loc",
    adapter="openai-chat",
    base_url="http://127.0.0.1:8000/v1",
    models=MappingProxyType(
        {"q": ModelSpec(id="q", price=ModelPrice(input=2, output=8, cached_input=0.5))}
    ),
)
SNAPSHOT = ConfigSnapshot(
    version=7, providers=MappingProxyType({"loc": LOCAL}), combos=MappingProxyType({})
)


def entries(now: float) -> list[requestlog.RequestEntry]:
    def one(request_id: str, target: str) -> requestlog.RequestEntry:
        return requestlog.RequestEntry(
            request_id=request_id,
            at=now,
            user="ann",
            target=target,
            status=200,
            outcome="ok",
            input_tokens=1000,
            cached_tokens=400,
            output_tokens=100,
            reasoning_tokens=40,
        )

    return [one("r-priced", "loc/q"), one("r-unpriced", "loc/other"), one("r-refused", "")]


def test_the_writer_prices_the_log_rows_and_the_rollups() -> None:
    requestlog.write_entries(entries(time.time() - 5), snapshot=lambda: SNAPSHOT)
    want = (600 * 2 + 400 * 0.5 + 100 * 8) / 1e6
    rows = {r.request_id: r for r in RequestLog.objects.all()}
    assert (rows["r-priced"].cost_usd, rows["r-priced"].api_value_usd) == (
        pytest.approx(want),
        pytest.approx(want),
    )
    assert (rows["r-unpriced"].cost_usd, rows["r-unpriced"].api_value_usd) == (None, None)
    assert (rows["r-refused"].cost_usd, rows["r-refused"].api_value_usd) == (None, None)
    totals: dict[str, Any] = {"cost_usd": 0.0, "api_value_usd": 0.0, "unpriced_requests": 0}
    for row in UsageRollup.objects.all():
        for name in totals:
            totals[name] += getattr(row, name)
    assert totals == {
        "cost_usd": pytest.approx(want),
        "api_value_usd": pytest.approx(want),
        "unpriced_requests": 1,
    }


def test_a_pricing_fault_writes_the_batch_without_a_cost(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("price data broken")

    monkeypatch.setattr(pricing, "target_rates", broken)
    requestlog.write_entries(entries(time.time() - 5), snapshot=lambda: SNAPSHOT)
    assert RequestLog.objects.count() == 3
    assert not RequestLog.objects.filter(cost_usd__isnull=False).exists()
    assert sum(r.requests for r in UsageRollup.objects.all()) == 3
    faults = [r for r in caplog.records if "pricing loc/q failed" in r.getMessage()]
    assert len(faults) == 1  # once per batch, not per request


def test_the_request_page_and_the_rollup_list_show_the_cost(admin_client: Any) -> None:
    requestlog.write_entries(entries(time.time() - 5), snapshot=lambda: SNAPSHOT)
    priced = RequestLog.objects.get(request_id="r-priced")
    page = admin_client.get(f"/admin/usage/requestlog/{priced.pk}/change/").content.decode()
    assert "$0.002200" in page
    unpriced = RequestLog.objects.get(request_id="r-unpriced")
    page = admin_client.get(f"/admin/usage/requestlog/{unpriced.pk}/change/").content.decode()
    assert "— (no price or no usage reported)" in page
    listing = admin_client.get("/admin/usage/usagerollup/rollups/").content.decode()
    assert "column-cost" in listing and "column-unpriced_requests" in listing


def test_reasoning_is_billed_once_as_the_output_it_is_part_of() -> None:
    """Upstreams report reasoning inside the output count (providers.wire.usage): a request
    with 100 output tokens of which 60 reasoning costs 100 output tokens, not 160."""
    entry = requestlog.RequestEntry(
        request_id="r",
        at=time.time(),
        target="loc/q",
        input_tokens=0,
        output_tokens=100,
        cached_tokens=0,
        reasoning_tokens=60,
    )
    requestlog.price_entries([entry], SNAPSHOT)
    assert (entry.cost_usd, entry.unpriced) == (pytest.approx(100 * 8 / 1e6), False)
