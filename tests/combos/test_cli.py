"""`ocx combo|provider|key …` (combos-behaviour.md §8.4, PRODUCT.md §4.4) in-process."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from accounts import access
from accounts.models import ClientKey
from combos import selectors
from ocxsite.cli import main
from providers import services as provider_services
from providers.models import ConfigState, Provider

pytestmark = pytest.mark.django_db


def version() -> int:
    state = ConfigState.objects.filter(pk=1).first()
    return 0 if state is None else state.version


def provider(name: str, *, disabled: bool = False) -> None:
    raw: dict[str, object] = {"adapter": "openai-responses", "baseUrl": "http://127.0.0.1:9/v1"}
    if disabled:
        raw["disabled"] = True
    provider_services.provider_set(name=name, raw=raw)


@pytest.fixture
def providers() -> None:
    provider("a")
    provider("b")
    provider("ollama")


class Run:
    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(list(argv))
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok(self, *argv: str) -> str:
        code, out, err = self(*argv)
        assert code == 0, err
        # These providers declare no models: `combo set` warns about each target
        # (test_set_warns_about_an_undeclared_model checks those lines).
        assert [line for line in err.splitlines() if not line.startswith("warning: Target ")] == []
        return out

    def fail(self, *argv: str) -> str:
        """The command fails with one line on stderr, nothing on stdout, and changes nothing."""
        before = selectors.config_dump()
        v = version()
        code, out, err = self(*argv)
        assert code != 0
        assert out == ""
        assert err.endswith("\n") and err.count("\n") == 1, err
        assert err.startswith("ocx: ")
        assert selectors.config_dump() == before
        assert version() == v
        return err[len("ocx: ") :].rstrip("\n")


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    return Run(capsys)


def stored(combo_id: str) -> dict[str, Any]:
    return selectors.config_dump()["combos"][combo_id]  # type: ignore[index]


# --- list / show ---


def test_list_empty(run: Run) -> None:
    assert run.ok("combo", "list") == "No combos configured.\n"
    assert run.ok("combo") == "No combos configured.\n"
    assert run.ok("route", "combo", "list") == "No combos configured.\n"


def test_list_lines(run: Run, providers: None) -> None:
    run.ok("combo", "set", "main", "--targets", "a/m1")
    run.ok("combo", "set", "fast", "--targets", "b/m2", "--alias", "team/fast")
    assert run.ok("combo", "list") == "fast  team/fast\nmain  combo/main\n"
    data = json.loads(run.ok("combo", "list", "--json"))
    assert [c["id"] for c in data["combos"]] == ["fast", "main"]
    assert data["combos"][1]["model"] == "combo/main"


def test_list_via_call_command(providers: None) -> None:
    out = io.StringIO()
    call_command("combo", "set", "main", "--targets", "a/m1", stdout=out)
    assert out.getvalue() == "Saved combo main.\n"
    out = io.StringIO()
    call_command("combo", "list", stdout=out)
    assert out.getvalue() == "main  combo/main\n"
    with pytest.raises(CommandError, match="^unknown combo command x$"):
        call_command("combo", "x")


def test_show(run: Run, providers: None) -> None:
    run.ok("combo", "set", "main", "--targets", "a/m1,b/m2:3", "--effort", "high")
    out = run.ok("combo", "show", "main")
    assert out.splitlines()[0] == "main  combo/main"
    assert "a/m1" in out and "b/m2" in out
    data = json.loads(run.ok("combo", "show", "main", "--json"))
    assert data["id"] == "main"
    assert data["model"] == "combo/main"
    assert data["defaultEffort"] == "high"
    assert data["targets"][1] == {"provider": "b", "model": "m2", "weight": 3, "lastResort": False}


def test_show_unknown(run: Run) -> None:
    assert run.fail("combo", "show", "ghost") == "unknown combo ghost"
    assert run.fail("combo", "show", "constructor") == "unknown combo constructor"


def test_unknown_subcommand(run: Run) -> None:
    assert run.fail("combo", "x") == "unknown combo command x"
    assert run.fail("route", "combo", "frobnicate") == "unknown combo command frobnicate"


# --- set ---


def test_set_target_parsing(run: Run, providers: None) -> None:
    v = version()
    out = run.ok("combo", "set", "main", "--targets", " ollama/qwen3:4b , a/m:3, b/x/y:z ")
    assert out == "Saved combo main.\n"
    assert version() == v + 1
    assert stored("main") == {
        "strategy": "failover",
        "stickyLimit": 1,
        "defaultEffort": None,
        "targets": [
            {"provider": "ollama", "model": "qwen3:4b", "weight": 1},
            {"provider": "a", "model": "m", "weight": 3},
            {"provider": "b", "model": "x/y:z", "weight": 1},
        ],
    }


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        ("nomodel", 'invalid target "nomodel"; use provider/model[:weight]'),
        ("/m1", 'invalid target "/m1"; use provider/model[:weight]'),
        ("a/", 'invalid target "a/"; use provider/model[:weight]'),
        ("a/m1,b", 'invalid target "b"; use provider/model[:weight]'),
        ("a/m:0", "target weight must be 1-10000: a/m:0"),
        ("a/m:10001", "target weight must be 1-10000: a/m:10001"),
        ("", "--targets requires at least one provider/model"),
        (" , ", "--targets requires at least one provider/model"),
    ],
)
def test_set_invalid_targets(run: Run, providers: None, targets: str, message: str) -> None:
    assert run.fail("combo", "set", "main", "--targets", targets) == message


def test_set_usage_errors(run: Run, providers: None) -> None:
    assert run.fail("combo", "set", "--targets", "a/m1") == "combo id is required"
    assert run.fail("combo", "set", "main") == "--targets is required"
    assert (
        run.fail(
            "combo",
            "set",
            "main",
            "--targets",
            "a/m1",
            "--strategy",
            "round-robin",
            "--sticky",
            "101",
        )
        == "--sticky must be <= 100"
    )
    assert run.fail("combo", "set", "main", "--targets", "a/m1", "--bogus").startswith(
        "unexpected argument"
    )
    assert "strategy" in run.fail("combo", "set", "main", "--targets", "a/m1", "--strategy", "best")
    assert "effort" in run.fail("combo", "set", "main", "--targets", "a/m1", "--effort", "turbo")


def test_set_server_validation_errors(run: Run, providers: None) -> None:
    assert (
        run.fail("combo", "set", "main", "--targets", "ghost/m1")
        == 'targets[0].provider "ghost" is not configured'
    )
    assert run.fail("combo", "set", "bad!", "--targets", "a/m1").startswith("combo id must start")
    provider("off", disabled=True)
    assert (
        run.fail("combo", "set", "main", "--targets", "off/m1")
        == "targets must include at least one enabled provider"
    )


def test_set_strategy_and_sticky(run: Run, providers: None) -> None:
    run.ok(
        "combo",
        "set",
        "rr",
        "--targets",
        "a/m1:2,b/m2",
        "--strategy",
        "round-robin",
        "--sticky",
        "3",
    )
    assert stored("rr")["strategy"] == "round-robin"
    assert stored("rr")["stickyLimit"] == 3
    # --sticky is sent only for round-robin.
    run.ok("combo", "set", "fo", "--targets", "a/m1", "--sticky", "7")
    assert stored("fo")["stickyLimit"] == 1


def test_set_effort_and_clear(run: Run, providers: None) -> None:
    run.ok("combo", "set", "e", "--targets", "a/m1", "--effort", "xhigh")
    assert stored("e")["defaultEffort"] == "xhigh"
    # Omitted --effort keeps it.
    run.ok("combo", "set", "e", "--targets", "a/m1")
    assert stored("e")["defaultEffort"] == "xhigh"
    run.ok("combo", "set", "e", "--targets", "a/m1", "--effort", "-")
    assert stored("e")["defaultEffort"] is None


def test_set_alias_and_clear(run: Run, providers: None) -> None:
    run.ok("combo", "set", "al", "--targets", "a/m1", "--alias", "daily")
    assert stored("al")["alias"] == "daily"
    assert run.ok("combo", "list") == "al  daily\n"
    run.ok("combo", "set", "al", "--targets", "a/m1")
    assert stored("al")["alias"] == "daily"
    run.ok("combo", "set", "al", "--targets", "a/m1", "--alias", "-")
    assert "alias" not in stored("al")
    assert run.ok("combo", "list") == "al  combo/al\n"


def test_set_native_alias(run: Run, providers: None) -> None:
    assert (
        run.fail("combo", "set", "n", "--targets", "a/m1", "--alias", "gpt-5.5")
        == "bare aliases in the OpenAI native family require nativeAlias=true"
    )
    assert (
        run.fail("combo", "set", "n", "--targets", "a/m1", "--alias", "gpt-5.5", "--native-alias")
        == "displayName is required for native aliases"
    )
    run.ok(
        "combo",
        "set",
        "n",
        "--targets",
        "a/m1",
        "--alias",
        "gpt-5.5",
        "--native-alias",
        "--display-name",
        "Routed",
    )
    assert stored("n")["nativeAlias"] is True
    assert stored("n")["alias"] == "gpt-5.5"
    assert stored("n")["displayName"] == "Routed"


def test_set_display_name_clear(run: Run, providers: None) -> None:
    run.ok("combo", "set", "d", "--targets", "a/m1", "--display-name", "Nice")
    assert stored("d")["displayName"] == "Nice"
    run.ok("combo", "set", "d", "--targets", "a/m1", "--display-name", "-")
    assert "displayName" not in stored("d")


def test_set_keeps_image_input_and_preserved_fields(run: Run, providers: None) -> None:
    from combos import services

    services.combo_set(
        combo_id="keep",
        raw={
            "targets": [
                {"provider": "a", "model": "m1", "lastResort": True},
                {"provider": "b", "model": "m2"},
            ],
            "imageInput": "disabled",
            "cooldownMs": 9000,
            "waitForCooldownMs": 100,
            "reasoningEffortMode": "adaptive",
            "cooldownWaitPolicy": "before-last-resort",
        },
    )
    run.ok("combo", "set", "keep", "--targets", "a/m1,b/m2")
    assert stored("keep") == {
        "strategy": "failover",
        "stickyLimit": 1,
        "cooldownMs": 9000,
        "waitForCooldownMs": 100,
        "cooldownWaitPolicy": "before-last-resort",
        "defaultEffort": None,
        "reasoningEffortMode": "adaptive",
        "imageInput": "disabled",
        "targets": [
            {"provider": "a", "model": "m1", "weight": 1, "lastResort": True},
            {"provider": "b", "model": "m2", "weight": 1},
        ],
    }


def test_set_json(run: Run, providers: None) -> None:
    data = json.loads(run.ok("combo", "set", "j", "--targets", "a/m1", "--json"))
    assert data == {
        "success": True,
        "id": "j",
        "model": "combo/j",
        "combo": {
            "strategy": "failover",
            "stickyLimit": 1,
            "defaultEffort": None,
            "targets": [{"provider": "a", "model": "m1", "weight": 1}],
        },
        "warnings": [
            'Target a/m1: provider "a" does not declare model "m1" (declared: none); it is sent '
            "upstream as typed, and the combo is left out of the Codex catalog until the model "
            "is declared."
        ],
    }


@pytest.mark.parametrize("verb", ["create", "update"])
def test_create_update_aliases(run: Run, providers: None, verb: str) -> None:
    assert run.ok("combo", verb, "x1", "--targets", "a/m1") == "Saved combo x1.\n"
    assert run.ok("route", "combo", verb, "x2", "--targets", "b/m1") == "Saved combo x2.\n"
    assert sorted(selectors.config_dump()["combos"]) == ["x1", "x2"]  # type: ignore[arg-type]


def test_rename_from(run: Run, providers: None) -> None:
    run.ok("combo", "set", "old", "--targets", "a/m1", "--alias", "keepme", "--effort", "low")
    v = version()
    assert run.ok("combo", "set", "new", "--targets", "a/m1", "--rename-from", "old") == (
        "Saved combo new.\n"
    )
    assert version() == v + 1
    combos = selectors.config_dump()["combos"]
    assert list(combos) == ["new"]  # type: ignore[arg-type]
    assert combos["new"]["alias"] == "keepme"  # type: ignore[index]
    assert combos["new"]["defaultEffort"] == "low"  # type: ignore[index]
    assert (
        run.fail("combo", "set", "x", "--targets", "a/m1", "--rename-from", "ghost")
        == 'combo "ghost" does not exist'
    )
    assert (
        run.fail("combo", "set", "new", "--targets", "a/m1", "--rename-from", "new")
        == "renameFrom must differ from id"
    )
    run.ok("combo", "set", "other", "--targets", "b/m1")
    assert (
        run.fail("combo", "set", "other", "--targets", "a/m1", "--rename-from", "new")
        == 'combo "other" already exists'
    )


# --- remove ---


def test_remove(run: Run, providers: None) -> None:
    run.ok("combo", "set", "r1", "--targets", "a/m1")
    run.ok("combo", "set", "r2", "--targets", "a/m1")
    assert run.fail("combo", "remove", "r1") == "remove requires --yes"
    assert run.fail("combo", "remove", "--yes") == "combo id is required"
    assert run.fail("combo", "remove", "ghost", "--yes") == "unknown combo"
    v = version()
    assert run.ok("combo", "remove", "r1", "--yes") == "Removed combo r1.\n"
    assert version() == v + 1
    assert run.ok("combo", "delete", "r2", "--yes") == "Removed combo r2.\n"
    assert run.ok("combo", "list") == "No combos configured.\n"


def test_route_combo_remove(run: Run, providers: None) -> None:
    run.ok("combo", "set", "r1", "--targets", "a/m1")
    assert run.ok("route", "combo", "remove", "r1", "--yes") == "Removed combo r1.\n"
    assert selectors.config_dump()["combos"] == {}


# --- mode ---


def test_mode_pin_and_auto(run: Run, providers: None) -> None:
    run.ok("combo", "set", "m", "--targets", "a/m1,b/m2")
    v = version()
    out = run.ok("combo", "mode", "m", "pin", "b/m2")
    assert "b/m2" in out
    assert version() == v + 1
    assert stored("m")["override"] == {"target": "b/m2"}
    assert "mode: pin b/m2" in run.ok("combo", "show", "m")
    # A `set` that keeps the pinned target keeps the pin.
    run.ok("combo", "set", "m", "--targets", "a/m1,b/m2,a/m3")
    assert stored("m")["override"] == {"target": "b/m2"}
    run.ok("combo", "mode", "m", "auto")
    assert "override" not in stored("m")
    assert "mode: auto" in run.ok("combo", "show", "m")


def test_mode_errors(run: Run, providers: None) -> None:
    run.ok("combo", "set", "m", "--targets", "a/m1")
    assert (
        run.fail("combo", "mode", "m", "pin", "b/zz")
        == 'override target "b/zz" is not one of this combo\'s targets'
    )
    assert run.fail("combo", "mode", "ghost", "auto") == "unknown combo ghost"
    assert run.fail("combo", "mode", "m").startswith("usage:")


# --- provider ---


def test_provider_commands(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run.ok("provider", "list").startswith("No providers configured.")
    v = version()
    out = run.ok(
        "provider",
        "set",
        "p1",
        "--adapter",
        "openai-chat",
        "--base-url",
        "https://x.example/v1",
        "--api-key-env",
        "P1_KEY",
        "--header",
        "X-Team=core",
        "--model",
        "m1:128000",
    )
    assert out == "Saved provider p1.\n"
    assert version() == v + 1
    assert run.ok("provider", "list") == "p1  openai-chat  https://x.example/v1\n"
    shown = json.loads(run.ok("provider", "show", "p1"))
    assert shown == {
        "name": "p1",
        "adapter": "openai-chat",
        "baseUrl": "https://x.example/v1",
        "apiKeyEnv": "P1_KEY",
        "headers": {"X-Team": "core"},
        "models": {"m1": {"contextWindow": 128000}},
        "apiKeySet": False,
    }
    # Secret from stdin: stored, never printed.
    monkeypatch.setattr("sys.stdin", io.StringIO("sk-test-cli-secret-value\n"))
    run.ok("provider", "set", "p1", "--api-key-stdin", "--disabled")
    shown_text = run.ok("provider", "show", "p1")
    assert "sk-test-cli-secret-value" not in shown_text
    assert json.loads(shown_text)["apiKeySet"] is True
    assert json.loads(shown_text)["disabled"] is True
    run.ok("provider", "set", "p1", "--max-connections", "2000")
    assert json.loads(run.ok("provider", "show", "p1"))["maxConnections"] == 2000
    assert run.fail("provider", "set", "p1", "--max-connections", "0") == (
        "maxConnections must be an integer from 1 to 1000000"
    )
    assert run.fail("provider", "set", "p1", "--max-connections", "many") == (
        "maxConnections must be an integer from 1 to 1000000"
    )
    run.ok("provider", "set", "p1", "--max-connections", "-")
    assert "maxConnections" not in json.loads(run.ok("provider", "show", "p1"))
    assert run.ok("provider", "list") == "p1  openai-chat  https://x.example/v1 (disabled)\n"
    assert run.fail("provider", "show", "ghost") == "unknown provider ghost"
    assert run.fail("provider", "set", "p2", "--adapter", "nope", "--base-url", "https://x") == (
        'adapter must be "openai-responses", "openai-chat", "anthropic", or "chatgpt"'
    )
    assert run.fail("provider", "frob") == "unknown provider command frob"
    assert run.fail("provider", "remove", "p1") == "remove requires --yes"
    assert run.ok("provider", "remove", "p1", "--yes") == "Removed provider p1.\n"
    assert not Provider.objects.exists()


def test_provider_remove_guard(run: Run, providers: None) -> None:
    run.ok("combo", "set", "c2", "--targets", "a/m1")
    run.ok("combo", "set", "c1", "--targets", "b/x,a/m2")
    assert run.fail("provider", "remove", "a", "--yes") == (
        'provider "a" is used by combos (combos: c1, c2)'
    )


# --- keys ---


def test_key_create_and_revoke(run: Run) -> None:
    out = run.ok("key", "create", "--user", "alice", "--create-user", "--name", "laptop")
    lines = out.splitlines()
    assert len(lines) == 2
    secret = lines[1]
    assert secret.startswith("ocx_")
    assert "shown only once" in lines[0]
    key = ClientKey.objects.get()
    assert key.user.get_username() == "alice"
    assert secret not in key.digest and key.digest == access.digest(secret)
    assert access.digest(secret) in access.client_keys_active()
    listing = run.ok("key", "list")
    assert secret not in listing
    assert "alice" in listing and "active" in listing
    assert run.ok("key", "revoke", str(key.pk)) == f"Revoked key {key.pk}.\n"
    assert access.digest(secret) not in access.client_keys_active()
    assert run.fail("key", "revoke", str(key.pk)) == f"no active key {key.pk}"
    assert run.fail("key", "revoke", "abc") == "usage: ocx key revoke ID"
    assert "revoked" in run.ok("key", "list")


def test_key_create_requires_user(run: Run) -> None:
    code, out, err = run("key", "create")
    assert code != 0
    assert out == ""
    assert err.count("\n") == 1 and "--user" in err
    assert not ClientKey.objects.exists()


def test_unknown_top_level_command(run: Run) -> None:
    code, out, err = run("frob")
    assert code == 2
    assert err.startswith("ocx: unknown command 'frob'")


def test_set_warns_about_an_undeclared_model(run: Run) -> None:
    # Issue 28 item 6: a mistyped model saved silently and the combo left the catalog.
    provider_services.provider_set(
        name="anthropic",
        raw={
            "adapter": "anthropic",
            "baseUrl": "http://127.0.0.1:9/v1",
            "models": {"claude-sonnet-4-5": {"contextWindow": 200000}, "claude-opus-4-5": {}},
        },
    )
    code, out, err = run("combo", "set", "team", "--targets", "anthropic/claude-sonet-4-5")
    assert (code, out) == (0, "Saved combo team.\n")
    assert err == (
        'warning: Target anthropic/claude-sonet-4-5: provider "anthropic" does not declare '
        'model "claude-sonet-4-5" (declared: claude-opus-4-5, claude-sonnet-4-5); it is sent '
        "upstream as typed, and the combo is left out of the Codex catalog until the model is "
        "declared.\n"
    )
    code, out, err = run(
        "combo", "set", "team", "--targets", "anthropic/claude-sonnet-4-5", "--json"
    )
    assert code == 0 and err == "" and json.loads(out)["warnings"] == []


def test_set_and_show_the_after_commit_policy(run: Run, providers: None) -> None:
    run.ok(
        "combo",
        "set",
        "m",
        "--targets",
        "a/m1,b/m2",
        "--after-commit",
        "continue",
        "--max-continuations",
        "2",
    )
    assert stored("m")["afterCommit"] == "continue"
    assert stored("m")["maxContinuations"] == 2
    shown = run.ok("combo", "show", "m")
    assert "after commit: continue (up to 2 continuation(s) on prefill targets)" in shown
    assert json.loads(run.ok("combo", "show", "m", "--json"))["afterCommit"] == "continue"
    # A `set` without the flags keeps them (preserve-on-omit).
    run.ok("combo", "set", "m", "--targets", "a/m1")
    assert stored("m")["afterCommit"] == "continue"
    run.ok(
        "combo",
        "set",
        "m",
        "--targets",
        "a/m1",
        "--after-commit",
        "buffer",
        "--buffer-max-bytes",
        "65536",
    )
    assert "after commit: buffer (answers up to 65536 bytes" in run.ok("combo", "show", "m")
    run.ok("combo", "set", "m", "--targets", "a/m1", "--after-commit", "error")
    assert "afterCommit" not in stored("m")
    assert "after commit: error" in run.ok("combo", "show", "m")


def test_after_commit_flag_errors(run: Run, providers: None) -> None:
    run.ok("combo", "set", "m", "--targets", "a/m1")
    assert (
        run.fail("combo", "set", "m", "--targets", "a/m1", "--after-commit", "retry")
        == "--after-commit must be one of: error, continue, buffer"
    )
    assert (
        run.fail("combo", "set", "m", "--targets", "a/m1", "--max-continuations", "4")
        == "--max-continuations must be an integer from 1 to 3"
    )
    assert (
        run.fail("combo", "set", "m", "--targets", "a/m1", "--buffer-max-bytes", "12")
        == "bufferMaxBytes must be an integer from 1024 to 67108864"
    )
