"""`ocx config load|dump` (PRODUCT.md §3.4) and the config version (PRODUCT.md §4.2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from combos import selectors
from ocxsite.cli import main
from providers import services as provider_services
from providers.models import ConfigState, Provider
from providers.sealing import unseal

pytestmark = pytest.mark.django_db

TOKEN = "test-admin-token-for-config-tests"
SECRET = "sk-test-config-secret-0123456789"

DOC: dict[str, Any] = {
    "providers": {
        "a": {
            "adapter": "openai-responses",
            "baseUrl": "http://127.0.0.1:9/v1",
            "apiKey": SECRET,
            "timeouts": {"idleMs": 30000},
            "models": {"m1": {"contextWindow": 200000, "reasoningEfforts": ["low", "high"]}},
        },
        "b": {
            "adapter": "anthropic",
            "baseUrl": "https://api.anthropic.example/v1",
            "apiKeyEnv": "B_KEY",
            "headers": {"anthropic-beta": "x"},
        },
        "off": {"adapter": "openai-chat", "baseUrl": "http://127.0.0.1:9/v1", "disabled": True},
    },
    "combos": {
        "main": {
            "targets": [
                {"provider": "a", "model": "m1", "weight": 2},
                {"provider": "b", "model": "claude", "lastResort": True},
            ],
            "strategy": "round-robin",
            "stickyLimit": 2,
            "cooldownMs": 30000,
            "waitForCooldownMs": 500,
            "cooldownWaitPolicy": "before-last-resort",
            "defaultEffort": "high",
            "defaultEffortMode": "force",
            "reasoningEffortMode": "adaptive",
            "imageInput": "disabled",
            "alias": "team/main",
            "displayName": "Main",
        },
        "plain": {"targets": [{"provider": " a ", "model": " m1 "}], "strategy": "failover"},
        # All targets disabled: allowed at load time (not at API save time).
        "dead": {"targets": [{"provider": "off", "model": "x"}]},
    },
    "disabledModels": ["combo/dead"],
}


def version() -> int:
    state = ConfigState.objects.filter(pk=1).first()
    return 0 if state is None else state.version


def write(tmp_path: Path, doc: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def dump(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run(capsys, "config", "dump")
    assert code == 0, err
    return json.loads(out)


def provider(name: str) -> None:
    provider_services.provider_set(
        name=name, raw={"adapter": "openai-responses", "baseUrl": "http://127.0.0.1:9/v1"}
    )


def test_load_and_dump(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "config", "load", str(write(tmp_path, DOC)))
    assert code == 0, err
    assert out.startswith("Loaded 3 providers and 3 combos from ")
    data = dump(capsys)
    assert data == {
        "providers": {
            "a": {
                "adapter": "openai-responses",
                "baseUrl": "http://127.0.0.1:9/v1",
                "timeouts": {"idleMs": 30000},
                "models": {"m1": {"contextWindow": 200000, "reasoningEfforts": ["low", "high"]}},
            },
            "b": {
                "adapter": "anthropic",
                "baseUrl": "https://api.anthropic.example/v1",
                "apiKeyEnv": "B_KEY",
                "headers": {"anthropic-beta": "x"},
            },
            "off": {"adapter": "openai-chat", "baseUrl": "http://127.0.0.1:9/v1", "disabled": True},
        },
        "combos": {
            "dead": {
                "strategy": "failover",
                "stickyLimit": 1,
                "defaultEffort": None,
                "targets": [{"provider": "off", "model": "x", "weight": 1}],
            },
            "main": {
                "strategy": "round-robin",
                "stickyLimit": 2,
                "cooldownMs": 30000,
                "waitForCooldownMs": 500,
                "cooldownWaitPolicy": "before-last-resort",
                "defaultEffort": "high",
                "defaultEffortMode": "force",
                "reasoningEffortMode": "adaptive",
                "imageInput": "disabled",
                "alias": "team/main",
                "displayName": "Main",
                "targets": [
                    {"provider": "a", "model": "m1", "weight": 2},
                    {"provider": "b", "model": "claude", "weight": 1, "lastResort": True},
                ],
            },
            "plain": {
                "strategy": "failover",
                "stickyLimit": 1,
                "defaultEffort": None,
                "targets": [{"provider": "a", "model": "m1", "weight": 1}],
            },
        },
        "disabledModels": ["combo/dead"],
    }
    assert SECRET not in json.dumps(data)
    assert unseal(Provider.objects.get(name="a").api_key_sealed) == SECRET


def test_load_dump_load_is_a_fixed_point(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "config", "load", str(write(tmp_path, DOC)))[0] == 0
    first = dump(capsys)
    assert run(capsys, "config", "load", str(write(tmp_path, first, "d1.json")))[0] == 0
    second = dump(capsys)
    assert second == first
    assert (
        run(capsys, "config", "load", str(write(tmp_path, second, "d2.json")), "--replace")[0] == 0
    )
    assert dump(capsys) == first
    # The dumped file has no secret, and loading it kept the stored key.
    assert unseal(Provider.objects.get(name="a").api_key_sealed) == SECRET


def test_dump_text_is_stable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "config", "load", str(write(tmp_path, DOC)))[0] == 0
    text1 = run(capsys, "config", "dump")[1]
    path = tmp_path / "dump.json"
    path.write_text(text1, encoding="utf-8")
    assert run(capsys, "config", "load", str(path), "--replace")[0] == 0
    assert run(capsys, "config", "dump")[1] == text1


def test_load_is_atomic_and_lists_every_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    provider("keep")
    before = selectors.config_dump()
    v = version()
    bad = {
        "providers": {
            "p": {"adapter": "openai-chat", "baseUrl": "http://127.0.0.1:9/v1"},
            "q": {"adapter": "bogus", "baseUrl": "http://127.0.0.1:9/v1"},
        },
        "combos": {
            "good": {"targets": [{"provider": "p", "model": "m"}]},
            "bad": {"targets": [{"provider": "p", "model": "m"}], "stickyLimit": 0},
        },
    }
    code, out, err = run(capsys, "config", "load", str(write(tmp_path, bad)))
    assert code != 0
    assert out == ""
    assert "nothing changed" in err
    assert 'adapter must be "openai-responses"' in err
    assert "stickyLimit must be an integer from 1 to 100" in err
    assert "providers.q.adapter" in err
    assert "combos.bad.stickyLimit" in err
    assert selectors.config_dump() == before
    assert version() == v
    assert sorted(p.name for p in Provider.objects.all()) == ["keep"]


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"combos": []}, "combos must be an object"),
        ({"providers": []}, "providers must be an object"),
        ([], "config must be an object"),
        ({"unknownKey": 1}, 'unknown field "unknownKey"'),
        ({"disabledModels": "x"}, "disabledModels must be an array of strings"),
        (
            {
                "providers": {"p": {"adapter": "openai-chat", "baseUrl": "http://x"}},
                "combos": {
                    "c1": {"targets": [{"provider": "p", "model": "m"}], "alias": "dup"},
                    "c2": {"targets": [{"provider": "p", "model": "n"}], "alias": "dup"},
                },
            },
            'alias "dup" is already used by combo "c1"',
        ),
        (
            {"combos": {"c1": {"targets": [{"provider": "ghost", "model": "m"}]}}},
            'targets[0].provider "ghost" is not configured',
        ),
    ],
)
def test_load_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: object, fragment: str
) -> None:
    provider("keep")
    before = selectors.config_dump()
    v = version()
    code, out, err = run(capsys, "config", "load", str(write(tmp_path, doc)))
    assert code != 0
    assert fragment in err
    assert selectors.config_dump() == before
    assert version() == v


def test_load_unreadable_and_invalid_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "config", "load", str(tmp_path / "missing.json"))
    assert code != 0 and err.startswith("ocx: cannot read ")
    path = tmp_path / "broken.json"
    path.write_text("{", encoding="utf-8")
    code, _, err = run(capsys, "config", "load", str(path))
    assert code != 0 and "is not valid JSON" in err
    code, _, err = run(capsys, "config", "load", str(path), "--force")
    assert code != 0 and err == "ocx: unexpected argument --force\n"
    assert version() == 0


def test_merge_vs_replace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "config", "load", str(write(tmp_path, DOC)))[0] == 0
    extra = {
        "providers": {"c": {"adapter": "openai-chat", "baseUrl": "http://127.0.0.1:9/c"}},
        "combos": {"plain": {"targets": [{"provider": "c", "model": "z"}]}},
    }
    # Merge: new entries added, same-named entries replaced, the rest kept.
    assert run(capsys, "config", "load", str(write(tmp_path, extra, "extra.json")))[0] == 0
    merged = dump(capsys)
    assert sorted(merged["providers"]) == ["a", "b", "c", "off"]
    assert sorted(merged["combos"]) == ["dead", "main", "plain"]
    assert merged["combos"]["plain"]["targets"] == [{"provider": "c", "model": "z", "weight": 1}]
    assert merged["combos"]["main"] == dump_of(DOC)["combos"]["main"]
    assert merged["disabledModels"] == ["combo/dead"]
    assert unseal(Provider.objects.get(name="a").api_key_sealed) == SECRET
    # Replace: exactly the document.
    assert (
        run(capsys, "config", "load", str(write(tmp_path, extra, "extra.json")), "--replace")[0]
        == 0
    )
    replaced = dump(capsys)
    assert sorted(replaced["providers"]) == ["c"]
    assert sorted(replaced["combos"]) == ["plain"]
    assert replaced["disabledModels"] == []


def test_merge_can_reference_stored_providers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    provider("a")
    doc = {"combos": {"c": {"targets": [{"provider": "a", "model": "m"}]}}}
    assert run(capsys, "config", "load", str(write(tmp_path, doc)))[0] == 0
    assert sorted(dump(capsys)["combos"]) == ["c"]
    code, _, err = run(capsys, "config", "load", str(write(tmp_path, doc)), "--replace")
    assert code != 0
    assert 'targets[0].provider "a" is not configured' in err


def dump_of(doc: dict[str, Any]) -> dict[str, Any]:
    from routing import validate

    return validate.config_to_sparse(validate.normalize_config(doc))


def test_dump_matches_engine_sparse_form(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "config", "load", str(write(tmp_path, DOC)))[0] == 0
    assert dump(capsys) == dump_of(DOC)


# --- the config version: +1 per write, in every path ---


def test_version_bumps_once_per_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], settings: Any, client: Client
) -> None:
    settings.OCX_ADMIN_TOKEN = TOKEN
    auth = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

    def put(url: str, body: object) -> int:
        r = client.put(url, data=json.dumps(body), content_type="application/json", **auth)
        return r.status_code

    def cli(*argv: str) -> int:
        return 200 if main(list(argv)) == 0 else 500

    one = [{"provider": "a", "model": "m"}]
    other = [{"provider": "a", "model": "n"}]
    loaded = str(write(tmp_path, DOC))
    steps: list[tuple[str, Any]] = [
        (
            "api provider put",
            lambda: put("/api/providers", {"name": "a", "provider": DOC["providers"]["b"]}),
        ),
        ("api combo put", lambda: put("/api/combos", {"id": "c1", "combo": {"targets": one}})),
        (
            "api combo replace",
            lambda: put("/api/combos", {"id": "c1", "combo": {"targets": other}}),
        ),
        (
            "api combo rename",
            lambda: put(
                "/api/combos", {"id": "c2", "renameFrom": "c1", "combo": {"targets": other}}
            ),
        ),
        ("api combo delete", lambda: client.delete("/api/combos?id=c2", **auth).status_code),
        ("cli combo set", lambda: cli("combo", "set", "c3", "--targets", "a/m")),
        ("cli combo mode", lambda: cli("combo", "mode", "c3", "pin", "a/m")),
        ("cli combo remove", lambda: cli("combo", "remove", "c3", "--yes")),
        (
            "cli provider set",
            lambda: cli(
                "provider", "set", "p9", "--adapter", "openai-chat", "--base-url", "http://x"
            ),
        ),
        ("cli provider remove", lambda: cli("provider", "remove", "p9", "--yes")),
        ("config load", lambda: cli("config", "load", loaded)),
        ("config load --replace", lambda: cli("config", "load", loaded, "--replace")),
        ("api provider delete", lambda: client.delete("/api/providers?name=b", **auth).status_code),
    ]
    # "b" is used by combo "main" after the load: delete the combo first through the API.
    for label, step in steps:
        if label == "api provider delete":
            before = version()
            assert client.delete("/api/combos?id=main", **auth).status_code == 200, label
            assert version() == before + 1, "api combo delete (main)"
        before = version()
        assert step() == 200, label
        assert version() == before + 1, label
    # Failed writes and reads do not bump.
    before = version()
    assert put("/api/combos", {"id": "bad", "combo": {"targets": []}}) == 400
    assert client.get("/api/combos", **auth).status_code == 200
    assert main(["combo", "set", "x", "--targets", "ghost/m"]) != 0
    assert main(["config", "dump"]) == 0
    assert version() == before


def test_disabled_models_are_normalized_on_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = {**DOC, "disabledModels": [" combo/dead ", "b/x", "combo/dead", "A/y"]}
    assert run(capsys, "config", "load", str(write(tmp_path, doc)))[0] == 0
    assert dump(capsys)["disabledModels"] == dump_of(doc)["disabledModels"]
    assert sorted(selectors.config_snapshot().disabled_models) == ["A/y", "b/x", "combo/dead"]
