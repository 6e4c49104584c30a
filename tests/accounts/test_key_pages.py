"""`GET /api/keys` pages (`limit`, `cursor`, `user`) and the admin key list's paging and user
filter (issue #24: 10,000 keys must not be one 2 MB answer)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from accounts import key_pages
from accounts.models import ClientKey

pytestmark = pytest.mark.django_db

TOKEN = "test-admin-token-for-key-pages-0001"


def make_keys(per_user: dict[str, int]) -> list[int]:
    """Keys inserted in bulk (no per-key bump: these tests read the list, not the proxy)."""
    user_model = get_user_model()
    rows = []
    for name, count in per_user.items():
        user = user_model.objects.create(username=name)
        rows += [
            ClientKey(
                user=user, name=f"{name}-{i}", prefix=f"ocx_{name[:2]}{i:04d}", digest=f"{name}{i}"
            )
            for i in range(count)
        ]
    return [k.pk for k in ClientKey.objects.bulk_create(rows)]


@pytest.fixture
def api(settings: Any, client: Client) -> Any:
    settings.OCX_ADMIN_TOKEN = TOKEN

    def get(**params: object) -> Any:
        return client.get("/api/keys", params, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    return get


def test_a_cursor_walk_lists_every_key_once_newest_first(api: Any) -> None:
    ids = make_keys({"ann": 7, "bob": 6})
    seen: list[int] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, object] = {"limit": 5}
        if cursor is not None:
            params["cursor"] = cursor
        r = api(**params)
        assert r.status_code == 200
        body = r.json()
        assert set(body) == {"keys", "nextCursor"}
        assert len(body["keys"]) <= 5
        seen += [k["id"] for k in body["keys"]]
        pages += 1
        cursor = body["nextCursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == sorted(ids, reverse=True)  # each key exactly once, newest first

    # A key created while paging lands before the first page, never shifts a later one.
    first = api(limit=5).json()
    make_keys({"cy": 1})
    second = api(limit=5, cursor=first["nextCursor"]).json()
    assert [k["id"] for k in second["keys"]] == seen[5:10]


def test_the_default_page_is_the_whole_list_up_to_the_default_limit(api: Any) -> None:
    make_keys({"ann": 3})
    body = api().json()
    assert len(body["keys"]) == 3 and body["nextCursor"] is None
    assert body["keys"][0]["user"] == "ann" and "allowedModels" in body["keys"][0]
    assert key_pages.LIMIT_DEFAULT == 500 and key_pages.LIMIT_MAX == 1000


def test_the_user_filter_pages_one_users_keys(api: Any) -> None:
    make_keys({"ann": 4, "bob": 3})
    first = api(user="bob", limit=2).json()
    rest = api(user="bob", limit=2, cursor=first["nextCursor"]).json()
    listed = first["keys"] + rest["keys"]
    assert [k["user"] for k in listed] == ["bob"] * 3
    assert rest["nextCursor"] is None
    assert api(user="nobody").json() == {"keys": [], "nextCursor": None}


@pytest.mark.parametrize("limit", ["0", "1001", "-1", "ten", "2.5", ""])
def test_a_bad_limit_is_a_400_naming_the_range(api: Any, limit: str) -> None:
    r = api(limit=limit)
    assert r.status_code == 400
    assert r.json() == {"error": "limit must be an integer from 1 to 1000"}


@pytest.mark.parametrize("cursor", ["garbage!", "", "MTIz", key_pages.cursor_after(5) + "x"])
def test_a_bad_cursor_is_a_400(api: Any, cursor: str) -> None:
    r = api(cursor=cursor)
    assert r.status_code == 400
    assert r.json() == {"error": "cursor is not one this API returned (use nextCursor as given)"}


def test_the_admin_key_list_pages_and_filters_by_user(admin_client: Client) -> None:
    make_keys({"ann": 120, "bob": 2})
    url = "/admin/accounts/clientkey/"
    page = admin_client.get(url)
    assert page.status_code == 200
    assert len(page.context["cl"].result_list) == 100
    assert page.context["cl"].result_count == 122
    assert 'href="?user=bob"' in page.content.decode()

    bob = admin_client.get(url, {"user": "bob"})
    assert bob.status_code == 200
    assert {k.user.username for k in bob.context["cl"].result_list} == {"bob"}
    assert bob.context["cl"].result_count == 2
