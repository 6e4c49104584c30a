"""The Django admin in a real browser (Debian's Chromium via Playwright) against a real
`ocx serve`: log in, create providers and a combo with inline rows, see a validation error,
reorder targets, and check that the proxy routes by the order saved through the admin.

Screenshots of every step go to test-artifacts/browser/ (ignored by git).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, Mock, Server

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts" / "browser"
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
USERNAME = "browser-admin"
PASSWORD = "browser-Admin-pw-9f3k2"
WEIGHT_ERROR = "targets[1].weight must be an integer from 1 to 10000"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason=f"{CHROMIUM} is missing (apt-get install chromium)"
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("playwright") is None,
        reason="the playwright package is missing (pip install playwright)",
    ),
]

# What django/contrib/admin/static/admin/js/inlines.js does for "Add another …": clone the
# hidden template row, number it, and bump TOTAL_FORMS. Used only when the admin's static
# files are not served (see test_admin_static_files_are_served).
ADD_ROW_JS = """
(prefix) => {
  const total = document.getElementById(`id_${prefix}-TOTAL_FORMS`);
  const n = parseInt(total.value, 10);
  const template = document.getElementById(`${prefix}-empty`);
  const row = template.cloneNode(true);
  row.id = `${prefix}-${n}`;
  row.classList.remove("empty-form");
  row.classList.add(`dynamic-${prefix}`);
  row.querySelectorAll("[id],[name],[for]").forEach((el) => {
    for (const attr of ["id", "name", "for"]) {
      const value = el.getAttribute(attr);
      if (value) el.setAttribute(attr, value.replace(/__prefix__/g, String(n)));
    }
  });
  template.parentNode.insertBefore(row, template);
  total.value = String(n + 1);
}
"""


def create_superuser(server: Server) -> None:
    """`manage.py createsuperuser --noinput` against the server's own database."""
    env = {
        **server.env,
        "DJANGO_SUPERUSER_USERNAME": USERNAME,
        "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
        "DJANGO_SUPERUSER_EMAIL": "admin@example.com",
    }
    r = subprocess.run(
        [sys.executable, "manage.py", "createsuperuser", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if r.returncode != 0 and "already taken" not in r.stderr:
        raise AssertionError(f"createsuperuser failed:\n{r.stdout}\n{r.stderr}")


@pytest.fixture
def admin_server(server: Server) -> Server:
    create_superuser(server)
    return server


@pytest.fixture
def page(admin_server: Server) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            # A viewport taller than the pages: after a full-page screenshot that had to grow
            # the viewport, headless Chromium's clicks can land off target.
            context = browser.new_context(
                base_url=admin_server.url, viewport={"width": 1280, "height": 2400}
            )
            page = context.new_page()
            page.set_default_timeout(10_000)
            yield page
        finally:
            browser.close()


def shot(page: Any, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def login(page: Any) -> None:
    page.goto("/admin/")
    assert "/admin/login/" in page.url
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")
    assert page.locator("text=Site administration").count() >= 1


def add_inline_row(page: Any, prefix: str) -> int:
    """Add one inline row the way a user does ("Add another …"); returns its index."""
    n = int(page.input_value(f"#id_{prefix}-TOTAL_FORMS"))
    link = page.locator(f"#{prefix}-group .add-row a")
    if link.count():
        link.click()
    else:
        page.evaluate(ADD_ROW_JS, prefix)
    page.wait_for_selector(f"[name='{prefix}-{n}-id']", state="attached")
    return n


def submit(page: Any, button: str = "_save") -> None:
    with page.expect_navigation():
        page.click(f"input[name={button}]")


def success_message(page: Any) -> str:
    return " ".join(page.locator(".messagelist li").all_inner_texts())


def add_provider(page: Any, name: str, base_url: str, api_key: str, model: str) -> None:
    page.goto("/admin/providers/provider/add/")
    page.fill("#id_name", name)
    page.select_option("#id_adapter", "openai-responses")
    page.fill("#id_base_url", base_url)
    page.fill("#id_api_key", api_key)
    i = add_inline_row(page, "models")
    page.fill(f"#id_models-{i}-model_id", model)
    page.fill(f"#id_models-{i}-context_window", "100000")
    shot(page, f"02-provider-{name}-filled")
    submit(page)
    shot(page, f"03-provider-{name}-saved")
    assert "was added successfully" in success_message(page), page.content()


def fill_target(
    page: Any, i: int, *, position: int, provider: str, model: str, weight: int
) -> None:
    page.fill(f"#id_targets-{i}-position", str(position))
    page.select_option(f"#id_targets-{i}-provider", label=provider)
    page.fill(f"#id_targets-{i}-model", model)
    page.fill(f"#id_targets-{i}-weight", str(weight))


def target_of(server: Server, key: str, combo_id: str) -> str:
    server.wait_synced()
    r = server.http.post(
        "/v1/responses",
        json={"model": f"combo/{combo_id}", "input": "hi"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    return r.headers["x-ocx-target"]


def stored_targets(server: Server, combo_id: str) -> list[tuple[str, str, int]]:
    combos = {c["id"]: c for c in server.api.get("/api/combos").json()["combos"]}
    return [(t["provider"], t["model"], t.get("weight", 1)) for t in combos[combo_id]["targets"]]


def test_admin_static_files_are_served(admin_server: Server) -> None:
    """The admin needs its CSS and JS (inline "Add another" rows are JavaScript)."""
    r = admin_server.http.get("/static/admin/js/inlines.js")
    if r.status_code != 200:
        pytest.xfail(
            f"`ocx serve` does not serve /static/ (GET /static/admin/js/inlines.js -> "
            f"{r.status_code}): the admin renders unstyled and without its JavaScript"
        )


def test_admin_provider_combo_reorder_routes(page: Any, admin_server: Server, mock: Mock) -> None:
    server = admin_server
    upstream = mock.url + "/v1"

    login(page)
    shot(page, "01-logged-in")

    add_provider(page, "alpha", upstream, "sk-browser-alpha-0000000000000000", "m-alpha")
    add_provider(page, "beta", upstream, "sk-browser-beta-11111111111111111", "m-beta")
    providers = {p["name"]: p for p in server.api.get("/api/providers").json()["providers"]}
    assert set(providers) == {"alpha", "beta"}
    assert providers["alpha"]["adapter"] == "openai-responses"
    assert providers["alpha"]["baseUrl"] == upstream
    assert "m-alpha" in providers["alpha"]["models"]
    assert "sk-browser-alpha" not in str(providers)  # the key is write-only

    # A combo with two targets; the second has an invalid weight.
    page.goto("/admin/combos/combo/add/")
    page.fill("#id_combo_id", "browser")
    a = add_inline_row(page, "targets")
    b = add_inline_row(page, "targets")
    fill_target(page, a, position=0, provider="alpha", model="m-alpha", weight=1)
    fill_target(page, b, position=1, provider="beta", model="m-beta", weight=0)
    shot(page, "04-combo-bad-weight-filled")
    submit(page)
    shot(page, "05-combo-bad-weight-error")
    assert WEIGHT_ERROR in page.locator("#content").inner_text()
    assert page.url.endswith("/admin/combos/combo/add/")
    assert server.api.get("/api/combos").json()["combos"] == []

    # Fix the weight (the rows come back as entered) and save.
    assert page.input_value(f"#id_targets-{b}-weight") == "0"
    page.fill(f"#id_targets-{b}-weight", "5")
    submit(page, "_continue")
    shot(page, "06-combo-saved")
    assert "was added successfully" in success_message(page), page.content()
    assert WEIGHT_ERROR not in page.content()
    assert stored_targets(server, "browser") == [("alpha", "m-alpha", 1), ("beta", "m-beta", 5)]

    key = server.create_key("browser-test")
    assert target_of(server, key, "browser") == "alpha/m-alpha"

    # Reorder on the change page by editing the position fields: beta first.
    rows = {
        page.input_value(f"#id_targets-{i}-model"): i
        for i in range(int(page.input_value("#id_targets-TOTAL_FORMS")))
    }
    page.fill(f"#id_targets-{rows['m-alpha']}-position", "1")
    page.fill(f"#id_targets-{rows['m-beta']}-position", "0")
    shot(page, "07-combo-reordered")
    submit(page, "_continue")
    shot(page, "08-combo-reordered-saved")
    assert "was changed successfully" in success_message(page), page.content()
    assert stored_targets(server, "browser") == [("beta", "m-beta", 5), ("alpha", "m-alpha", 1)]
    # The change page now lists beta first, with positions normalized to 0, 1.
    assert page.input_value("#id_targets-0-model") == "m-beta"
    assert page.input_value("#id_targets-0-position") == "0"
    assert page.input_value("#id_targets-1-position") == "1"

    assert target_of(server, key, "browser") == "beta/m-beta"
    assert [e["model"] for e in mock.log()] == ["m-alpha", "m-beta"]

    page.goto("/admin/combos/combo/")
    shot(page, "09-combo-list")
    assert "beta/m-beta, alpha/m-alpha" in page.locator("#result_list").inner_text()
