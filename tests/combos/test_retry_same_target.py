"""The combo field `retrySameTarget` (issue #29) through every writer: the API, the admin
editor, `ocx combo` and `ocx config load` — validated with the same messages, shown back, and
nothing changes on bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from combos import selectors
from combos.models import Combo
from providers.models import ConfigState, Provider
from providers.services import provider_set
from routing import validate
from routing.types import RetryPolicy
from tests.combos.test_admin import _combo_post, _field_errors, _providers
from tests.combos.test_cli import Run

pytestmark = pytest.mark.django_db

TOKEN = "test-admin-token-for-retry-same-target-01"
TARGETS = [{"provider": "p1", "model": "m1"}, {"provider": "p2", "model": "m2"}]


def version() -> int:
    state = ConfigState.objects.filter(pk=1).first()
    return 0 if state is None else state.version


def setup_providers() -> None:
    for name in ("p1", "p2"):
        provider_set(
            name=name, raw={"adapter": "openai-responses", "baseUrl": "http://127.0.0.1:9/v1"}
        )


# ---------------------------------------------------------------------------------------------
# The one validator


BAD = [
    ("x", "retrySameTarget", validate.MSG_RETRY),
    ([1, 2], "retrySameTarget", validate.MSG_RETRY),
    ({"maxWaitMs": 100}, "retrySameTarget.attempts", validate.MSG_RETRY_ATTEMPTS),
    ({"attempts": 0, "maxWaitMs": 100}, "retrySameTarget.attempts", validate.MSG_RETRY_ATTEMPTS),
    ({"attempts": 4, "maxWaitMs": 100}, "retrySameTarget.attempts", validate.MSG_RETRY_ATTEMPTS),
    ({"attempts": "2", "maxWaitMs": 1}, "retrySameTarget.attempts", validate.MSG_RETRY_ATTEMPTS),
    ({"attempts": True, "maxWaitMs": 1}, "retrySameTarget.attempts", validate.MSG_RETRY_ATTEMPTS),
    ({"attempts": 1}, "retrySameTarget.maxWaitMs", validate.MSG_RETRY_WAIT),
    ({"attempts": 1, "maxWaitMs": -1}, "retrySameTarget.maxWaitMs", validate.MSG_RETRY_WAIT),
    ({"attempts": 1, "maxWaitMs": 10001}, "retrySameTarget.maxWaitMs", validate.MSG_RETRY_WAIT),
    ({"attempts": 1, "maxWaitMs": 1.5}, "retrySameTarget.maxWaitMs", validate.MSG_RETRY_WAIT),
    (
        {"attempts": 1, "maxWaitMs": 1, "jitter": 1},
        "retrySameTarget.jitter",
        'unknown field "jitter"',
    ),
]


def test_messages_are_exact() -> None:
    assert validate.MSG_RETRY == (
        'retrySameTarget must be null or {"attempts": 1-3, "maxWaitMs": 0-10000}'
    )
    assert validate.MSG_RETRY_ATTEMPTS == "retrySameTarget.attempts must be an integer from 1 to 3"
    assert validate.MSG_RETRY_WAIT == (
        "retrySameTarget.maxWaitMs must be an integer from 0 to 10000"
    )


@pytest.mark.parametrize(("value", "path", "message"), BAD)
def test_validator_rejects(value: object, path: str, message: str) -> None:
    issues = validate.validate_combo(
        "c",
        {"targets": [{"provider": "p", "model": "m"}], "retrySameTarget": value},
        providers={"p": validate.ProviderInfo(name="p")},
        combos={},
    )
    assert [(".".join(map(str, i.path)), i.message) for i in issues] == [(path, message)]


@pytest.mark.parametrize(
    ("value", "policy"),
    [
        (None, None),
        ({"attempts": 1, "maxWaitMs": 0}, RetryPolicy(1, 0)),
        ({"attempts": 3, "maxWaitMs": 10000}, RetryPolicy(3, 10000)),
        ({"attempts": 2.0, "maxWaitMs": 2000}, RetryPolicy(2, 2000)),
    ],
)
def test_validator_accepts_and_normalizes(value: object, policy: RetryPolicy | None) -> None:
    raw = {"targets": [{"provider": "p", "model": "m"}], "retrySameTarget": value}
    providers = {"p": validate.ProviderInfo(name="p")}
    assert validate.validate_combo("c", raw, providers=providers, combos={}) == []
    spec = validate.normalize_combo("c", raw)
    assert spec.retry_same_target == policy
    sparse = validate.combo_to_sparse(spec)
    if policy is None:
        assert "retrySameTarget" not in sparse
    else:
        assert sparse["retrySameTarget"] == {
            "attempts": policy.attempts,
            "maxWaitMs": policy.max_wait_ms,
        }


# ---------------------------------------------------------------------------------------------
# API


@pytest.fixture
def api(settings: Any, client: Client) -> Any:
    settings.OCX_ADMIN_TOKEN = TOKEN
    setup_providers()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

    class Api:
        def put(self, combo: dict[str, Any]) -> Any:
            body = json.dumps({"id": "main", "combo": combo})
            return client.put("/api/combos", body, content_type="application/json", **auth)

        def get(self) -> Any:
            return client.get("/api/combos/main", **auth)

    return Api()


def test_api_sets_shows_preserves_and_clears(api: Any) -> None:
    retry = {"attempts": 2, "maxWaitMs": 2000}
    r = api.put({"targets": TARGETS, "retrySameTarget": retry})
    assert r.status_code == 200, r.content
    assert r.json()["combo"]["retrySameTarget"] == retry
    assert api.get().json()["combo"]["retrySameTarget"] == retry
    # Omitted on a later PUT: kept (preserve-on-omit, like cooldownMs).
    assert api.put({"targets": TARGETS}).status_code == 200
    assert api.get().json()["combo"]["retrySameTarget"] == retry
    # GET output PUT back unchanged is accepted.
    again = api.get().json()["combo"]
    assert api.put(again).status_code == 200
    # null turns it off; the sparse output then omits it.
    r = api.put({"targets": TARGETS, "retrySameTarget": None})
    assert r.status_code == 200
    assert "retrySameTarget" not in api.get().json()["combo"]
    assert selectors.combo_get("main").retry_same_target is None  # type: ignore[union-attr]


@pytest.mark.parametrize(("value", "path", "message"), BAD)
def test_api_rejects_with_the_exact_message_and_changes_nothing(
    api: Any, value: object, path: str, message: str
) -> None:
    assert api.put({"targets": TARGETS}).status_code == 200
    before, v = selectors.config_dump(), version()
    r = api.put({"targets": TARGETS, "retrySameTarget": value})
    assert r.status_code == 400
    assert r.json() == {"error": message}
    assert selectors.config_dump() == before and version() == v


# ---------------------------------------------------------------------------------------------
# CLI


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    setup_providers()
    return Run(capsys)


def test_cli_set_show_keep_and_clear(run: Run) -> None:
    run.ok("combo", "set", "main", "--targets", "p1/m1,p2/m2", "--retry-same-target", "2/2000")
    assert selectors.combo_get("main").retry_same_target == RetryPolicy(2, 2000)  # type: ignore[union-attr]
    out = run.ok("combo", "show", "main")
    assert "  retry same target: up to 2 time(s), waiting at most 2000 ms" in out.splitlines()
    shown = json.loads(run.ok("combo", "show", "main", "--json"))
    assert shown["retrySameTarget"] == {"attempts": 2, "maxWaitMs": 2000}
    # Flag left out: the stored policy stays.
    run.ok("combo", "set", "main", "--targets", "p1/m1,p2/m2", "--strategy", "random")
    assert selectors.combo_get("main").retry_same_target == RetryPolicy(2, 2000)  # type: ignore[union-attr]
    run.ok("combo", "set", "main", "--targets", "p1/m1,p2/m2", "--retry-same-target", "-")
    assert selectors.combo_get("main").retry_same_target is None  # type: ignore[union-attr]
    assert "  retry same target: off" in run.ok("combo", "show", "main").splitlines()


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("2", "--retry-same-target must be ATTEMPTS/MAX_WAIT_MS (e.g. 2/2000) or - (off)"),
        ("a/b", "--retry-same-target must be ATTEMPTS/MAX_WAIT_MS (e.g. 2/2000) or - (off)"),
        ("-1/100", "--retry-same-target must be ATTEMPTS/MAX_WAIT_MS (e.g. 2/2000) or - (off)"),
        ("4/100", validate.MSG_RETRY_ATTEMPTS),
        ("0/100", validate.MSG_RETRY_ATTEMPTS),
        ("1/10001", validate.MSG_RETRY_WAIT),
    ],
)
def test_cli_rejects(run: Run, flag: str, message: str) -> None:
    run.ok("combo", "set", "main", "--targets", "p1/m1")
    argv = ("combo", "set", "main", "--targets", "p1/m1", f"--retry-same-target={flag}")
    assert run.fail(*argv) == message


# ---------------------------------------------------------------------------------------------
# Config files


def test_config_load_and_dump(tmp_path: Path, run: Run) -> None:
    doc = {
        "providers": selectors.config_dump()["providers"],
        "combos": {
            "main": {"targets": TARGETS, "retrySameTarget": {"attempts": 3, "maxWaitMs": 0}}
        },
    }
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    run.ok("config", "load", str(path))
    assert selectors.combo_get("main").retry_same_target == RetryPolicy(3, 0)  # type: ignore[union-attr]
    dumped = json.loads(run.ok("config", "dump"))
    assert dumped["combos"]["main"]["retrySameTarget"] == {"attempts": 3, "maxWaitMs": 0}


def test_config_load_rejects_and_changes_nothing(tmp_path: Path, run: Run) -> None:
    doc = {"combos": {"main": {"targets": TARGETS, "retrySameTarget": {"attempts": 9}}}}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    before, v = selectors.config_dump(), version()
    code, out, err = run("config", "load", str(path))
    assert code != 0 and out == ""
    assert f"combos.main.retrySameTarget.attempts: {validate.MSG_RETRY_ATTEMPTS}" in err
    assert f"combos.main.retrySameTarget.maxWaitMs: {validate.MSG_RETRY_WAIT}" in err
    assert selectors.config_dump() == before and version() == v


# ---------------------------------------------------------------------------------------------
# Admin editor


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-123456789")
    client = Client()
    client.force_login(user)
    return client


def test_admin_shows_the_fields_with_help(staff: Client) -> None:
    _providers()
    html = staff.get("/admin/combos/combo/add/").content.decode()
    assert 'name="retry_attempts"' in html and 'name="retry_max_wait_ms"' in html
    assert "Retry the same target before hopping" in html
    assert "a longer Retry-After hops at once" in html


def test_admin_saves_the_policy(staff: Client) -> None:
    p1, p2 = _providers()
    data = _combo_post(p1, p2, retry_attempts="2", retry_max_wait_ms="1500")
    response = staff.post("/admin/combos/combo/add/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert selectors.combo_get("main").retry_same_target == RetryPolicy(2, 1500)  # type: ignore[union-attr]
    combo = Combo.objects.get(combo_id="main")
    html = staff.get(f"/admin/combos/combo/{combo.pk}/change/").content.decode()
    assert 'name="retry_attempts" value="2"' in html


@pytest.mark.parametrize(
    ("fields", "css", "text"),
    [
        (
            {"retry_attempts": "4", "retry_max_wait_ms": "100"},
            "field-retry_attempts",
            "Retry attempts must be an integer from 1 to 3",
        ),
        (
            {"retry_attempts": "2"},
            "field-retry_max_wait_ms",
            "Retry max wait ms must be an integer from 0 to 10000",
        ),
        (
            {"retry_max_wait_ms": "20000"},
            "field-retry_attempts",
            "Retry attempts must be an integer from 1 to 3",
        ),
    ],
)
def test_admin_errors_sit_next_to_their_field(
    staff: Client, fields: dict[str, str], css: str, text: str
) -> None:
    p1, p2 = _providers()
    response = staff.post("/admin/combos/combo/add/", _combo_post(p1, p2, **fields))
    assert response.status_code == 200
    assert text in _field_errors(response.content.decode(), css)
    assert not Combo.objects.exists()
    assert Provider.objects.count() == 2
