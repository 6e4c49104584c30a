"""The portal (`/me/`, issue 44) in a real browser (Chromium via Playwright) against a real
`ocx serve`, at 1280 px: a member signs in with a password, creates a key limited to a model
their team allows, copies the secret shown once with the Codex snippet, uses it on /v1, sees
their usage and spend, rotates the key (the old secret stops, the new one works), revokes it,
and downloads the catalog; nothing scrolls sideways.

Screenshots go to test-artifacts/browser/ (`1280-portal-*.png`).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.test_admin_browser import (  # noqa: F401 - fixtures used by name
    admin_server,
    browser,
    new_page,
    pytestmark,
    shot,
)
from tests.browser.test_key_admin_browser import no_sideways_scroll
from tests.conftest import ROOT, Mock, Server
from tests.gateway.test_key_expiry_e2e import ask, until
from tests.gateway.test_proxy_failover import provider, sync

PASSWORD = "portal-Member-pw-7d2k1"


def ocx(server: Server, *args: str, stdin: str = "") -> str:
    r = subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", *args],
        cwd=ROOT,
        env=server.env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, f"ocx {args} failed:\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture
def page(admin_server: Server, browser: Any) -> Iterator[Any]:  # noqa: F811
    with new_page(browser, admin_server.url, 1280, 1000) as page:
        yield page


def test_a_member_serves_themselves_in_the_portal(
    page: Any,
    admin_server: Server,  # noqa: F811
    mock: Mock,
) -> None:
    server = admin_server
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    suffix = uuid.uuid4().hex[:6]
    model, combo_id, other = f"pm-{suffix}", f"portal{suffix}", f"other{suffix}"
    server.put_provider("pmprov", provider(mock.url + "/v1", model))
    for combo in (combo_id, other):
        server.put_combo(combo, {"targets": [{"provider": "pmprov", "model": model}]})
    sync(server)
    member, team = f"pm-{suffix}", f"team-{suffix}"
    ocx(server, "user", "create", member, "--password-stdin", stdin=PASSWORD + "\n")
    ocx(server, "team", "set", team, "--member", member, "--allowed-model", f"combo/{combo_id}")

    page.goto("/me/")
    assert "/me/login/" in page.url
    page.fill("#id_username", member)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/me/")
    assert page.locator("#user-tools strong").text_content() == member
    assert page.locator("#my-keys").inner_text().endswith("You have no key yet.")
    options = page.locator("#id_allowed_models option").all_inner_texts()
    assert options == [f"combo/{combo_id}"]  # what the team allows, nothing else
    no_sideways_scroll(page)
    shot(page, "1280-portal-01-home")

    page.fill("#id_name", "laptop")
    page.fill("#id_expires_in_days", "30")
    page.select_option("#id_allowed_models", f"combo/{combo_id}")
    page.click("#new-key input[type=submit]")
    secret = page.input_value("#ocx-secret")
    assert secret.startswith("ocx_") and secret not in page.url
    page.click("button.ocx-copy")
    page.wait_for_selector(".ocx-copied:text-is('Copied')")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    snippet = page.locator("#ocx-snippet").inner_text()
    assert snippet.startswith(f'model = "combo/{combo_id}"\n')
    assert f'base_url = "{server.url}/v1"' in snippet
    no_sideways_scroll(page)
    shot(page, "1280-portal-02-secret")

    mock.reset()
    assert until(server, combo_id, secret, 200).status_code == 200
    assert ask(server, other, secret).status_code == 403  # the key allows one model

    page.click("text=Back to my keys")
    page.wait_for_url("**/me/")
    assert secret not in page.content()
    assert page.locator("#my-keys tbody tr").count() == 1
    page.reload()
    assert page.locator("#usage-today td").first.inner_text() != ""
    shot(page, "1280-portal-03-keys")

    page.click("#my-keys button:text-is('Rotate')")
    rotated = page.input_value("#ocx-secret")
    assert rotated.startswith("ocx_") and rotated != secret
    assert "The old secret no longer works." in page.content()
    assert until(server, combo_id, secret, 401).status_code == 401
    assert until(server, combo_id, rotated, 200).status_code == 200

    page.click("text=Back to my keys")
    page.wait_for_url("**/me/")
    page.click("#my-keys button:text-is('Revoke')")
    page.wait_for_url("**/me/")
    assert "Key revoked" in page.locator("ul.messagelist").inner_text()
    assert until(server, combo_id, rotated, 401).status_code == 401
    with page.expect_download() as download:
        page.click("#catalog a.button")
    assert download.value.suggested_filename == "ocx-catalog.json"
    no_sideways_scroll(page)
    shot(page, "1280-portal-04-revoked")
