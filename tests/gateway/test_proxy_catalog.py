"""Model catalog and native aliases, end to end through a real server and mock upstream."""

from __future__ import annotations

from tests.conftest import Mock, Server


def _setup(server: Server, mock: Mock) -> str:
    server.put_provider(
        "up",
        {
            "adapter": "openai-responses",
            "baseUrl": mock.url + "/v1",
            "apiKey": "sk-test-up-aaaaaaaaaaaaaaaaaaaaaaaa",
            "models": {"cat-m1": {"contextWindow": 100000, "inputModalities": ["text"]}},
        },
    )
    server.put_combo(
        "sol",
        {
            "targets": [{"provider": "up", "model": "cat-m1"}],
            "alias": "gpt-5.6-sol",
            "nativeAlias": True,
            "displayName": "Team Sol",
        },
    )
    key = server.create_key()
    server.wait_synced()
    return key


def test_native_alias_captures_bare_slug(server: Server, mock: Mock) -> None:
    key = _setup(server, mock)
    headers = {"Authorization": f"Bearer {key}"}
    r = server.http.post(
        "/v1/responses", json={"model": "gpt-5.6-sol", "input": "hi"}, headers=headers
    )
    assert r.status_code == 200, r.text
    assert r.headers["x-ocx-combo"] == "sol"
    assert r.headers["x-ocx-target"] == "up/cat-m1"
    assert mock.hits("cat-m1") == 1
    # The canonical id keeps working too.
    r = server.http.post(
        "/v1/responses", json={"model": "combo/sol", "input": "hi"}, headers=headers
    )
    assert r.status_code == 200
    assert mock.hits("cat-m1") == 2


def test_models_list_and_catalog_show_the_alias_once(server: Server, mock: Mock) -> None:
    key = _setup(server, mock)
    listing = server.http.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
    ids = [m["id"] for m in listing["data"]]
    assert listing["object"] == "list"
    assert ids.count("gpt-5.6-sol") == 1
    assert {m["id"]: m["owned_by"] for m in listing["data"]}["gpt-5.6-sol"] == "combo"
    catalog = server.api.get("/api/catalog").json()
    rows = [row for row in catalog["models"] if row["slug"] == "gpt-5.6-sol"]
    assert len(rows) == 1
    assert rows[0]["display_name"] == "Team Sol"


def test_removing_native_alias_restores_plain_routing(server: Server, mock: Mock) -> None:
    key = _setup(server, mock)
    r = server.api.delete("/api/combos", params={"id": "sol"})
    assert r.status_code == 200
    server.wait_synced()
    r = server.http.post(
        "/v1/responses",
        json={"model": "gpt-5.6-sol", "input": "hi"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 404
    assert mock.hits("cat-m1") == 0
