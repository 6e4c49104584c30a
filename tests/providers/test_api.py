"""`/api/providers` (PRODUCT.md §4.2, §9.2): write-only secrets, validation, the combo guard."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from combos import selectors
from providers.models import ConfigState, Provider
from providers.sealing import unseal
from routing import validate

pytestmark = pytest.mark.django_db

TOKEN = "test-admin-token-for-providers-api"
URL = "/api/providers"
SECRET = "sk-test-0123456789abcdefSECRETVALUE"
BASE = {"adapter": "openai-chat", "baseUrl": "https://api.example.com/v1"}


def version() -> int:
    state = ConfigState.objects.filter(pk=1).first()
    return 0 if state is None else state.version


class Api:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

    def get(self, path: str = URL) -> Any:
        return self.client.get(path, **self.auth)

    def put(self, body: object) -> Any:
        return self.client.put(
            URL, data=json.dumps(body), content_type="application/json", **self.auth
        )

    def put_ok(self, name: str, provider: dict[str, Any]) -> dict[str, Any]:
        r = self.put({"name": name, "provider": provider})
        assert r.status_code == 200, r.content
        return r.json()

    def delete(self, query: str) -> Any:
        return self.client.delete(URL + query, **self.auth)

    def put_combo(self, combo_id: str, combo: dict[str, Any]) -> None:
        r = self.client.put(
            "/api/combos",
            data=json.dumps({"id": combo_id, "combo": combo}),
            content_type="application/json",
            **self.auth,
        )
        assert r.status_code == 200, r.content


@pytest.fixture
def api(settings: Any, client: Client) -> Api:
    settings.OCX_ADMIN_TOKEN = TOKEN
    return Api(client)


def assert_rejected(api: Api, body: object, status: int, message: str) -> None:
    before = selectors.config_dump()
    keys = {p.name: p.api_key_sealed for p in Provider.objects.all()}
    v = version()
    r = api.put(body)
    assert r.status_code == status, r.content
    assert r.json() == {"error": message}
    assert selectors.config_dump() == before
    assert {p.name: p.api_key_sealed for p in Provider.objects.all()} == keys
    assert version() == v


def test_requires_auth(settings: Any, client: Client) -> None:
    settings.OCX_ADMIN_TOKEN = TOKEN
    assert client.get(URL).status_code == 401
    r = client.put(
        URL,
        data=json.dumps({"name": "p", "provider": BASE}),
        content_type="application/json",
        HTTP_AUTHORIZATION="Bearer not-the-token-at-all",
    )
    assert r.status_code == 401
    assert not Provider.objects.exists()


def test_put_get_list(api: Api) -> None:
    v = version()
    body = api.put_ok("p", {**BASE, "baseUrl": "https://api.example.com/v1/"})
    assert body == {
        "success": True,
        "name": "p",
        "provider": {
            "name": "p",
            "adapter": "openai-chat",
            "baseUrl": "https://api.example.com/v1",
            "apiKeySet": False,
        },
    }
    assert version() == v + 1
    assert api.get().json() == {"providers": [body["provider"]]}
    assert api.get(URL + "/p").json() == {"provider": body["provider"]}
    r = api.get(URL + "/nope")
    assert r.status_code == 404
    assert r.json() == {"error": "unknown provider"}


def test_put_full_provider_round_trip(api: Api) -> None:
    raw = {
        **BASE,
        "apiKeyEnv": "EXAMPLE_API_KEY",
        "headers": {"X-Team": "core"},
        "disabled": True,
        "timeouts": {"connectMs": 1000, "firstByteMs": 20000},
        "maxConnections": 2000,
        "models": {
            "m1": {
                "contextWindow": 128000,
                "inputModalities": ["text", "image"],
                "reasoningEfforts": [],
            }
        },
    }
    body = api.put_ok("full", raw)
    expected = {
        "adapter": "openai-chat",
        "baseUrl": "https://api.example.com/v1",
        "apiKeyEnv": "EXAMPLE_API_KEY",
        "headers": {"X-Team": "core"},
        "disabled": True,
        "timeouts": {"connectMs": 1000},
        "maxConnections": 2000,
        "models": {
            "m1": {
                "contextWindow": 128000,
                "inputModalities": ["text", "image"],
                "reasoningEfforts": [],
            }
        },
    }
    assert body["provider"] == {"name": "full", **expected, "apiKeySet": False}
    assert selectors.config_dump()["providers"] == {"full": expected}


def test_secret_is_write_only(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    r = api.put({"name": "p", "provider": {**BASE, "apiKey": SECRET}})
    assert r.status_code == 200
    assert SECRET not in r.content.decode()
    assert r.json()["provider"]["apiKeySet"] is True
    assert "apiKey" not in r.json()["provider"]
    for path in (URL, URL + "/p"):
        text = api.get(path).content.decode()
        assert SECRET not in text
        assert "sk-test" not in text
    assert api.get(URL + "/p").json()["provider"]["apiKeySet"] is True
    dump = json.dumps(selectors.config_dump())
    assert SECRET not in dump
    assert "apiKey" not in dump
    call_command("config", "dump")
    out = capsys.readouterr().out
    assert SECRET not in out
    assert '"p"' in out
    call_command("provider", "show", "p")
    out = capsys.readouterr().out
    assert SECRET not in out
    assert json.loads(out)["apiKeySet"] is True
    # Stored encrypted, not in clear.
    stored = Provider.objects.get(name="p")
    assert SECRET not in stored.api_key_sealed
    assert unseal(stored.api_key_sealed) == SECRET


def test_omitted_api_key_keeps_stored_key(api: Api) -> None:
    api.put_ok("p", {**BASE, "apiKey": SECRET})
    body = api.put_ok("p", {**BASE, "headers": {"x-team": "a"}})
    assert body["provider"]["apiKeySet"] is True
    assert unseal(Provider.objects.get(name="p").api_key_sealed) == SECRET
    # A new key replaces it; an explicit null removes it.
    api.put_ok("p", {**BASE, "apiKey": "sk-test-second"})
    assert unseal(Provider.objects.get(name="p").api_key_sealed) == "sk-test-second"
    body = api.put_ok("p", {**BASE, "apiKey": None})
    assert body["provider"]["apiKeySet"] is False
    assert Provider.objects.get(name="p").api_key_sealed == ""


@pytest.mark.parametrize(
    ("name", "provider", "message"),
    [
        ("p", {**BASE, "adapter": "grpc"}, validate.MSG_ADAPTER),
        ("p", {"baseUrl": BASE["baseUrl"]}, validate.MSG_ADAPTER),
        ("p", {**BASE, "baseUrl": "ftp://example.com"}, "baseUrl must be an http(s) URL"),
        ("p", {**BASE, "baseUrl": "file:///etc/passwd"}, "baseUrl must be an http(s) URL"),
        ("p", {"adapter": "openai-chat"}, "baseUrl must be an http(s) URL"),
        (
            "p",
            {**BASE, "apiKeyEnv": "1BAD-NAME"},
            "apiKeyEnv must be a valid environment variable name",
        ),
        (
            "p",
            {**BASE, "apiKeyEnv": "A B"},
            "apiKeyEnv must be a valid environment variable name",
        ),
        (
            "p",
            {**BASE, "apiKey": ""},
            "apiKey must be a non-empty string without control characters",
        ),
        (
            "p",
            {**BASE, "headers": {"X-Evil": "a\r\nInjected: 1"}},
            'headers["X-Evil"] must be a string without CR, LF or NUL',
        ),
        (
            "p",
            {**BASE, "headers": {"Authorization": "Bearer x"}},
            'headers must not set "Authorization"; credentials and transport headers are '
            "managed by ocx",
        ),
        (
            "p",
            {**BASE, "headers": {"x-api-key": "x"}},
            'headers must not set "x-api-key"; credentials and transport headers are '
            "managed by ocx",
        ),
        (
            "p",
            {**BASE, "headers": {"Bad Name": "x"}},
            'header name "Bad Name" is not a valid HTTP header name',
        ),
        ("p", {**BASE, "headers": ["x"]}, "headers must be an object of string values"),
        ("p", {**BASE, "disabled": "yes"}, "disabled must be a boolean"),
        ("p", {**BASE, "maxConnections": 0}, validate.MSG_MAX_CONNECTIONS),
        ("p", {**BASE, "maxConnections": "2000"}, validate.MSG_MAX_CONNECTIONS),
        ("p", {**BASE, "extra": 1}, 'unknown field "extra"'),
        (
            "p",
            {**BASE, "apiKey": "sk-test-abc\r\nX-Injected: 1"},
            "apiKey must be a non-empty string without control characters",
        ),
        (
            "p",
            {**BASE, "apiKey": 123},
            "apiKey must be a non-empty string without control characters",
        ),
        ("-bad", BASE, validate.MSG_PROVIDER_NAME),
        ("p", None, "provider must be an object"),
        ("p", [BASE], "provider must be an object"),
    ],
)
def test_validation_errors(api: Api, name: str, provider: object, message: str) -> None:
    api.put_ok("p", {**BASE, "apiKey": SECRET})
    assert_rejected(api, {"name": name, "provider": provider}, 400, message)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"provider": BASE}, "name is required and must be a string"),
        ({"name": "  ", "provider": BASE}, "name is required and must be a string"),
        ({"name": 3, "provider": BASE}, "name is required and must be a string"),
        ({"name": "p", "provider": BASE, "x": 1}, 'unknown field "x"'),
        ([], "request body must be an object"),
    ],
)
def test_body_errors(api: Api, body: object, message: str) -> None:
    assert_rejected(api, body, 400, message)


def test_invalid_json(api: Api) -> None:
    r = api.client.put(URL, data="{", content_type="application/json", **api.auth)
    assert r.status_code == 400
    assert r.json() == {"error": "invalid JSON body"}
    assert not Provider.objects.exists()


def test_reserved_name_combo_while_combos_exist(api: Api) -> None:
    # Allowed while there are no combos (legacy physical provider named "combo").
    api.put_ok("combo", BASE)
    api.delete("?name=combo")
    api.put_ok("a", BASE)
    api.put_combo("c1", {"targets": [{"provider": "a", "model": "m"}]})
    assert_rejected(
        api,
        {"name": "combo", "provider": BASE},
        400,
        'provider name "combo" collides with the reserved "combo/" namespace while combos are '
        "configured",
    )


def test_name_collides_with_combo_id(api: Api) -> None:
    api.put_ok("a", BASE)
    api.put_combo("c1", {"targets": [{"provider": "a", "model": "m"}]})
    assert_rejected(
        api,
        {"name": "c1", "provider": BASE},
        400,
        'combo id "c1" collides with configured provider name "c1"',
    )


def test_delete_guard_and_success(api: Api) -> None:
    api.put_ok("a", BASE)
    api.put_ok("b", BASE)
    api.put_combo("zz", {"targets": [{"provider": "a", "model": "m"}]})
    api.put_combo(
        "aa", {"targets": [{"provider": "b", "model": "m"}, {"provider": "a", "model": "n"}]}
    )
    api.put_combo("mm", {"targets": [{"provider": "b", "model": "m"}]})
    before = selectors.config_dump()
    v = version()
    r = api.delete("?name=a")
    assert r.status_code == 409
    assert r.json()["combos"] == ["aa", "zz"]
    assert isinstance(r.json()["error"], str) and r.json()["error"]
    assert selectors.config_dump() == before
    assert version() == v
    for cid in ("aa", "zz"):
        assert api.client.delete(f"/api/combos?id={cid}", **api.auth).status_code == 200
    v = version()
    r = api.delete("?name=a")
    assert r.status_code == 200
    assert r.json() == {"success": True, "name": "a"}
    assert version() == v + 1
    assert sorted(selectors.config_dump()["providers"]) == ["b"]


def test_delete_errors(api: Api) -> None:
    r = api.delete("")
    assert r.status_code == 400
    assert r.json() == {"error": "name query param is required"}
    r = api.delete("?name=ghost")
    assert r.status_code == 404
    assert r.json() == {"error": "unknown provider"}


def test_disabling_a_used_provider_is_allowed(api: Api) -> None:
    api.put_ok("a", BASE)
    api.put_combo("c1", {"targets": [{"provider": "a", "model": "m"}]})
    body = api.put_ok("a", {**BASE, "disabled": True})
    assert body["provider"]["disabled"] is True
    assert sorted(selectors.config_dump()["combos"]) == ["c1"]  # type: ignore[arg-type]
    # ...but a new or replaced combo needs an enabled target.
    r = api.client.put(
        "/api/combos",
        data=json.dumps({"id": "c1", "combo": {"targets": [{"provider": "a", "model": "n"}]}}),
        content_type="application/json",
        **api.auth,
    )
    assert r.status_code == 400
    assert r.json() == {"error": "targets must include at least one enabled provider"}


def test_error_bodies_never_echo_the_secret(api: Api) -> None:
    r = api.put({"name": "p", "provider": {**BASE, "apiKey": SECRET, "adapter": "bad"}})
    assert r.status_code == 400
    assert SECRET not in r.content.decode()
    assert not Provider.objects.exists()


# --- a stored key never follows a new address (issue 44) -------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"baseUrl": "https://evil.example.net/v1"}, "baseUrl"),
        ({"adapter": "openai-responses"}, "adapter"),
    ],
)
def test_a_new_address_without_the_key_is_refused(
    api: Api, change: dict[str, Any], field: str
) -> None:
    api.put_ok("p", {**BASE, "apiKey": SECRET})
    r = api.put({"name": "p", "provider": {**BASE, **change}})
    assert r.status_code == 400
    body = r.json()
    assert body["field"] == "apiKey"
    assert body["error"].startswith(f"apiKey: {field} of provider p changes")
    assert SECRET not in r.content.decode()
    stored = Provider.objects.get(name="p")
    assert (stored.base_url, stored.adapter) == (BASE["baseUrl"], BASE["adapter"])
    assert unseal(stored.api_key_sealed) == SECRET


def test_a_new_address_with_the_key_again(api: Api) -> None:
    api.put_ok("p", {**BASE, "apiKey": SECRET})
    moved = {**BASE, "baseUrl": "https://other.example.com/v1"}
    body = api.put_ok("p", {**moved, "apiKey": "sk-test-second"})
    assert body["provider"]["baseUrl"] == "https://other.example.com/v1"
    assert unseal(Provider.objects.get(name="p").api_key_sealed) == "sk-test-second"
    # Given a key variable instead, the sealed key stays behind (never sent to the new URL).
    body = api.put_ok("p", {**BASE, "apiKeyEnv": "TEAM_OTHER_KEY"})
    stored = Provider.objects.get(name="p")
    assert stored.api_key_sealed == "" and stored.api_key_env == "TEAM_OTHER_KEY"
    # A provider with no key at all moves freely.
    api.put_ok("q", BASE)
    api.put_ok("q", moved)
