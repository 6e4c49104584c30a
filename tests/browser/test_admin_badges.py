"""The admin's live target badges in a real browser (Chromium via Playwright) against a real
`ocx serve`: they show each target's state from `eligibility.target_state`, and when the
server cools a target, `ocx/live.js` (told over `/ws/events`) redraws the badge from
`/api/status` without a reload.
"""

from __future__ import annotations

import uuid
from typing import Any

from playwright.sync_api import expect

from tests.browser.test_admin_browser import (  # noqa: F401 - fixtures used by name
    admin_server,
    browser,
    login,
    page,
    pytestmark,
    shot,
)
from tests.conftest import Mock, Server
from tests.gateway.test_quota_failover import FALLBACK_KEY, PRIMARY_KEY, provider, sync


def test_badges_show_states_and_follow_a_cooldown_live(
    page: Any,  # noqa: F811
    admin_server: Server,  # noqa: F811
    mock: Mock,
) -> None:
    server = admin_server
    tag = uuid.uuid4().hex[:6]
    pm, fm, nm = f"ba-{tag}", f"bb-{tag}", f"bc-{tag}"
    url = mock.url + "/v1"
    unset = f"PROVIDER_TEST_UNSET_{tag.upper()}"
    server.put_provider(f"pri-{tag}", provider(url, pm, apiKey=PRIMARY_KEY))
    server.put_provider(f"fb-{tag}", provider(url, fm, apiKey=FALLBACK_KEY))
    server.put_provider(f"nokey-{tag}", provider(url, nm, apiKeyEnv=unset))
    combo_id = f"badges{tag}"
    targets = [
        {"provider": f"pri-{tag}", "model": pm},
        {"provider": f"nokey-{tag}", "model": nm},
        {"provider": f"fb-{tag}", "model": fm},
    ]
    server.put_combo(combo_id, {"targets": targets, "cooldownMs": 60_000})
    sync(server)
    key = server.create_key()

    login(page)
    page.goto("/admin/combos/combo/")
    box = page.locator(f'.ocx-live[data-combo="{combo_id}"]')
    primary = box.locator(f'[data-target="pri-{tag}/{pm}"]')
    assert primary.inner_text() == f"pri-{tag}/{pm}: Available"
    assert primary.get_attribute("title") == "no quota data yet"
    nokey = box.locator(f'[data-target="nokey-{tag}/{nm}"]')
    assert nokey.inner_text() == f"nokey-{tag}/{nm}: No credential"
    assert nokey.get_attribute("title") == f"environment variable {unset} is not set"
    shot(page, "badges-01-available")

    # The primary fails: the server cools it and pushes the event; the page redraws itself.
    page.wait_for_timeout(300)  # let live.js open its WebSocket before the event
    mock.script(pm, [{"status": 503}])
    r = server.http.post(
        "/v1/responses",
        json={"model": f"combo/{combo_id}", "input": "hi"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-target"] == f"fb-{tag}/{fm}"
    # A locator, not an element handle: the live redraw may replace the element.
    expect(primary).to_contain_text("Cooling until", timeout=10_000)
    # (The time may be rendered in the browser's zone; the state and its text are the server's.)
    assert primary.inner_text().startswith(f"pri-{tag}/{pm}: Cooling until ")
    assert "ocx-cooling" in (primary.get_attribute("class") or "")
    assert nokey.inner_text() == f"nokey-{tag}/{nm}: No credential"
    # The admin pulls its object tools up into the title row: none may cover the notes.
    notes = page.locator("#needs-attention").bounding_box()
    tools = page.locator(".object-tools").bounding_box()
    assert notes is not None and tools is not None
    assert tools["y"] + tools["height"] <= notes["y"], (tools, notes)
    shot(page, "badges-02-cooling")
