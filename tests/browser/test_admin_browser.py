"""The Django admin in a real browser (Debian's Chromium via Playwright) against a real
`ocx serve`, at 1280 and 1920 px: log in, create providers and a combo (one empty target row to
start, models picked from each provider's declared models), see a validation error next to its
field, drag a target to the top and check that the proxy serves the new first target; then the
request log (filters, the route as tables) and that no badge or column is clipped.

Screenshots of every step go to test-artifacts/browser/ (ignored by git; CI keeps them).
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import subprocess
import sys
import time
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
WEIGHT_ERROR = "Weight must be an integer from 1 to 10000"

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
    # Once per server (a module's): `createsuperuser` is a Django start and a password hash.
    if not server.superuser:
        create_superuser(server)
        server.superuser = True
    return server


WIDTHS = [1280, 1920]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module; each test gets its own context (cookies, size)."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@contextlib.contextmanager
def new_page(browser: Any, base_url: str, width: int, height: int, **options: Any) -> Iterator[Any]:
    """A page in a fresh context of `browser` (nothing shared with the test before)."""
    context = browser.new_context(
        base_url=base_url, viewport={"width": width, "height": height}, **options
    )
    try:
        page = context.new_page()
        page.set_default_timeout(10_000)
        yield page
    finally:
        context.close()


@pytest.fixture
def page(admin_server: Server, browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A browser page; its width is the test's `page` parameter (1280 px when it has none)."""
    # A viewport taller than the pages: after a full-page screenshot that had to grow the
    # viewport, headless Chromium's clicks can land off target.
    with new_page(browser, admin_server.url, getattr(request, "param", 1280), 2400) as page:
        yield page


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
    # The preset dropdown's long option texts once ran past the page edge (issue 28 item 10).
    box = page.locator("#id_preset").bounding_box()
    width = page.viewport_size["width"]
    assert box["x"] + box["width"] <= width, box
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.fill("#id_name", name)
    page.select_option("#id_adapter", "openai-responses")
    page.fill("#id_base_url", base_url)
    page.fill("#id_api_key", api_key)
    i = add_inline_row(page, "models")
    page.fill(f"#id_models-{i}-model_id", model)
    page.fill(f"#id_models-{i}-context_window", "100000")
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    shot(page, f"{width}-02-provider-{name}-filled")
    submit(page)
    shot(page, f"{width}-03-provider-{name}-saved")
    assert "was added successfully" in success_message(page), page.content()


def target_rows(page: Any) -> Any:
    return page.locator("#targets-group tbody tr.form-row:not(.empty-form)")


def pick_target(page: Any, i: int, *, provider: str, model: str, weight: int) -> list[str]:
    """Choose the provider, then the model from the picker; returns the picker's options."""
    page.select_option(f"#id_targets-{i}-provider", label=provider)
    picker = page.locator(f"#targets-{i} select.ocx-model-select")
    options = picker.locator("option").all_inner_texts()
    picker.select_option(model)
    assert page.input_value(f"#id_targets-{i}-model") == model
    assert not page.locator(f"#id_targets-{i}-model").is_visible()  # the picker stands for it
    page.fill(f"#id_targets-{i}-weight", str(weight))
    return options


def drag_row(page: Any, source: int, before: int) -> None:
    """Drag the handle of row `source` above row `before` (DOM order), with the mouse."""
    rows = target_rows(page)
    handle = rows.nth(source).locator(".ocx-drag").bounding_box()
    top = rows.nth(before).bounding_box()
    page.mouse.move(handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2)
    page.mouse.down()
    page.mouse.move(handle["x"] + handle["width"] / 2, top["y"] + 3, steps=8)
    page.mouse.up()


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


def logged(server: Server, combo_id: str, count: int) -> list[dict[str, Any]]:
    """The request log rows of `combo_id` once `count` are written (batched off the hot path)."""
    deadline = time.monotonic() + 15
    while True:
        rows = server.api.get("/api/requests", params={"combo": combo_id, "limit": 50}).json()
        rows = rows["requests"] if isinstance(rows, dict) else rows
        if len(rows) >= count or time.monotonic() > deadline:
            every = server.api.get("/api/requests").json()
            assert len(rows) == count, (rows, every, server.output[-30:])
            return list(rows)
        time.sleep(0.1)


