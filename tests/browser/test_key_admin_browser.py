"""The key admin in a real browser (Chromium via Playwright) against a real `ocx serve`, at 1280
and 1920 px (issue 27, Keys): "Add client key" with a user search box, the catalog's models in
a two-pane multi-select, budget rows (one added with "Add another budget") and an expiry; a bad
row is refused on the form with nothing saved; the save shows the secret once with a working
Copy button, and the secret works on /v1; then the key's change page edits a row.

Screenshots go to test-artifacts/browser/ (`<width>-keys-*.png`).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import Any

import pytest

from tests.browser.test_admin_browser import (  # noqa: F401 - fixtures used by name
    WIDTHS,
    admin_server,
    browser,
    login,
    page,
    pytestmark,
    shot,
    submit,
)
from tests.conftest import Mock, Server
from tests.gateway.test_key_expiry_e2e import ask
from tests.gateway.test_proxy_failover import provider, sync


def no_sideways_scroll(tab: Any) -> None:
    width = tab.viewport_size["width"]
    assert tab.evaluate("document.documentElement.scrollWidth") <= width


def pick_user(tab: Any, username: str) -> None:
    """The autocomplete user picker (select2), as a user works it: open, type, choose."""
    tab.click("#id_user + .select2 .select2-selection")
    tab.fill(".select2-search__field", username)
    tab.click(f".select2-results__option:text-is('{username}')")
    assert tab.locator("#select2-id_user-container").inner_text().endswith(username)


def pick_model(tab: Any, model: str) -> None:
    tab.select_option("#id_allowed_models_from", model)
    tab.click("#id_allowed_models_add")


def budget_row(tab: Any, i: int, kind: str, amount: str, scope: str) -> None:
    row = tab.locator(".ocx-budget-row").nth(i)
    row.locator("select[name=budgets-kind]").select_option(kind)
    row.locator("input[name=budgets-amount]").fill(amount)
    row.locator("select[name=budgets-scope]").select_option(scope)


@pytest.mark.parametrize("page", WIDTHS, indirect=True)
def test_add_a_key_in_the_admin_and_edit_it(
    page: Any,  # noqa: F811
    admin_server: Server,  # noqa: F811
    mock: Mock,
) -> None:
    server = admin_server
    width = page.viewport_size["width"]
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)

    def snap(name: str) -> None:
        shot(page, f"{width}-keys-{name}")

    model = "kb-" + uuid.uuid4().hex[:6]
    server.put_provider("kbprov", provider(mock.url + "/v1", model))
    combo_id = f"keys{width}"
    server.put_combo(combo_id, {"targets": [{"provider": "kbprov", "model": model}]})
    sync(server)
    username = f"kb-user-{width}"
    server.create_key(user=username)  # the user exists (with another key)

    login(page)
    page.goto("/admin/accounts/clientkey/")
    page.click("a.addlink")
    page.wait_for_url("**/admin/accounts/clientkey/add/")
    no_sideways_scroll(page)
    options = page.locator("#id_allowed_models_from option").all_inner_texts()
    assert f"combo/{combo_id}" in options and f"kbprov/{model}" in options
    pick_user(page, username)
    page.fill("#id_name", "ci runner")
    pick_model(page, f"combo/{combo_id}")
    page.fill("#id_rpm_limit", "120")
    budget_row(page, 0, "tokens", "1.5", "period:day")  # not a whole number: refused
    page.click("button.ocx-add-budget")
    assert page.locator(".ocx-budget-row").count() == 2
    budget_row(page, 1, "windowPercent", "40", "provider:kbprov")
    expires = (dt.datetime.now(dt.UTC) + dt.timedelta(days=30)).date().isoformat()
    page.fill("#id_expires_0", expires)
    page.fill("#id_expires_1", "09:30:00")
    no_sideways_scroll(page)
    snap("01-add-filled")

    submit(page)
    error = page.locator(".field-budgets .errorlist").inner_text()
    assert error == "row 1: a tokens budget needs a whole number of tokens"
    assert page.locator("#ocx-secret").count() == 0
    keys = server.api.get("/api/keys", params={"user": username}).json()["keys"]
    assert len(keys) == 1  # nothing saved
    # What was typed is still there, including the added row.
    assert page.locator(".ocx-budget-row").nth(1).locator("input").input_value() == "40"
    no_sideways_scroll(page)
    snap("02-add-error")

    budget_row(page, 0, "tokens", "200000", "period:week")
    submit(page)
    secret = page.input_value("#ocx-secret")
    assert secret.startswith("ocx_")
    assert secret not in page.url
    assert "shown only once" in page.locator(".ocx-secret-warning").inner_text()
    page.click("button.ocx-copy")
    page.wait_for_selector(".ocx-copied:text-is('Copied')")
    assert page.evaluate("navigator.clipboard.readText()") == secret
    no_sideways_scroll(page)
    snap("03-secret")

    created = next(
        k
        for k in server.api.get("/api/keys", params={"user": username}).json()["keys"]
        if k["name"] == "ci runner"
    )
    assert created["allowedModels"] == [f"combo/{combo_id}"] and created["rpmLimit"] == 120
    assert created["budgets"] == [
        {"tokens": 200000, "period": "week"},
        {"windowPercent": 40, "provider": "kbprov"},
    ]
    assert created["expiresAt"] == f"{expires}T09:30:00Z"
    r = ask(server, combo_id, secret)
    assert r.status_code == 200, r.text

    # The key's page: the same controls, filled; change a row and save.
    page.click("text=Open the key")
    page.wait_for_url(f"**/admin/accounts/clientkey/{created['id']}/change/")
    assert page.locator("#ocx-secret").count() == 0
    chosen = page.locator("#id_allowed_models_to option").all_inner_texts()
    assert chosen == [f"combo/{combo_id}"]
    assert page.locator(".ocx-budget-row").nth(0).locator("input").input_value() == "200000"
    no_sideways_scroll(page)
    snap("04-change")
    budget_row(page, 0, "tokens", "300000", "period:month")
    page.fill("#id_expires_0", "")
    page.fill("#id_expires_1", "")
    submit(page)
    assert "was changed successfully" in page.locator(".messagelist").inner_text()
    no_sideways_scroll(page)
    # Every column in view: the list's own scroll box does not scroll sideways either.
    assert page.evaluate(
        "document.querySelector('.results').scrollWidth"
        " <= document.querySelector('.results').clientWidth"
    )
    snap("05-list")
    changed = next(
        k
        for k in server.api.get("/api/keys", params={"user": username}).json()["keys"]
        if k["id"] == created["id"]
    )
    assert changed["budgets"][0] == {"tokens": 300000, "period": "month"}
    assert changed["expiresAt"] is None

    # "Rotate selected key": choose a grace, then the new secret is shown once.
    page.check(f"input[name=_selected_action][value='{created['id']}']")
    page.select_option("select[name=action]", "rotate")
    with page.expect_navigation():
        page.click("button[name=index]")
    page.select_option("#id_grace", "3600")
    no_sideways_scroll(page)
    snap("06-rotate-grace")
    with page.expect_navigation():
        page.click("input[type=submit][value='Rotate the secret']")
    rotated = page.input_value("#ocx-secret")
    assert rotated.startswith("ocx_") and rotated != secret
    assert "The old secret keeps working until" in page.locator("#content-main").inner_text()
    no_sideways_scroll(page)
    snap("07-rotated")
    for usable in (rotated, secret):  # the old one inside its hour of grace
        # The worker that took the write serves it at once; others at the notice or poll.
        deadline = time.monotonic() + 5
        while (r := ask(server, combo_id, usable)).status_code == 401:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.05)
        assert r.status_code == 200, r.text
