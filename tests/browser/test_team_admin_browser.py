"""The Teams admin in a real browser (Chromium via Playwright) against a real `ocx serve`, at
1280 and 1920 px: add a team by picking members and an allowed model in the two-box pickers,
see a budget error next to its field, save, check the proxy enforces the team's narrowing, then
change the members. No sideways scroll on the form or the list. Screenshots go to
test-artifacts/browser/."""

from __future__ import annotations

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
    success_message,
)
from tests.conftest import Mock, Server
from tests.usage.test_budgets_e2e import USAGE, ask, new_key, setup_provider


def pick(tab: Any, field: str, text: str) -> None:
    """Filter the picker's available list by `text`, select the match and move it over."""
    search = tab.locator(f"#id_{field}_input")
    search.fill("")
    search.press("Backspace")  # a key up: the list shows everything again
    options = tab.locator(f"#id_{field}_from option").all_inner_texts()
    assert text in options, options
    search.press_sequentially(text)  # the picker filters per key
    assert tab.locator(f"#id_{field}_from option").all_inner_texts() == [text]
    tab.select_option(f"#id_{field}_from", label=text)
    tab.click(f"#id_{field}_add")


def no_sideways_scroll(tab: Any) -> None:
    overflow = tab.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px"


@pytest.mark.parametrize("page", WIDTHS, indirect=True)
def test_admin_adds_a_team_with_pickers_and_the_proxy_enforces_it(
    page: Any,  # noqa: F811
    admin_server: Server,  # noqa: F811
    mock: Mock,
) -> None:
    server = admin_server
    width = page.viewport_size["width"]
    tag = uuid.uuid4().hex[:6]
    provider, team = f"tp{tag}", f"infra{width}"
    setup_provider(server, mock, provider, "a", "b")
    mock.script("a", [], then={"usage": USAGE})
    ann, ben = f"ann{tag}", f"ben{tag}"
    _, ann_h = new_key(server, ann)
    new_key(server, ben)

    login(page)
    page.goto("/admin/accounts/team/add/")
    page.fill("#id_name", team)
    pick(page, "members", ann)
    pick(page, "members", ben)
    pick(page, "allowed_models", f"{provider}/a")
    page.fill("#id_budgets", '[{"tokens": 0, "period": "day"}]')
    no_sideways_scroll(page)
    shot(page, f"{width}-teams-01-add-filled")
    submit(page)
    # The bad budget is refused next to its field; the choices made are kept.
    assert "budgets[0].tokens must be from 1 to" in page.locator(".field-budgets").inner_text()
    chosen = page.locator("#id_members_to option").all_inner_texts()
    assert sorted(chosen) == sorted([ann, ben])
    shot(page, f"{width}-teams-02-budget-error")
    page.fill("#id_budgets", '[{"tokens": 100000, "period": "month"}]')
    submit(page)
    assert "was added successfully" in success_message(page), page.content()
    no_sideways_scroll(page)
    shot(page, f"{width}-teams-03-list")
    row = page.locator("#result_list tbody tr", has_text=team).inner_text()
    assert ann in row and ben in row and "0 of 100,000 tokens this month" in row

    assert server.api.get(f"/api/teams/{team}").json()["team"] == {
        "name": team,
        "members": sorted([ann, ben]),
        "managers": [],
        "budgets": [{"tokens": 100000, "period": "month"}],
        "allowedModels": [f"{provider}/a"],
    }
    # Served at once: the team narrows ann's key to provider/a.
    assert ask(server.http, f"{provider}/b", ann_h).status_code == 403
    assert ask(server.http, f"{provider}/a", ann_h).status_code == 200

    # Change: ann leaves (moved back), the narrowing goes.
    page.click(f"#result_list a:text-is('{team}')")
    page.select_option("#id_members_to", label=ann)
    page.click("#id_members_remove")
    page.select_option("#id_allowed_models_to", label=f"{provider}/a")
    page.click("#id_allowed_models_remove")
    no_sideways_scroll(page)
    shot(page, f"{width}-teams-04-change")
    submit(page)
    assert "was changed successfully" in success_message(page), page.content()
    body = server.api.get(f"/api/teams/{team}").json()["team"]
    assert body["members"] == [ben] and body["allowedModels"] == []
    assert ask(server.http, f"{provider}/b", ann_h).status_code != 403
