"""The cost of a served request (routing.pricing): library prices by pricing provider,
a model's own price winning, cached and reasoning tokens, chatgpt's API value, unpriced
targets, the per-(provider, model) cache, and no network use."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from types import MappingProxyType
from typing import Any

import pytest
from genai_prices import Usage, calc_price

from routing import pricing
from routing.types import (
    ComboSpec,
    ConfigSnapshot,
    ModelPrice,
    ModelSpec,
    ProviderSpec,
    TargetSpec,
)
from tests.conftest import ROOT

DAY = dt.date(2026, 12, 1)
AT = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC).timestamp()


def provider(
    name: str,
    adapter: str,
    base_url: str,
    models: dict[str, ModelPrice | None] | None = None,
    **extra: Any,
) -> ProviderSpec:
    specs = {m: ModelSpec(id=m, price=p) for m, p in (models or {}).items()}
    return ProviderSpec(
        name=name, adapter=adapter, base_url=base_url, models=MappingProxyType(specs), **extra
    )


def snapshot(*providers: ProviderSpec, combos: tuple[ComboSpec, ...] = ()) -> ConfigSnapshot:
    return ConfigSnapshot(
        version=1,
        providers=MappingProxyType({p.name: p for p in providers}),
        combos=MappingProxyType({c.id: c for c in combos}),
    )


OPENAI = provider("oa", "openai-responses", "https://api.openai.com/v1")


def cost(
    spec: ProviderSpec, model: str, inp: int | None, cached: int | None, out: int | None
) -> Any:
    return pricing.price(
        spec,
        model,
        input_tokens=inp,
        cached_tokens=cached,
        output_tokens=out,
        rates=pricing.target_rates(spec, model, DAY),
    )


def test_library_price_matches_genai_prices_own_calculation() -> None:
    # gpt-5 at OpenAI: $1.25 input, $0.125 cached input, $10 output per million tokens.
    got = cost(OPENAI, "gpt-5", 1_000_000, 200_000, 100_000)
    assert got == pricing.Priced(pytest.approx(2.025), pytest.approx(2.025), False)
    theirs = calc_price(
        Usage(input_tokens=1_000_000, cache_read_tokens=200_000, output_tokens=100_000),
        "gpt-5",
        provider_id="openai",
        genai_request_timestamp=dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC),
    )
    assert got.cost_usd == pytest.approx(float(theirs.total_price))
    rates = pricing.target_rates(OPENAI, "gpt-5", DAY)
    assert rates is not None and rates.source == "genai-prices openai/gpt-5"


def test_cached_tokens_are_part_of_input_and_billed_at_the_cached_rate() -> None:
    plain = cost(OPENAI, "gpt-5", 1000, 0, 0).cost_usd
    half_cached = cost(OPENAI, "gpt-5", 1000, 500, 0).cost_usd
    assert plain == pytest.approx(1000 * 1.25 / 1e6)
    assert half_cached == pytest.approx((500 * 1.25 + 500 * 0.125) / 1e6)
    # A cached count above the input (a confused upstream) never makes the cost negative.
    assert cost(OPENAI, "gpt-5", 100, 900, 0).cost_usd == pytest.approx(100 * 0.125 / 1e6)


def test_metadata_price_wins_over_the_library_and_cached_defaults_to_input() -> None:
    own = ModelPrice(input=2.0, output=8.0)
    spec = provider("oa", "openai-responses", "https://api.openai.com/v1", {"gpt-5": own})
    assert cost(spec, "gpt-5", 1000, 400, 100).cost_usd == pytest.approx(
        (600 * 2.0 + 400 * 2.0 + 100 * 8.0) / 1e6
    )
    cheap_cache = provider(
        "local",
        "openai-chat",
        "http://127.0.0.1:8000/v1",
        {"q": ModelPrice(input=1.25, cached_input=0.125, output=10)},
    )
    want = pytest.approx((600 * 1.25 + 400 * 0.125 + 100 * 10) / 1e6)
    assert cost(cheap_cache, "q", 1000, 400, 100) == pricing.Priced(want, want, False)
    # A free local model: priced at 0, not unpriced.
    free = provider("local", "openai-chat", "http://127.0.0.1:11434/v1", {"q": ModelPrice(0, 0)})
    assert cost(free, "q", 1000, 0, 100) == pricing.Priced(0.0, 0.0, False)


def test_long_prompt_tiers_price_the_whole_request() -> None:
    rates = pricing.Rates(
        pricing.Rate(5, ((272_000, 10),)),
        pricing.Rate(0.5, ((272_000, 1),)),
        pricing.Rate(30, ((272_000, 45),)),
        "test",
    )
    assert rates.cost(input_tokens=272_000, cached_tokens=0, output_tokens=0) == pytest.approx(
        272_000 * 5 / 1e6
    )
    assert rates.cost(input_tokens=272_001, cached_tokens=1, output_tokens=10) == pytest.approx(
        (272_000 * 10 + 1 * 1 + 10 * 45) / 1e6
    )


def test_chatgpt_costs_nothing_and_records_its_value_at_openai_api_prices() -> None:
    chatgpt = provider("sub", "chatgpt", "https://chatgpt.com/backend-api/codex")
    got = cost(chatgpt, "gpt-5", 1_000_000, 200_000, 100_000)
    assert got == pricing.Priced(0.0, pytest.approx(2.025), False)
    # Not in OpenAI's price list: still no cost, the value unknown, never "unpriced".
    assert cost(chatgpt, "codex-internal-x", 10, 0, 10) == pricing.Priced(0.0, None, False)


def test_unknown_price_gives_no_cost_and_counts_as_unpriced() -> None:
    ollama = provider("ol", "openai-chat", "http://127.0.0.1:11434/v1")
    assert cost(ollama, "qwen3-coder", 1000, 0, 100) == pricing.Priced(None, None, True)
    assert cost(OPENAI, "no-such-model-xyz", 1000, 0, 100) == pricing.Priced(None, None, True)
    # Without a usage report the cost is unknown, not 0, and the target is still priced.
    assert cost(OPENAI, "gpt-5", None, None, None) == pricing.Priced(None, None, False)


@pytest.mark.parametrize(
    ("adapter", "base_url", "explicit", "want"),
    [
        ("openai-responses", "https://api.openai.com/v1", None, "openai"),
        ("anthropic", "https://api.anthropic.com/v1", None, "anthropic"),
        ("openai-chat", "https://openrouter.ai/api/v1", None, "openrouter"),
        ("chatgpt", "https://chatgpt.com/backend-api/codex", None, "openai"),
        ("openai-chat", "http://127.0.0.1:11434/v1", None, None),  # ollama preset
        ("openai-chat", "http://127.0.0.1:8000/v1", None, None),  # vllm preset
        ("openai-chat", "http://gpu-box.lan:8000/v1", None, None),
        ("openai-chat", "http://vllm:8000/v1", None, None),  # a container name
        ("openai-responses", "http://10.0.0.5/v1", None, None),
        ("openai-chat", "https://llm.example.com/v1", None, None),  # could be anything
        ("openai-responses", "https://gateway.example.com/v1", None, "openai"),
        ("anthropic", "https://proxy.example.com/v1", None, "anthropic"),
        ("openai-chat", "https://x.openai.azure.com/openai", None, "azure"),
        ("openai-chat", "http://127.0.0.1:8000/v1", "openrouter", "openrouter"),  # explicit
    ],
)
def test_pricing_provider_from_adapter_and_base_url(
    adapter: str, base_url: str, explicit: str | None, want: str | None
) -> None:
    spec = provider("p", adapter, base_url, pricing_provider=explicit)
    assert pricing.pricing_provider(spec) == want


def test_explicit_pricing_provider_prices_a_local_gateway() -> None:
    gateway = provider("gw", "openai-chat", "http://127.0.0.1:4000/v1", pricing_provider="openai")
    assert cost(gateway, "gpt-5", 1000, 0, 0).cost_usd == pytest.approx(1000 * 1.25 / 1e6)


def test_price_book_looks_each_target_up_once_per_snapshot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, str]] = []
    real = pricing.target_rates

    def counted(spec: ProviderSpec, model: str, day: dt.date) -> Any:
        calls.append((spec.name, model))
        return real(spec, model, day)

    monkeypatch.setattr(pricing, "target_rates", counted)
    book = pricing.PriceBook()
    snap = snapshot(OPENAI)
    usage = {"input_tokens": 1000, "cached_tokens": 0, "output_tokens": 10}
    for _ in range(50):
        got = book.price(snap, "oa/gpt-5", at=AT, **usage)
        assert got.cost_usd == pytest.approx((1000 * 1.25 + 10 * 10) / 1e6)
    assert book.price(snap, "", at=AT, **usage) == pricing.NOT_SERVED
    assert book.price(snap, "gone/gpt-5", at=AT, **usage) == pricing.Priced(None, None, True)
    assert calls == [("oa", "gpt-5")]
    # A new config snapshot (a price changed) looks it up again.
    book.price(snapshot(OPENAI), "oa/gpt-5", at=AT, **usage)
    assert calls == [("oa", "gpt-5")] * 2


def test_unpriced_targets_lists_what_would_get_no_cost() -> None:
    local = provider(
        "ol", "openai-chat", "http://127.0.0.1:11434/v1", {"q": None, "free": ModelPrice(0, 0)}
    )
    sub = provider("sub", "chatgpt", "https://chatgpt.com/backend-api/codex", {"x-unknown": None})
    off = provider("off", "openai-chat", "http://127.0.0.1:1/v1", {"m": None}, disabled=True)
    combo = ComboSpec(id="c", targets=(TargetSpec("oa", "gpt-5"), TargetSpec("ol", "typo")))
    snap = snapshot(OPENAI, local, sub, off, combos=(combo,))
    assert pricing.unpriced_targets(snap, DAY, served=["oa/mystery-model"]) == [
        "oa/mystery-model",
        "ol/q",
        "ol/typo",
    ]
    assert "ol/q has no price" in pricing.unpriced_note("ol/q")


def test_computing_a_price_opens_no_network_connection() -> None:
    """Air-gapped: in a fresh interpreter where every socket connect and DNS lookup raises, the
    first price (which loads the genai-prices data) is computed all the same."""
    code = """
import datetime as dt, socket
from types import MappingProxyType

def refuse(*args, **kwargs):
    raise AssertionError("network use: %r" % (args,))

socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse
socket.getaddrinfo = refuse

from routing import pricing
from routing.types import ConfigSnapshot, ProviderSpec

spec = ProviderSpec(name="oa", adapter="openai-responses", base_url="https://api.openai.com/v1")
providers = MappingProxyType({"oa": spec})
snap = ConfigSnapshot(version=1, providers=providers, combos=MappingProxyType({}))
got = pricing.PriceBook().price(
    snap, "oa/gpt-5", at=dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp(),
    input_tokens=1000000, cached_tokens=0, output_tokens=0,
)
assert pricing.provider_ids() >= {"openai", "anthropic", "openrouter"}
print(got.cost_usd)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1.25"