def assert_nothing_clipped(page: Any, cells: str, inner: str) -> None:
    """Every `inner` element lies inside its `cells` ancestor, and the page has no sideways
    scroll (so no column is pushed off-screen)."""
    boxes = page.evaluate(
        """([cells, inner]) => Array.from(document.querySelectorAll(inner)).map((el) => {
             const cell = el.closest(cells).getBoundingClientRect();
             const box = el.getBoundingClientRect();
             return {text: el.textContent, left: box.left - cell.left,
                     right: cell.right - box.right, width: box.width};
           })""",
        [cells, inner],
    )
    assert boxes, f"no {inner} on the page"
    for box in boxes:
        assert box["left"] >= -0.5 and box["right"] >= -0.5 and box["width"] > 0, box
    # The changelist's table scrolls inside its own box: no cell may end past that box.
    past = page.evaluate(
        """() => {
             const box = document.querySelector("#changelist .results");
             if (!box) { return []; }
             const edge = box.getBoundingClientRect().right;
             return Array.from(box.querySelectorAll("th, td"))
               .filter((c) => c.getBoundingClientRect().right > edge + 0.5)
               .map((c) => c.className + ": " + c.textContent.trim());
           }"""
    )
    assert past == [], past
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px"


def test_admin_static_files_are_served(admin_server: Server) -> None:
    """The admin needs its CSS and JS (inline "Add another" rows are JavaScript)."""
    for path in (
        "/static/admin/js/inlines.js",
        "/static/ocx/combo-editor.js",
        "/static/ocx/localtime.js",
        "/static/ocx/requestlog.css",
        "/static/ocx/combo-list.css",
    ):
        r = admin_server.http.get(path)
        if r.status_code != 200:
            pytest.xfail(
                f"`ocx serve` does not serve /static/ (GET {path} -> {r.status_code}): the "
                "admin renders unstyled and without its JavaScript"
            )


