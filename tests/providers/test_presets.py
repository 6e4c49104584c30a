"""Provider presets (issue 14 item 2): `ocx provider add --preset`, `"preset"` in
`PUT /api/providers`, the admin's add form, and catalog errors that name what is missing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from combos import selectors
from ocxsite.cli import main
from providers import presets
from providers import services as provider_services
from providers.models import Provider
from routing.catalog import validate_catalog

pytestmark = pytest.mark.django_db

TOKEN = "test-admin-token-for-presets-api"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def stored(name: str) -> dict[str, Any]:
    from providers import selectors as provider_selectors

    provider = Provider.objects.prefetch_related("models").get(name=name)
    return dict(provider_selectors.provider_stored_raw(provider))


def test_every_preset_is_a_valid_provider_with_complete_model_metadata() -> None:
    assert set(presets.NAMES) == {"openai", "anthropic", "chatgpt", "openrouter", "ollama", "vllm"}
    for name in presets.NAMES:
        provider_services.provider_set(name=f"p-{name}", raw={"preset": name})
        raw = presets.preset_provider(name)
        for spec in raw.get("models", {}).values():
            assert spec["contextWindow"] > 0
            assert spec["inputModalities"] and spec["displayName"]
            assert isinstance(spec["reasoningEfforts"], list)
    assert stored("p-anthropic")["baseUrl"] == "https://api.anthropic.com/v1"
    assert stored("p-chatgpt")["baseUrl"] == "https://chatgpt.com/backend-api/codex"
    assert "apiKeyEnv" not in stored("p-chatgpt")
    assert stored("p-openrouter")["apiKeyEnv"] == "OPENROUTER_API_KEY"
    assert "2026-12-01" in (presets.__doc__ or "") and presets.CHECKED == "2026-12-01"


def test_cli_add_from_preset_then_combo_gives_a_valid_catalog(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-set-in-env-000000")
    code, out, err = run(capsys, "provider", "add", "openai", "--preset", "openai")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "Added provider openai from preset openai: openai-responses https://api.openai.com/v1; "
        "models: gpt-5.5, gpt-5.6-sol, gpt-5.6-terra.",
        "Its key is read from $OPENAI_API_KEY by `ocx serve` at each request.",
    ]
    code, out, err = run(
        capsys, "provider", "add", "claude", "--preset", "anthropic", "--api-key-env", "TEAM_KEY"
    )
    assert code == 0 and "$TEAM_KEY (not set in this shell)" in out
    raw = stored("claude")
    assert raw["apiKeyEnv"] == "TEAM_KEY"
    assert raw["headers"] == {"anthropic-version": "2023-06-01"}
    assert raw["models"]["claude-sonnet-4-5"]["contextWindow"] == 200000
    assert (
        run(capsys, "combo", "set", "team", "--targets", "claude/claude-sonnet-4-5,openai/gpt-5.5")[
            0
        ]
        == 0
    )
    code, table, err = run(capsys, "catalog", "show")
    assert (code, err) == (0, "")
    lines = table.splitlines()
    assert lines[0].split() == ["MODEL", "NAME", "CONTEXT", "INPUT", "EFFORTS"]
    team = next(line for line in lines if line.startswith("combo/team "))
    assert "200,000" in team and "low,medium,high" in team
    code, out, err = run(capsys, "catalog", "show", "--json")
    assert (code, err) == (0, "")
    assert validate_catalog(out) == []
    rows = {row["slug"]: row for row in json.loads(out)["models"]}
    assert rows["combo/team"]["context_window"] == 200000
    assert rows["openai/gpt-5.5"]["display_name"] == "GPT-5.5"
    assert [lvl["effort"] for lvl in rows["combo/team"]["supported_reasoning_levels"]] == [
        "low",
        "medium",
        "high",
    ]


def test_cli_add_refuses_an_existing_name_and_an_unknown_preset(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(capsys, "provider", "add", "x", "--preset", "ollama")[0] == 0
    before = selectors.config_dump()
    code, out, err = run(capsys, "provider", "add", "x", "--preset", "vllm")
    assert (code, out) == (1, "")
    assert err == "ocx: provider x already exists; change it with: ocx provider set x …\n"
    code, out, err = run(capsys, "provider", "add", "y", "--preset", "nope")
    assert code == 1 and "invalid choice: 'nope'" in err
    assert selectors.config_dump() == before


def test_cli_add_local_preset_with_models(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "provider", "add", "local", "--preset", "ollama", "--model", "qwen3-coder:32768"
    )
    assert code == 0
    assert stored("local")["models"] == {"qwen3-coder": {"contextWindow": 32768}}
    assert "apiKeyEnv" not in stored("local")
    # A preset model named explicitly keeps the preset's metadata; explicit fields win.
    assert (
        run(capsys, "provider", "add", "o", "--preset", "openai", "--model", "gpt-5.5:100000")[0]
        == 0
    )
    assert stored("o")["models"] == {
        "gpt-5.5": {
            "contextWindow": 100000,
            "inputModalities": ["text", "image"],
            "reasoningEfforts": ["low", "medium", "high"],
            "displayName": "GPT-5.5",
        }
    }


def test_catalog_error_names_the_provider_without_models(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(
        capsys, "provider", "set", "openai", "--adapter", "openai-responses",
        "--base-url", "https://api.openai.com/v1", "--api-key-env", "OPENAI_API_KEY",
    )[0] == 0  # fmt: skip
    code, out, err = run(capsys, "catalog", "show")
    assert (code, out) == (1, "")
    assert "provider openai has no models" in err
    assert "--preset" in err


def test_catalog_names_each_model_and_the_fields_it_lacks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    provider_services.provider_set(
        name="bare",
        raw={"adapter": "openai-chat", "baseUrl": "http://127.0.0.1:9/v1", "models": {"m": {}}},
    )
    provider_services.provider_set(name="openai", raw={"preset": "openai"})
    run(capsys, "combo", "set", "mix", "--targets", "bare/m,openai/gpt-5.5")
    code, out, err = run(capsys, "catalog", "show")
    assert code == 0
    assert (
        'Combo "mix" is omitted from the catalog because member capabilities are incomplete: '
        "bare/m, openai/gpt-5.5. bare/m lacks contextWindow, inputModalities, reasoningEfforts."
    ) in err
    code, out, _ = run(capsys, "doctor", "--json")
    details = [c["detail"] for c in json.loads(out)["checks"] if c["name"] == "catalog"]
    assert "model bare/m lacks contextWindow, inputModalities, reasoningEfforts" in details


@pytest.fixture
def api(settings: Any, client: Client) -> Client:
    settings.OCX_ADMIN_TOKEN = TOKEN
    return client


def put(client: Client, body: object) -> Any:
    return client.put(
        "/api/providers",
        data=json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {TOKEN}",
    )


def test_api_put_with_preset_explicit_fields_win(api: Client) -> None:
    r = put(
        api,
        {
            "name": "router",
            "provider": {
                "preset": "openrouter",
                "baseUrl": "https://gw.example.com/v1",
                "headers": {"X-Team": "a"},
            },
        },
    )
    assert r.status_code == 200, r.content
    body = r.json()["provider"]
    assert body["adapter"] == "openai-chat"
    assert body["baseUrl"] == "https://gw.example.com/v1"
    assert body["apiKeyEnv"] == "OPENROUTER_API_KEY"
    assert body["headers"] == {"X-Title": "ocx", "X-Team": "a"}
    assert body["models"]["qwen/qwen3-coder-plus"]["contextWindow"] == 128000
    assert "preset" not in body
    r = put(api, {"name": "anth", "provider": {"preset": "anthropic", "apiKeyEnv": None}})
    assert r.status_code == 200 and "apiKeyEnv" not in r.json()["provider"]


def test_api_put_unknown_preset_is_a_400_that_changes_nothing(api: Client) -> None:
    before = selectors.config_dump()
    r = put(api, {"name": "x", "provider": {"preset": "acme"}})
    assert r.status_code == 400
    assert r.json()["error"].startswith('unknown preset "acme"; one of: openai, anthropic')
    r = put(api, {"name": "x", "provider": {"preset": 3}})
    assert r.status_code == 400 and r.json()["error"] == "preset must be a string"
    assert selectors.config_dump() == before


def test_admin_add_form_with_a_preset(client: Client) -> None:
    user = get_user_model().objects.create_superuser("root", "r@example.com", "pw-123456789")
    client.force_login(user)
    page = client.get("/admin/providers/provider/add/").content.decode()
    assert 'name="preset"' in page and "anthropic: Anthropic Messages API" in page
    data = {
        "preset": "anthropic",
        "name": "claude",
        "adapter": "",
        "base_url": "",
        "api_key_env": "",
        "api_key": "",
        "headers": "{}",
        "connect_ms": "5000",
        "first_byte_ms": "20000",
        "idle_ms": "60000",
        "total_ms": "600000",
        "models-TOTAL_FORMS": "0",
        "models-INITIAL_FORMS": "0",
        "models-MIN_NUM_FORMS": "0",
        "models-MAX_NUM_FORMS": "1000",
    }
    r = client.post("/admin/providers/provider/add/", data)
    assert r.status_code == 302, r.content.decode()[:3000]
    raw = stored("claude")
    assert raw["adapter"] == "anthropic"
    assert raw["baseUrl"] == "https://api.anthropic.com/v1"
    assert raw["apiKeyEnv"] == "ANTHROPIC_API_KEY"
    assert raw["headers"] == {"anthropic-version": "2023-06-01"}
    assert sorted(raw["models"]) == ["claude-opus-4-8", "claude-sonnet-4-5"]
    # Without a preset the adapter and base URL are still required.
    r = client.post("/admin/providers/provider/add/", {**data, "preset": "", "name": "other"})
    assert r.status_code == 200
    assert "This field is required (or choose a preset)." in r.content.decode()
    assert not Provider.objects.filter(name="other").exists()


def test_config_load_accepts_a_preset(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    doc = tmp_path / "ocx.json"
    doc.write_text(
        json.dumps(
            {
                "providers": {"openai": {"preset": "openai", "apiKeyEnv": "TEAM_OPENAI"}},
                "combos": {"main": {"targets": [{"provider": "openai", "model": "gpt-5.5"}]}},
            }
        )
    )
    code, out, err = run(capsys, "config", "load", str(doc))
    assert code == 0, err
    raw = stored("openai")
    assert raw["apiKeyEnv"] == "TEAM_OPENAI"
    assert raw["models"]["gpt-5.5"]["contextWindow"] == 272000
    doc.write_text(json.dumps({"providers": {"x": {"preset": "acme"}}}))
    before = selectors.config_dump()
    code, out, err = run(capsys, "config", "load", str(doc))
    assert code == 1 and 'unknown preset "acme"' in err
    assert selectors.config_dump() == before


def test_a_preset_at_a_private_base_url_keeps_the_presets_prices(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Issue 42: a company gateway in front of OpenAI still costs OpenAI's prices.
    code, _, err = run(
        capsys, "provider", "add", "gw", "--preset", "openai", "--base-url", "http://10.1.2.3/v1"
    )
    assert code == 0 and "WARNING" not in err
    assert stored("gw")["pricingProvider"] == "openai"
    # At the preset's own address nothing is added (the price list is inferred from it).
    assert run(capsys, "provider", "add", "oa", "--preset", "openai")[0] == 0
    assert "pricingProvider" not in stored("oa")
    # An explicit choice wins, null included.
    raw = presets.expand(
        {"preset": "anthropic", "baseUrl": "http://gw.internal/v1", "pricingProvider": None}
    )
    assert "pricingProvider" not in raw


def test_provider_add_says_loudly_when_its_models_have_no_price(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(
        capsys, "provider", "add", "lo", "--preset", "ollama", "--model", "qwen3-coder:32768"
    )
    assert code == 0
    assert err.startswith("WARNING: provider lo has no prices (qwen3-coder)")
    assert "ocx provider set lo --pricing-provider openai" in err
    assert '"price"' in err and "model_unpriced" in err
    code, _, err = run(capsys, "provider", "add", "vl", "--preset", "vllm")
    assert code == 0 and "(every model you add)" in err
