"""`apiKeyEnv` cannot name the server's own configuration (issue #26, point 4).

One check (`routing.envpolicy`, applied in `validate_providers._validate_provider`) serves the API,
the admin, the CLI and config files; a stored provider that breaks it is not used (its variable
is never read, its target has no credential) and `ocx doctor` reports it as a failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import Client

from combos.selectors import config_snapshot, credential_for
from providers.errors import ConfigError
from providers.models import Provider
from routing import envpolicy
from routing.eligibility import credential_problem
from routing.envpolicy import EnvPolicy
from routing.types import ProviderSpec
from server import doctor

TOKEN = "test-admin-token-for-env-policy"
BASE = {"adapter": "openai-chat", "baseUrl": "https://api.example.com/v1"}
REFUSED = "apiKeyEnv may not name the server's own configuration"


@pytest.fixture
def policy() -> Iterator[None]:
    """An operator's deny and allow lists, restored afterwards."""
    before = envpolicy.active()
    envpolicy.configure(EnvPolicy.of(deny=["AWS_SECRET_ACCESS_KEY"]))
    try:
        yield
    finally:
        envpolicy.configure(before)


@pytest.mark.parametrize(
    "name",
    [
        "DATABASE_URL",
        "REDIS_URL",
        "OCX_SECRET_KEY",
        "OCX_ADMIN_TOKEN",
        "ocx_secret_key",
        "DJANGO_SETTINGS_MODULE",
        "AWS_SECRET_ACCESS_KEY",
        "PGPASSWORD",  # libpq's (issue #43)
        "PGPASSFILE",
        "pghost",
    ],
)
def test_refused_names(policy: None, name: str) -> None:
    assert envpolicy.refusal(name) == REFUSED


def test_allowed_names_and_the_allow_list() -> None:
    assert envpolicy.refusal("OPENAI_API_KEY", EnvPolicy()) is None
    allow = EnvPolicy.of(allow=["PROVIDER_", "openai_"])
    assert envpolicy.refusal("PROVIDER_KEY", allow) is None
    assert envpolicy.refusal("OPENAI_API_KEY", allow) is None
    assert envpolicy.refusal("HOME", allow) == (
        "apiKeyEnv must start with one of OCX_PROVIDER_ENV_ALLOW: PROVIDER_, OPENAI_"
    )
    # The allow-list never re-opens the built-in refusals.
    assert envpolicy.refusal("OCX_SECRET_KEY", EnvPolicy.of(allow=["OCX_"])) == REFUSED


def test_settings_lists_are_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    from ocxsite.settings import env_names

    monkeypatch.setenv("OCX_PROVIDER_ENV_DENY", " A_KEY, B ")
    assert env_names("OCX_PROVIDER_ENV_DENY") == ["A_KEY", "B"]
    monkeypatch.setenv("OCX_PROVIDER_ENV_DENY", "")
    assert env_names("OCX_PROVIDER_ENV_DENY") == []
    for bad in ("A,,B", "A-B", "1X"):
        monkeypatch.setenv("OCX_PROVIDER_ENV_DENY", bad)
        with pytest.raises(ImproperlyConfigured, match="OCX_PROVIDER_ENV_DENY"):
            env_names("OCX_PROVIDER_ENV_DENY")


# ---------------------------------------------------------------------------------------------
# Every write path


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["DATABASE_URL", "OCX_SECRET_KEY", "AWS_SECRET_ACCESS_KEY"])
def test_api_refuses(policy: None, settings: Any, client: Client, name: str) -> None:
    settings.OCX_ADMIN_TOKEN = TOKEN
    r = client.put(
        "/api/providers",
        data=json.dumps({"name": "p", "provider": {**BASE, "apiKeyEnv": name}}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {TOKEN}",
    )
    assert r.status_code == 400, r.content
    assert REFUSED in r.content.decode()
    assert not Provider.objects.exists()


@pytest.mark.django_db
def test_cli_refuses() -> None:
    with pytest.raises(CommandError, match="may not name the server's own configuration"):
        call_command("provider", "add", "p", "--preset", "openai", "--api-key-env", "REDIS_URL")
    call_command("provider", "add", "p", "--preset", "openai")
    with pytest.raises(CommandError, match="may not name the server's own configuration"):
        call_command("provider", "set", "p", "--api-key-env", "DJANGO_SECRET")
    assert Provider.objects.get(name="p").api_key_env == "OPENAI_API_KEY"


@pytest.mark.django_db
def test_config_file_refuses() -> None:
    from combos import services

    doc = {"providers": {"p": {**BASE, "apiKeyEnv": "OCX_DATABASE_PASSWORD"}}}
    with pytest.raises(ConfigError, match="may not name the server's own configuration"):
        services.config_load(doc=doc)
    assert not Provider.objects.exists()


@pytest.mark.django_db
def test_admin_refuses() -> None:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    staff = Client()
    staff.force_login(user)
    data = {
        "name": "p",
        "adapter": "openai-responses",
        "base_url": "https://api.example.com/v1",
        "api_key_env": "DATABASE_URL",
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
    r = staff.post("/admin/providers/provider/add/", data)
    assert r.status_code == 200
    assert "may not name the server&#x27;s own configuration" in r.content.decode()
    assert not Provider.objects.exists()


# ---------------------------------------------------------------------------------------------
# A stored provider that breaks the rule


def test_refused_variable_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OCX_SECRET_KEY", "x" * 40)
    spec = ProviderSpec(
        name="p", adapter="openai-chat", base_url="https://e", api_key_env="OCX_SECRET_KEY"
    )
    assert credential_for(spec) is None
    problem = credential_problem(spec, None, caller_token=False)
    assert problem == "apiKeyEnv refused by the server's policy (see ocx doctor)"
    assert "OCX_SECRET_KEY" not in problem
    allowed = ProviderSpec(
        name="q", adapter="openai-chat", base_url="https://e", api_key_env="MY_KEY"
    )
    monkeypatch.setenv("MY_KEY", "k" * 20)
    assert credential_for(allowed) == "k" * 20


@pytest.mark.django_db
def test_doctor_fails_a_stored_provider_that_breaks_the_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Stored before the rule existed (or edited in the database): bypasses validation.
    p = Provider.objects.create(
        name="bad", adapter="openai-chat", base_url="https://e", api_key_env="DATABASE_URL"
    )
    p.models.create(model_id="m", context_window=1000)
    checks = {c.name: c for c in doctor.check_providers(config_snapshot())}
    check = checks["provider bad"]
    assert check.verdict == doctor.FAIL
    assert check.detail == f"$DATABASE_URL is refused and not used: {REFUSED}"