@pytest.mark.parametrize("page", WIDTHS, indirect=True)
def test_admin_combo_editor_reorder_routes_and_request_log(
    page: Any, admin_server: Server, mock: Mock
) -> None:
    server = admin_server
    upstream = mock.url + "/v1"
    width = page.viewport_size["width"]
    combo_id, user = f"browser{width}", f"browser-{width}"

    def snap(name: str) -> None:
        shot(page, f"{width}-{name}")

    login(page)
    snap("01-logged-in")

    add_provider(page, "alpha", upstream, "sk-browser-alpha-0000000000000000", "m-alpha")
    add_provider(page, "beta", upstream, "sk-browser-beta-11111111111111111", "m-beta")
    providers = {p["name"]: p for p in server.api.get("/api/providers").json()["providers"]}
    assert set(providers) == {"alpha", "beta"}
    assert providers["alpha"]["adapter"] == "openai-responses"
    assert providers["alpha"]["baseUrl"] == upstream
    assert "m-alpha" in providers["alpha"]["models"]
    assert "sk-browser-alpha" not in str(providers)  # the key is write-only

    # A new combo: one empty target row under id / display name / strategy.
    page.goto("/admin/combos/combo/add/")
    assert page.input_value("#id_targets-TOTAL_FORMS") == "1"
    assert target_rows(page).count() == 1
    identity = page.locator("#id_strategy").bounding_box()
    table = page.locator("#targets-group").bounding_box()
    cooldown = page.locator("#id_cooldown_ms").bounding_box()
    assert identity["y"] < table["y"] < cooldown["y"]
    # Every field says what empty means.
    for field, text in (
        ("cooldown_ms", "Empty = the upstream hint, else 60 s"),
        ("sticky_limit", "Default 1"),
        ("native_alias", "Off = the alias must not look like an OpenAI model."),
        ("override_target", "Empty = automatic"),
    ):
        assert text in page.locator(f"#id_{field}_helptext").inner_text(), field
    page.fill("#id_combo_id", combo_id)
    # The model picker offers the chosen provider's declared models (and "Other").
    options = pick_target(page, 0, provider="alpha", model="m-alpha", weight=1)
    assert options == ["Choose a model…", "m-alpha", "Other model (not declared)…"]
    b = add_inline_row(page, "targets")
    options = pick_target(page, b, provider="beta", model="m-beta", weight=0)
    assert options == ["Choose a model…", "m-beta", "Other model (not declared)…"]
    snap("04-combo-bad-weight-filled")
    submit(page)
    snap("05-combo-bad-weight-error")
    # The error sits in the weight cell of its row, not above the table.
    assert WEIGHT_ERROR in page.locator(f"#targets-{b} td.field-weight").inner_text()
    assert page.locator("#targets-group .errorlist.nonform").count() == 0
    assert page.url.endswith("/admin/combos/combo/add/")
    assert server.api.get("/api/combos").json()["combos"] == []

    # The rows come back as entered, the picker showing the chosen model; fix and save.
    assert page.input_value(f"#id_targets-{b}-weight") == "0"
    assert page.locator(f"#targets-{b} select.ocx-model-select").input_value() == "m-beta"
    page.fill(f"#id_targets-{b}-weight", "5")
    submit(page, "_continue")
    snap("06-combo-saved")
    assert "was added successfully" in success_message(page), page.content()
    assert page.locator(".messagelist .warning").count() == 0  # both models are declared
    assert WEIGHT_ERROR not in page.content()
    assert stored_targets(server, combo_id) == [("alpha", "m-alpha", 1), ("beta", "m-beta", 5)]

    key = server.create_key(user)
    assert target_of(server, key, combo_id) == "alpha/m-alpha"

    # Drag beta above alpha: the hidden positions follow the rows.
    assert target_rows(page).nth(1).locator("input[name$='-model']").input_value() == "m-beta"
    drag_row(page, 1, 0)
    assert [
        target_rows(page).nth(i).locator("input[name$='-model']").input_value() for i in (0, 1)
    ] == ["m-beta", "m-alpha"]
    assert [
        target_rows(page).nth(i).locator("input.ocx-position").input_value() for i in (0, 1)
    ] == ["0", "1"]
    snap("07-combo-dragged")
    submit(page, "_continue")
    snap("08-combo-reordered-saved")
    assert "was changed successfully" in success_message(page), page.content()
    assert stored_targets(server, combo_id) == [("beta", "m-beta", 5), ("alpha", "m-alpha", 1)]
    assert page.input_value("#id_targets-0-model") == "m-beta"
    assert page.input_value("#id_targets-0-position") == "0"
    assert page.input_value("#id_targets-1-position") == "1"

    # The proxy serves the new first target.
    assert target_of(server, key, combo_id) == "beta/m-beta"
    assert [e["model"] for e in mock.log()] == ["m-alpha", "m-beta"]

    # More traffic for the request log: a hop (beta fails and cools), then a refused request.
    mock.script("m-beta", [{"status": 503}])
    assert target_of(server, key, combo_id) == "alpha/m-alpha"
    mock.script("m-alpha", [{"status": 400}])
    r = server.http.post(
        "/v1/responses",
        json={"model": f"combo/{combo_id}", "input": "hi"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 400, r.text
    rows = logged(server, combo_id, 4)
    assert sorted(row["status"] for row in rows) == [200, 200, 200, 400]

    page.goto("/admin/combos/combo/")
    snap("09-combo-list")
    assert "beta/m-beta, alpha/m-alpha" in page.locator("#result_list").inner_text()
    badge = page.locator(f'.ocx-live[data-combo="{combo_id}"] [data-target="beta/m-beta"]')
    # Cooling until a local time with a countdown, from the <time> element.
    assert re.fullmatch(
        r"beta/m-beta: Cooling until \d\d:\d\d:\d\d \(in (\d+ s|1 min)\)", badge.inner_text()
    ), badge.inner_text()
    assert_nothing_clipped(page, "td", ".ocx-badge")

    # The request log: its columns fit, the filters narrow it, the detail shows the route.
    page.goto(f"/admin/usage/requestlog/?combo={combo_id}")
    snap("10-request-log")
    assert_nothing_clipped(page, "td", ".ocx-status")
    head = page.locator("#result_list thead").inner_text()
    for column in ("TIME", "STATUS", "DURATION", "USER", "COMBO", "SERVED BY", "HOPS"):
        assert column in head.upper(), head
    for th in ("column-status_badge", "column-duration"):
        box = page.locator(f"#result_list th.{th}").bounding_box()
        assert box["x"] + box["width"] <= width, (th, box)
    times = page.locator("#result_list .field-when time").all_inner_texts()
    assert len(times) == 4 and all(
        re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", t) for t in times
    ), times

    def listed() -> list[str]:
        return page.locator("#result_list td.field-status_badge").all_inner_texts()

    with page.expect_navigation():
        page.locator("#changelist-filter a", has_text="4xx refused").click()
    snap("11-request-log-4xx")
    assert listed() == ["400"]
    with page.expect_navigation():
        page.locator("#changelist-filter a", has_text="2xx success").click()
    assert listed() == ["200", "200", "200"]
    hops = page.locator("#result_list td.field-hop_count").all_inner_texts()
    assert sorted(hops) == ["0", "0", "1"]
    with page.expect_navigation():
        page.locator("#changelist-filter a", has_text="Last hour").click()
    assert listed() == ["200", "200", "200"]
    with page.expect_navigation():
        page.locator("#changelist-filter a", has_text=user).click()
    assert listed() == ["200", "200", "200"]
    assert f"user={user}" in page.url and "since=1h" in page.url and "status_class=2xx" in page.url
    with page.expect_navigation():
        page.locator("#changelist-filter a", has_text="5xx failed").click()
    assert listed() == []
    snap("12-request-log-filters")

    # The hop's detail: the attempts table (the cooldown's end in local time) and no raw JSON.
    page.goto(f"/admin/usage/requestlog/?combo={combo_id}&status_class=2xx")
    row = page.locator(
        "#result_list tbody tr", has=page.locator("td.field-hop_count", has_text="1")
    )
    with page.expect_navigation():
        row.locator("th.field-when a, td.field-when a").first.click()
    snap("13-request-log-detail")
    cells = [
        [c.strip() for c in tr.locator("td").all_inner_texts()]
        for tr in page.locator("#ocx-attempts tbody tr").all()
    ]
    assert [c[:5] for c in cells] == [
        ["1", "beta/m-beta", "503", "hop", cells[0][4]],
        ["2", "alpha/m-alpha", "200", "served", "—"],
    ], cells
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(\+\d+ (s|min)\)", cells[0][5]), cells
    assert cells[1][5] == "—"
    assert "No target was skipped." in page.locator("#content").inner_text()
    assert "cooledUntil" not in page.content()


def test_admin_undeclared_model_and_keyboard_reorder(
    page: Any, admin_server: Server, mock: Mock
) -> None:
    """ "Other model" keeps any id possible (saved with a warning); Alt+Up moves a row."""
    server = admin_server
    for name, model in (("gamma", "m-gamma"), ("delta", "m-delta")):
        server.put_provider(
            name,
            {
                "adapter": "openai-responses",
                "baseUrl": mock.url + "/v1",
                "apiKey": f"sk-browser-{name}-22222222222222",
                "models": {model: {"contextWindow": 100000}},
            },
        )
    login(page)
    page.goto("/admin/combos/combo/add/")
    page.fill("#id_combo_id", "keys")
    pick_target(page, 0, provider="gamma", model="m-gamma", weight=1)
    b = add_inline_row(page, "targets")
    # A model typed before the provider is chosen stays, shown as "Other".
    page.fill(f"#id_targets-{b}-model", "m-delta-preview")
    page.select_option(f"#id_targets-{b}-provider", label="delta")
    picker = page.locator(f"#targets-{b} select.ocx-model-select")
    assert picker.input_value() == "__other__"
    assert page.input_value(f"#id_targets-{b}-model") == "m-delta-preview"
    assert page.locator(f"#id_targets-{b}-model").is_visible()
    # Picking a declared model, then "Other" again, leaves the text field to type in.
    picker.select_option("m-delta")
    assert page.input_value(f"#id_targets-{b}-model") == "m-delta"
    picker.select_option("__other__")
    assert page.locator(f"#id_targets-{b}-model").is_visible()
    page.fill(f"#id_targets-{b}-model", "m-delta-preview")
    # Keyboard: focus the second row's handle, Alt+Up puts it first.
    target_rows(page).nth(1).locator(".ocx-drag").focus()
    page.keyboard.press("Alt+ArrowUp")
    assert target_rows(page).nth(0).locator("input[name$='-model']").input_value() == (
        "m-delta-preview"
    )
    # An override that is not a target: the error sits under the override field.
    page.fill("#id_override_target", "gamma/nope")
    submit(page)
    shot(page, "20-combo-override-error")
    override = page.locator(".field-override_target .errorlist").inner_text()
    assert override == 'Override target "gamma/nope" is not one of this combo\'s targets'
    assert page.locator("#targets-group .errorlist").count() == 0
    assert server.api.get("/api/combos").json()["combos"] == []
    # The rows came back as entered (the undeclared model as "Other"); clear the override.
    assert target_rows(page).nth(0).locator("input[name$='-model']").input_value() == (
        "m-delta-preview"
    )
    page.fill("#id_override_target", "")
    shot(page, "21-combo-other-model")
    submit(page, "_continue")
    shot(page, "22-combo-other-model-saved")
    assert "was added successfully" in success_message(page), page.content()
    warnings = page.locator(".messagelist .warning").all_inner_texts()
    assert warnings == [
        'Target delta/m-delta-preview: provider "delta" does not declare model '
        '"m-delta-preview" (declared: m-delta); it is sent upstream as typed, and the combo '
        "is left out of the Codex catalog until the model is declared."
    ]
    assert stored_targets(server, "keys") == [
        ("delta", "m-delta-preview", 1),
        ("gamma", "m-gamma", 1),
    ]
    # Back on the change page, the undeclared id shows as "Other" with its text field.
    assert page.locator("#targets-0 select.ocx-model-select").input_value() == "__other__"
    assert page.input_value("#id_targets-0-model") == "m-delta-preview"
    assert page.locator("#id_targets-0-model").is_visible()
