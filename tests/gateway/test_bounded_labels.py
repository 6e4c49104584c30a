"""Bounded metric labels and model names (issue #26, point 7), end to end.

Any `provider/<name>` goes upstream, but `/metrics` names only configured combos and declared
models: an undeclared model counts as `provider/(other)`. A model name longer than 256
characters is refused with 400 before anything is routed.
"""

from __future__ import annotations

import re
import uuid

from tests.conftest import Mock, Server

KEY = "sk-test-bounded-labels-aaaaaaaaaaaa"
SAMPLE = re.compile(r"^(ocx_[a-z_]+)\{([^}]*)\}", re.MULTILINE)


def series(server: Server) -> set[str]:
    """Every labelled ocx series on /metrics (name and labels, without the value)."""
    r = server.http.get("/metrics")
    assert r.status_code == 200
    return {f"{m.group(1)}{{{m.group(2)}}}" for m in SAMPLE.finditer(r.text)}


def test_distinct_model_names_do_not_grow_metrics(server: Server, mock: Mock) -> None:
    name = "bl" + uuid.uuid4().hex[:6]
    declared = "declared-" + uuid.uuid4().hex[:6]
    server.put_provider(
        name,
        {
            "adapter": "openai-responses",
            "baseUrl": mock.url + "/v1",
            "apiKey": KEY,
            "models": {declared: {"contextWindow": 100000}},
        },
    )
    server.wait_synced()
    headers = {"Authorization": f"Bearer {server.create_key()}"}

    def ask(model: str) -> int:
        body = {"model": model, "input": "hi"}
        return server.http.post("/v1/responses", json=body, headers=headers).status_code

    # One of each kind first: the series they create are the bounded set.
    assert ask(f"{name}/{declared}") == 200
    assert ask(f"{name}/undeclared-first") == 200
    assert ask(f"{name}/" + "x" * 300) == 400
    before = series(server)
    assert f'target="{name}/(other)"' in str(before)

    statuses = []
    for i in range(25):
        statuses.append(ask(f"{name}/undeclared-{i}-{uuid.uuid4().hex}"))
        statuses.append(ask(f"{name}/{i}-" + "y" * (257 + i)))
    assert statuses.count(200) == 25 and statuses.count(400) == 25
    after = series(server)
    assert after == before
    assert "undeclared-" not in str(after) and "yyyy" not in str(after)
    # The undeclared models did go upstream, by their own names.
    assert sum(1 for e in mock.log() if e["model"].startswith("undeclared-")) == 26


def test_a_model_name_over_256_characters_is_400(server: Server, mock: Mock) -> None:
    headers = {"Authorization": f"Bearer {server.create_key()}"}
    model = "combo/" + "z" * 251  # 257 characters
    r = server.http.post("/v1/responses", json={"model": model}, headers=headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "type": "invalid_request_error",
        "code": "model_too_long",
        "message": "model must be at most 256 characters (got 257)",
    }
    # 256 is still a name (an unknown one here).
    r = server.http.post("/v1/responses", json={"model": model[:-1]}, headers=headers)
    assert r.status_code == 404, r.text
    assert mock.log() == []
