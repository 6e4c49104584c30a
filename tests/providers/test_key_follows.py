"""A provider's address and key move together (issue 44): the CLI, a config load and the admin
form refuse a new `baseUrl` or adapter without the key given again, with the same rule
(`services.key_follow_problem`) as the API (tests/providers/test_api.py)."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from combos import services as combo_services
from ocxsite import cli
from providers import services
from providers.errors import ConfigError
from providers.models import Provider
from providers.sealing import unseal

pytestmark = pytest.mark.django_db

SECRET = "sk-follow-test-abcdefghijklmnop1234"
OLD = "https://api.example.com/v1"
NEW = "https://evil.example.net/v1"


@pytest.fixture
def stored() -> Provider:
    return services.provider_set(
        name="p", raw={"adapter": "openai-chat", "baseUrl": OLD, "apiKey": SECRET}
    )


def unchanged() -> None:
    p = Provider.objects.get(name="p")
    assert (p.base_url, p.adapter, unseal(p.api_key_sealed)) == (OLD, "openai-chat", SECRET)


def ocx(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str, stdin: str = ""
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_refuses_a_new_base_url_without_the_key(
    stored: Provider, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = ocx(capsys, monkeypatch, "provider", "set", "p", "--base-url", NEW)
    assert code == 1
    assert err.startswith(f"ocx: apiKey: baseUrl of provider p changes ({OLD} -> {NEW})")
    assert "--api-key-stdin or --api-key-env" in err and SECRET not in err
    unchanged()
    code, _, err = ocx(capsys, monkeypatch, "provider", "set", "p", "--adapter", "anthropic")
    assert code == 1 and "apiKey: adapter of provider p changes" in err
    unchanged()
    code, out, _ = ocx(
        capsys, monkeypatch, "provider", "set", "p", "--base-url", NEW, "--api-key-stdin",
        stdin="sk-new-key-for-the-new-address\n",
    )  # fmt: skip
    assert (code, out) == (0, "Saved provider p.\n")
    p = Provider.objects.get(name="p")
    assert (p.base_url, unseal(p.api_key_sealed)) == (NEW, "sk-new-key-for-the-new-address")


def test_cli_other_changes_keep_the_key(
    stored: Provider, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, _ = ocx(capsys, monkeypatch, "provider", "set", "p", "--header", "x-team=a")
    assert code == 0
    unchanged()


def test_config_load_refuses_a_new_base_url_without_the_key(stored: Provider) -> None:
    doc: dict[str, Any] = {"providers": {"p": {"adapter": "openai-chat", "baseUrl": NEW}}}
    with pytest.raises(ConfigError) as caught:
        combo_services.config_load(doc=doc)
    assert caught.value.status == 400
    assert caught.value.message.startswith("apiKey: baseUrl of provider p changes")
    unchanged()
    # A preset's key variable is not the writer giving the key again.
    doc = {"providers": {"p": {"preset": "openai", "baseUrl": NEW}}}
    with pytest.raises(ConfigError):
        combo_services.config_load(doc=doc)
    unchanged()
    doc = {"providers": {"p": {"adapter": "openai-chat", "baseUrl": NEW, "apiKeyEnv": "TEAM_K"}}}
    combo_services.config_load(doc=doc)
    p = Provider.objects.get(name="p")
    assert (p.base_url, p.api_key_env, p.api_key_sealed) == (NEW, "TEAM_K", "")


def _form(**overrides: str) -> dict[str, str]:
    data = {
        "name": "p",
        "adapter": "openai-chat",
        "base_url": OLD,
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
    data.update(overrides)
    return data


def test_admin_form_refuses_a_new_base_url_without_the_key(stored: Provider) -> None:
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    staff = Client()
    staff.force_login(root)
    url = f"/admin/providers/provider/{stored.pk}/change/"
    r = staff.post(url, _form(base_url=NEW))
    assert r.status_code == 200
    page = r.content.decode()
    assert f"baseUrl of provider p changes ({OLD} -&gt; {NEW})" in page
    assert SECRET not in page
    unchanged()
    r = staff.post(url, _form(base_url=NEW, api_key_env="TEAM_K"))
    assert r.status_code == 302
    p = Provider.objects.get(name="p")
    assert (p.base_url, p.api_key_env, p.api_key_sealed) == (NEW, "TEAM_K", "")
