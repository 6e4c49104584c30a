"""Alert destinations managed like everything else: `/api/alerts` through Django's test client,
`ocx alert` through the CLI's entry point, the admin (form, *Send test*, the outbox's failures)
through a logged-in client; *Send test* reaches a real receiver. The secret is write-only."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import io
import json
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from alerts.models import FAILED, PENDING, AlertDestination, AlertMessage
from alerts.sender import mark_failed
from combos import services as combo_services
from ocxsite import cli
from providers import services as provider_services
from providers.sealing import unseal
from tests.alerts.receiver import Receiver, serve

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "test-admin-token-for-alerts-api-01"
URL = "/api/alerts"
SECRET = "whsec-0123456789abcdef"
SLACK = "https://hooks.slack.com/services/T000/B000/XXXXSECRETXXXX"


class Api:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

    def put(self, body: object) -> Any:
        return self.client.put(URL, json.dumps(body), "application/json", **self.auth)

    def get(self) -> Any:
        return self.client.get(URL, **self.auth)

    def delete(self, name: str | None) -> Any:
        query = "" if name is None else f"?name={name}"
        return self.client.delete(URL + query, **self.auth)

    def test(self, name: str) -> Any:
        return self.client.post(f"{URL}/test?name={name}", **self.auth)


@pytest.fixture
def api(settings: Any, client: Client) -> Api:
    settings.OCX_ADMIN_TOKEN = TOKEN
    Group.objects.create(name="infra")
    provider_services.provider_set(
        name="cx",
        raw={
            "adapter": "openai-responses",
            "baseUrl": "http://127.0.0.1:9/v1",
            "models": {"m": {}},
        },
    )
    combo_services.combo_set(combo_id="main", raw={"targets": [{"provider": "cx", "model": "m"}]})
    return Api(client)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec, stop = serve()
    try:
        yield rec
    finally:
        stop()


def test_put_get_delete_with_a_write_only_secret(api: Api) -> None:
    r = api.put(
        {
            "name": "ops",
            "alert": {
                "kind": "webhook",
                "url": "https://ops.example/hooks/ocx",
                "events": ["combo_unavailable", "provider_auth_failed"],
                "secret": SECRET,
                "combos": ["main"],
            },
        }
    )
    assert r.status_code == 200, r.content
    expected = {
        "name": "ops",
        "kind": "webhook",
        "url": "https://ops.example/…",
        "to": None,
        "events": ["combo_unavailable", "provider_auth_failed"],
        "teams": [],
        "combos": ["main"],
        "hasSecret": True,
        "pending": 0,
        "failed": 0,
    }
    assert r.json() == {"success": True, "alert": expected}
    assert SECRET not in r.content.decode()
    row = AlertDestination.objects.get(name="ops")
    assert row.secret != SECRET and unseal(row.secret) == SECRET  # sealed at rest

    r = api.put(
        {
            "name": "leads",
            "alert": {
                "kind": "email",
                "to": ["lead@example.com"],
                "events": ["budget"],
                "teams": ["infra"],
            },
        }
    )
    assert r.status_code == 200, r.content
    listed = api.get()
    assert listed.status_code == 200
    body = listed.json()
    assert [a["name"] for a in body["alerts"]] == ["leads", "ops"]
    assert body["alerts"][0]["to"] == ["lead@example.com"]
    assert body["alerts"][0]["hasSecret"] is None
    assert body["alerts"][1] == expected
    assert SECRET not in listed.content.decode()

    # Fields left out keep their stored values, the secret included; null removes it.
    r = api.put({"name": "ops", "alert": {"events": ["combo_unavailable"]}})
    assert r.json()["alert"]["hasSecret"] is True
    assert r.json()["alert"]["combos"] == ["main"]
    r = api.put({"name": "ops", "alert": {"secret": None}})
    assert r.json()["alert"]["hasSecret"] is False

    assert api.delete("ops").json() == {"success": True, "name": "ops"}
    assert api.delete("ops").status_code == 404
    assert api.delete(None).status_code == 400
    assert list(AlertDestination.objects.values_list("name", flat=True)) == ["leads"]


@pytest.mark.parametrize(
    ("alert", "message"),
    [
        ({"kind": "sms", "url": "https://x.example/", "events": ["budget"]}, "kind: one of"),
        ({"kind": "slack", "events": ["budget"]}, "url: a slack destination needs a url"),
        ({"kind": "slack", "url": "ftp://x.example/a", "events": ["budget"]}, "url: an http"),
        ({"kind": "slack", "url": "https://x.example/", "events": ["nope"]}, "events: one or more"),
        ({"kind": "slack", "url": "https://x.example/", "events": []}, "events: one or more"),
        ({"kind": "email", "to": ["not-an-address"], "events": ["budget"]}, "to: not an e-mail"),
        ({"kind": "email", "events": ["budget"]}, "to: an email destination needs"),
        (
            {"kind": "slack", "url": "https://x.example/", "events": ["budget"], "secret": "s"},
            "secret: only a webhook",
        ),
        (
            {
                "kind": "slack",
                "url": "https://x.example/",
                "events": ["budget"],
                "teams": ["ghosts"],
            },
            "teams: unknown team(s): ghosts",
        ),
        (
            {
                "kind": "slack",
                "url": "https://x.example/",
                "events": ["budget"],
                "combos": ["nope"],
            },
            "combos: unknown combo(s): nope",
        ),
        ({"events": ["budget"]}, "alert: a new destination needs kind and events"),
        (
            {"kind": "slack", "url": "https://x.example/", "events": ["budget"], "extra": 1},
            "alert.extra",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(
    api: Api, alert: dict[str, Any], message: str
) -> None:
    r = api.put({"name": "bad", "alert": alert})
    assert r.status_code == 400, r.content
    assert r.json()["error"].startswith(message), r.json()
    assert not AlertDestination.objects.exists()


def test_a_bad_name_and_no_token_are_refused(api: Api, client: Client) -> None:
    r = api.put(
        {"name": "no spaces", "alert": {"kind": "slack", "url": SLACK, "events": ["budget"]}}
    )
    assert r.status_code == 400 and r.json()["error"].startswith("name: 1 to 64")
    assert client.get(URL).status_code == 401
    assert client.put(URL, "{}", "application/json").status_code == 401


def test_send_test_reaches_a_real_receiver_signed(api: Api, receiver: Receiver) -> None:
    api.put(
        {
            "name": "hook",
            "alert": {
                "kind": "webhook",
                "url": receiver.url + "/t",
                "events": ["budget"],
                "secret": SECRET,
            },
        }
    )
    r = api.test("hook")
    assert r.status_code == 200
    assert r.json() == {"success": True, "name": "hook", "error": None}
    got = receiver.wait_for(1)[0]
    body = json.loads(got.body)
    assert (body["event"], body["text"]) == ("test", "Test message from ocx to destination hook")
    assert (
        got.headers["x-ocx-signature"]
        == hmac.new(SECRET.encode(), got.body, hashlib.sha256).hexdigest()
    )
    receiver.statuses = [502]
    assert api.test("hook").json() == {"success": False, "name": "hook", "error": "HTTP 502"}
    assert api.test("nope").status_code == 404


# --- CLI -------------------------------------------------------------------------------------


def ocx(*args: str, stdin: str = "") -> tuple[int, str, str]:
    import sys

    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = cli.main(list(args))
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


def test_cli_set_list_test_remove(api: Api, receiver: Receiver) -> None:
    code, out, err = ocx(
        "alert",
        "set",
        "leads",
        "--kind",
        "slack",
        "--url",
        receiver.url + "/services/T/B/X",
        "--event",
        "budget",
        "--event",
        "key_expiring",
        "--team",
        "infra",
    )
    assert (code, out, err) == (0, "Saved alert destination leads (slack).\n", "")
    code, out, err = ocx(
        "alert",
        "set",
        "ops",
        "--kind",
        "webhook",
        "--url",
        receiver.url + "/hook",
        "--event",
        "quota_low",
        "--secret-stdin",
        stdin=SECRET + "\n",
    )
    assert code == 0, err
    assert unseal(AlertDestination.objects.get(name="ops").secret) == SECRET
    code, out, _ = ocx("alert", "list")
    host = receiver.url.removeprefix("http://")
    assert (code, out) == (
        0,
        f"leads  slack http://{host}/…  events: budget, key_expiring  teams: infra  "
        "pending: 0  failed: 0\n"
        f"ops  webhook http://{host}/…  events: quota_low  pending: 0  failed: 0\n",
    )
    assert SECRET not in out
    code, out, _ = ocx("alert", "test", "leads")
    assert (code, out) == (0, "Test message sent to leads.\n")
    assert json.loads(receiver.wait_for(1)[0].body)["text"].startswith("[ocx] Test message")
    receiver.statuses = [500]
    code, _, err = ocx("alert", "test", "leads")
    assert (code, err) == (1, "ocx: the test message to leads failed: HTTP 500\n")
    code, _, err = ocx("alert", "set", "leads", "--event", "bogus")
    assert code == 1 and err.startswith("ocx: events: one or more of budget, ")
    assert AlertDestination.objects.get(name="leads").events == ["budget", "key_expiring"]
    code, out, _ = ocx("alert", "remove", "leads")
    assert (code, out) == (0, "Removed alert destination leads.\n")
    code, _, err = ocx("alert", "remove", "leads")
    assert (code, err) == (1, "ocx: no alert destination leads\n")


# --- admin -----------------------------------------------------------------------------------


def test_admin_form_send_test_and_failures(api: Api, client: Client, receiver: Receiver) -> None:
    root = get_user_model().objects.create_superuser("root", password="pw-root-123456")
    client.force_login(root)
    add = "/admin/alerts/alertdestination/add/"
    page = client.get(add)
    assert page.status_code == 200
    r = client.post(
        add,
        {
            "name": "chat",
            "kind": "webhook",
            "url": receiver.url + "/x",
            "to": "",
            "events": ["budget", "target_cooled"],
            "new_secret": SECRET,
            "teams": "",
            "combos": "main",
        },
    )
    assert r.status_code == 302, r.content.decode()[:2000]
    row = AlertDestination.objects.get(name="chat")
    assert (row.events, row.combos, unseal(row.secret)) == (
        ["budget", "target_cooled"],
        ["main"],
        SECRET,
    )
    change = client.get(f"/admin/alerts/alertdestination/{row.pk}/change/")
    assert change.status_code == 200 and SECRET not in change.content.decode()
    # A bad value is a form error and changes nothing.
    r = client.post(
        f"/admin/alerts/alertdestination/{row.pk}/change/",
        {"name": "chat", "kind": "webhook", "url": "nope", "events": ["budget"]},
    )
    assert r.status_code == 200 and "an http:// or https:// URL" in r.content.decode()
    assert AlertDestination.objects.get(name="chat").url == receiver.url + "/x"

    r = client.post(
        "/admin/alerts/alertdestination/",
        {"action": "send_test", "_selected_action": [row.pk]},
        follow=True,
    )
    assert "Test message sent to chat." in r.content.decode()
    assert len(receiver.wait_for(1)) == 1

    message = AlertMessage.objects.create(
        destination=row,
        event="budget",
        key="k",
        payload={"text": "t"},
        created=row.created,
        next_at=row.created,
    )
    mark_failed(message, "HTTP 503", row.created, 30_000)
    listing = client.get("/admin/alerts/alertmessage/?status=pending")
    assert listing.status_code == 200 and "HTTP 503" in listing.content.decode()
    assert AlertMessage.objects.get().status == PENDING
    # Given up after 24 h: *Retry now* sends it again, with 24 h more.
    late = row.created + dt.timedelta(hours=25)
    mark_failed(AlertMessage.objects.get(), "HTTP 503", late, 30_000)
    assert AlertMessage.objects.get().status == FAILED
    r = client.post(
        "/admin/alerts/alertmessage/",
        {"action": "retry_now", "_selected_action": [message.pk]},
        follow=True,
    )
    assert "1 message(s) will be sent again." in r.content.decode()
    again = AlertMessage.objects.get()
    assert again.status == PENDING and again.created > row.created
