"""A model's own `price` and a provider's `pricingProvider` (issue 27): validated by the one
provider validation, the same through the API, `ocx config load`, the CLI and the admin; a bad
value is refused with a clear message and changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from combos import selectors
from providers.models import Provider
from routing import validate
from routing.types import ModelPrice
from tests.combos.test_config import run, version, write
from tests.providers.test_api import TOKEN, Api, assert_rejected

pytestmark = pytest.mark.django_db

BASE = {"adapter": "openai-chat", "baseUrl": "http://127.0.0.1:8000/v1"}
PRICE = {"inputPerMTok": 1.25, "cachedInputPerMTok": 0.125, "outputPerMTok": 10}


@pytest.fixture
def api(settings: Any, client: Client) -> Api:
    settings.OCX_ADMIN_TOKEN = TOKEN
    return Api(client)


def with_price(price: object) -> dict[str, Any]:
    return {**BASE, "models": {"q": {"contextWindow": 1000, "price": price}}}


def test_api_stores_price_and_pricing_provider_and_returns_them(api: Api) -> None:
    body = api.put_ok("local", {**with_price(PRICE), "pricingProvider": "openrouter"})
    assert body["provider"]["models"]["q"]["price"] == PRICE
    assert body["provider"]["pricingProvider"] == "openrouter"
    got = api.get("/api/providers/local").json()["provider"]
    assert got["models"]["q"] == {"contextWindow": 1000, "price": PRICE}
    spec = selectors.config_snapshot().providers["local"]
    assert spec.models["q"].price == ModelPrice(input=1.25, output=10, cached_input=0.125)
    assert spec.pricing_provider == "openrouter"
    # Optional cached price; a free model is 0.
    api.put_ok("local", with_price({"inputPerMTok": 0, "outputPerMTok": 0}))
    spec = selectors.config_snapshot().providers["local"]
    assert spec.models["q"].price == ModelPrice(input=0, output=0)
    # Omitted: no price, no pricingProvider (inferred).
    api.put_ok("local", BASE)
    assert "pricingProvider" not in api.get("/api/providers/local").json()["provider"]


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        (with_price([1, 2]), validate.msg_model_price("q")),
        (with_price("1.25"), validate.msg_model_price("q")),
        (
            with_price({"inputPerMTok": -1, "outputPerMTok": 1}),
            'models["q"].price.inputPerMTok must be a number >= 0 (USD per million tokens)',
        ),
        (
            with_price({"inputPerMTok": 1, "outputPerMTok": "10"}),
            'models["q"].price.outputPerMTok must be a number >= 0 (USD per million tokens)',
        ),
        (
            with_price({"inputPerMTok": True, "outputPerMTok": 1}),
            'models["q"].price.inputPerMTok must be a number >= 0 (USD per million tokens)',
        ),
        (
            with_price({"inputPerMTok": 1, "cachedInputPerMTok": -0.1, "outputPerMTok": 1}),
            'models["q"].price.cachedInputPerMTok must be a number >= 0 (USD per million tokens)',
        ),
        (
            with_price({"inputPerMTok": 1}),
            'models["q"].price.outputPerMTok is required (USD per million tokens)',
        ),
        (with_price({**PRICE, "currency": "EUR"}), 'unknown field "currency"'),
        ({**BASE, "pricingProvider": "acme-llm"}, validate.MSG_PRICING_PROVIDER),
        ({**BASE, "pricingProvider": 7}, validate.MSG_PRICING_PROVIDER),
        ({**BASE, "pricingProvider": ""}, validate.MSG_PRICING_PROVIDER),
    ],
)
def test_api_refuses_bad_prices_and_changes_nothing(
    api: Api, provider: dict[str, Any], message: str
) -> None:
    api.put_ok("local", with_price(PRICE))
    assert_rejected(api, {"name": "local", "provider": provider}, 400, message)


def test_config_load_validates_prices_and_dump_round_trips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = {
        "providers": {
            "a": {**with_price({"inputPerMTok": -1, "outputPerMTok": 1})},
            "b": {**BASE, "pricingProvider": "nobody"},
        }
    }
    code, out, err = run(capsys, "config", "load", str(write(tmp_path, bad)))
    assert code != 0 and out == "" and "nothing changed" in err
    assert "providers.a.models.q.price.inputPerMTok" in err
    assert "providers.b.pricingProvider" in err
    assert not Provider.objects.exists() and version() == 0
    good = {"providers": {"a": {**with_price(PRICE), "pricingProvider": "openai"}}}
    code, _, err = run(capsys, "config", "load", str(write(tmp_path, good)))
    assert code == 0, err
    code, out, err = run(capsys, "config", "dump")
    assert code == 0, err
    dumped = json.loads(out)["providers"]["a"]
    assert dumped["pricingProvider"] == "openai" and dumped["models"]["q"]["price"] == PRICE
    # load → dump → load is a fixed point.
    code, _, err = run(capsys, "config", "load", str(write(tmp_path, json.loads(out))))
    assert code == 0, err
    assert selectors.config_dump()["providers"]["a"] == dumped


def test_cli_pricing_provider_and_price_from_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys, "provider", "set", "gw", "--from-json", json.dumps(with_price(PRICE))
    )
    assert code == 0, err
    code, _, err = run(capsys, "provider", "set", "gw", "--pricing-provider", "openai")
    assert code == 0, err
    code, out, _ = run(capsys, "provider", "show", "gw")
    shown = json.loads(out)
    assert shown["pricingProvider"] == "openai" and shown["models"]["q"]["price"] == PRICE
    v = version()
    code, _, err = run(capsys, "provider", "set", "gw", "--pricing-provider", "acme")
    assert code != 0 and validate.MSG_PRICING_PROVIDER in err
    assert version() == v
    code, _, err = run(capsys, "provider", "set", "gw", "--pricing-provider", "-")
    assert code == 0, err
    assert Provider.objects.get(name="gw").pricing_provider == ""
    # The price stays: set only changes what it is given.
    assert Provider.objects.get(name="gw").models.get().price == PRICE


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    client = Client()
    client.force_login(user)
    return client


def _post(**overrides: str) -> dict[str, str]:
    data = {
        "name": "local",
        "adapter": "openai-chat",
        "base_url": "http://127.0.0.1:8000/v1",
        "api_key_env": "",
        "api_key": "",
        "headers": "{}",
        "connect_ms": "5000",
        "first_byte_ms": "20000",
        "idle_ms": "60000",
        "total_ms": "600000",
        "pricing_provider": "",
        "models-TOTAL_FORMS": "1",
        "models-INITIAL_FORMS": "0",
        "models-MIN_NUM_FORMS": "0",
        "models-MAX_NUM_FORMS": "1000",
        "models-0-model_id": "q",
        "models-0-context_window": "1000",
        "models-0-price_input": "1.25",
        "models-0-price_cached_input": "0.125",
        "models-0-price_output": "10",
    }
    data.update(overrides)
    return data


def test_admin_edits_a_models_price_and_the_pricing_provider(staff: Client) -> None:
    response = staff.post("/admin/providers/provider/add/", _post(pricing_provider="openai"))
    assert response.status_code == 302, response.content.decode()[:3000]
    provider = Provider.objects.get(name="local")
    assert provider.pricing_provider == "openai"
    assert provider.models.get().price == PRICE
    page = staff.get(f"/admin/providers/provider/{provider.pk}/change/").content.decode()
    assert 'name="models-0-price_output" value="10' in page
    # Emptying the price columns hands the model back to the genai-prices data.
    model = provider.models.get()
    data = _post(
        **{
            "models-INITIAL_FORMS": "1",
            "models-0-id": str(model.pk),
            "models-0-provider": str(provider.pk),
            "models-0-price_input": "",
            "models-0-price_cached_input": "",
            "models-0-price_output": "",
        }
    )
    response = staff.post(f"/admin/providers/provider/{provider.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    assert Provider.objects.get(name="local").models.get().price is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"models-0-price_input": "-1"},
            "models[&quot;q&quot;].price.inputPerMTok must be a number &gt;= 0",
        ),
        (
            {"models-0-price_output": ""},
            "models[&quot;q&quot;].price.outputPerMTok is required",
        ),
        ({"pricing_provider": "acme"}, "pricingProvider must be null or a provider id"),
    ],
)
def test_admin_refuses_bad_prices(staff: Client, overrides: dict[str, str], message: str) -> None:
    response = staff.post("/admin/providers/provider/add/", _post(**overrides))
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Provider.objects.exists()


def test_doctor_warns_about_each_model_without_a_price(capsys: pytest.CaptureFixture[str]) -> None:
    from providers import services

    services.provider_set(
        name="oa",
        raw={
            "adapter": "openai-responses",
            "baseUrl": "https://api.openai.com/v1",
            "apiKey": "sk-doctor-prices-0123456789",
            "models": {"gpt-5": {}, "mystery-x": {}},
        },
    )
    services.provider_set(name="local", raw={**with_price({"inputPerMTok": 0, "outputPerMTok": 0})})
    code, out, err = run(capsys, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["price oa/mystery-x"]["verdict"] == "warn"
    assert checks["price oa/mystery-x"]["detail"].startswith("oa/mystery-x has no price")
    # Priced by the genai-prices data, or by its own price (a free local model).
    assert "price oa/gpt-5" not in checks and "price local/q" not in checks
    assert code == 0, err  # a warning, not a failure
    services.provider_set(
        name="oa",
        raw={
            "adapter": "openai-responses",
            "baseUrl": "https://api.openai.com/v1",
            "models": {"gpt-5": {}, "mystery-x": {"price": PRICE}},
        },
    )
    code, out, err = run(capsys, "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["prices"] == {
        "name": "prices",
        "verdict": "ok",
        "detail": "every configured model has a price",
    }
