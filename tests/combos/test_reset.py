"""Clearing cooldowns (issue 28 item 4): `POST /api/combos/reset`, `ocx combo reset`, the admin's
action and "Clear" buttons, and a provider write, end to end through a real server (with Redis
in CI's second pass, in-process state in the first)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from combos import services
from combos.models import Combo
from dashboard.models import RoutingEvent
from gateway.runtime import Runtime
from providers import services as provider_services
from providers.errors import ConfigError
from routing.state import ComboState, MemoryStateStore, reset_target
from tests.conftest import Mock, Server
from tests.gateway.test_proxy_failover import ask, provider, setup_combo
from tests.ocxsite.test_security import ocx


def test_reset_target_drops_only_that_targets_entries() -> None:
    state = ComboState(
        cooldowns={"a/m": 10, "b/m": 20},
        probes={"a/m": 5},
        current_weights={"a/m": 1, "b/m": 2},
        active_key="a/m",
        successes=3,
    )
    assert reset_target(state, "a/m") == ComboState(
        cooldowns={"b/m": 20}, current_weights={"b/m": 2}
    )
    assert reset_target(state, "c/m") is state


def _first_cooled(server: Server, mock: Mock) -> tuple[str, dict[str, str]]:
    mock_model = "r" + uuid.uuid4().hex[:6]
    backup = mock_model + "b"
    combo_id, headers = setup_combo(server, mock, [("p1", mock_model), ("p2", backup)])
    mock.script(mock_model, [{"status": 503}])
    r = ask(server, combo_id, headers)
    assert r.status_code == 200 and r.headers["x-ocx-target"] == f"p2/{backup}"
    r = ask(server, combo_id, headers)  # p1 is cooling: straight to the backup
    assert r.headers["x-ocx-attempts"] == "1" and r.headers["x-ocx-target"] == f"p2/{backup}"
    return combo_id, headers


def _served_by(server: Server, combo_id: str, headers: dict[str, str], target: str) -> None:
    # Without Redis a CLI write reaches the server at its next poll (OCX_CONFIG_POLL_MS=100).
    deadline = time.monotonic() + 5
    while (r := ask(server, combo_id, headers)).headers.get("x-ocx-target") != target:
        assert time.monotonic() < deadline, r.headers
        time.sleep(0.05)


def test_api_reset_of_one_target_clears_its_cooldown_everywhere(server: Server, mock: Mock) -> None:
    combo_id, headers = _first_cooled(server, mock)
    cooled = server.api.get("/api/status", params={"combo": combo_id}).json()["combos"][0]
    first = cooled["targets"][0]["target"]
    assert cooled["targets"][0]["state"] == "cooling"

    bad = server.api.post("/api/combos/reset", json={"id": combo_id, "target": "p9/nope"})
    assert bad.status_code == 400 and "is not one of combo" in bad.json()["error"]
    assert server.api.post("/api/combos/reset", json={"id": "no-such"}).status_code == 404
    r = server.api.post("/api/combos/reset", json={"id": combo_id, "target": first})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["success"], body["id"], body["target"]) == (True, combo_id, first)
    assert [t["state"] for t in body["status"]["targets"]] == ["available", "available"]
    # The write returned once every worker applied it: the next request goes to the first.
    r = ask(server, combo_id, headers)
    assert (r.headers["x-ocx-target"], r.headers["x-ocx-attempts"]) == (first, "1")


def test_cli_reset_and_a_provider_write_clear_cooldowns(server: Server, mock: Mock) -> None:
    combo_id, headers = _first_cooled(server, mock)
    first = server.api.get("/api/status", params={"combo": combo_id}).json()["combos"][0][
        "targets"
    ][0]["target"]
    out = ocx(server, "combo", "reset", combo_id)
    assert out.startswith(
        f"Cleared the routing state (cooldowns, probes, rotation) of combo {combo_id}."
    )
    _served_by(server, combo_id, headers, first)

    # Cooled again; then the operator rewrites provider p1 (fixing it): its targets are free.
    model = first.split("/", 1)[1]
    mock.script(model, [{"status": 503}])
    assert ask(server, combo_id, headers).headers["x-ocx-target"] != first
    r = server.api.put(
        "/api/providers", json={"name": "p1", "provider": provider(mock.url + "/v1", model)}
    )
    assert r.status_code == 200, r.text
    _served_by(server, combo_id, headers, first)
    events = server.api.get("/api/status", params={"combo": combo_id}).json()["combos"][0]
    assert events["targets"][0]["state"] == "available"


pytestmark = pytest.mark.django_db


def _combo() -> None:
    for name in ("ra", "rb"):
        provider_services.provider_set(
            name=name, raw={"adapter": "openai-responses", "baseUrl": "http://127.0.0.1:9/v1"}
        )
    services.combo_set(
        combo_id="rc",
        raw={"targets": [{"provider": "ra", "model": "m"}, {"provider": "rb", "model": "m"}]},
    )


def test_runtime_drops_its_own_copy_when_the_stamp_moves() -> None:
    _combo()
    rt = Runtime()
    rt.store = MemoryStateStore()
    from combos import selectors

    rt.apply(selectors.config_snapshot(), {}, 0)
    cooled = ComboState(cooldowns={"ra/m": 10**13, "rb/m": 10**13})
    rt.store.seed("rc", cooled)
    services.combo_reset(combo_id="rc", target="ra/m", now_ms=1000)
    rt.apply(selectors.config_snapshot(), {}, 0)
    assert rt.store.peek("rc") == ComboState(cooldowns={"rb/m": 10**13})
    services.combo_reset(combo_id="rc", now_ms=2000)
    rt.apply(selectors.config_snapshot(), {}, 0)
    assert rt.store.peek("rc") == ComboState()
    # A whole reset replaces the targets' stamps; an unknown combo or target is refused.
    assert Combo.objects.get(combo_id="rc").state_resets == {"*": 2000}
    with pytest.raises(ConfigError, match="unknown combo nope"):
        services.combo_reset(combo_id="nope")


def test_admin_action_and_clear_button_record_a_routing_event(
    django_capture_on_commit_callbacks: Any,
) -> None:
    _combo()
    staff = Client()
    staff.force_login(
        get_user_model().objects.create_superuser("ra-admin", "a@x.y", "pw-1234567890")
    )
    pk = Combo.objects.get(combo_id="rc").pk
    with django_capture_on_commit_callbacks(execute=True):
        r = staff.post(
            "/admin/combos/combo/",
            {"action": "reset_state", "_selected_action": [str(pk)]},
            follow=True,
        )
    assert r.status_code == 200
    assert "Cleared the routing state (cooldowns, probes, rotation) of 1 combo(s)." in (
        r.content.decode()
    )
    assert "*" in Combo.objects.get(combo_id="rc").state_resets
    with django_capture_on_commit_callbacks(execute=True):
        r = staff.post("/admin/combos/combo/rc/reset/", {"target": "rb/m", "next": "/admin/"})
    assert (r.status_code, r["Location"]) == (302, "/admin/")
    assert "rb/m" in Combo.objects.get(combo_id="rc").state_resets
    assert staff.get("/admin/combos/combo/rc/reset/").status_code == 405
    # A foreign `next` is not followed.
    with django_capture_on_commit_callbacks(execute=True):
        r = staff.post("/admin/combos/combo/rc/reset/", {"next": "https://evil.example/"})
    assert r["Location"] == "/admin/"
    kinds = list(RoutingEvent.objects.filter(kind="reset").values_list("target", "reason"))
    assert sorted(kinds) == [("", "operator"), ("", "operator"), ("rb/m", "operator")]
