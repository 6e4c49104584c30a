"""`ocx user`, `ocx doctor`, the data-directory notice and the idempotent demo (issue 14)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from accounts import access
from accounts.models import ClientKey
from ocxsite.cli import main
from ocxsite.demo import demo_setup
from providers import services as provider_services
from server import doctor
from tests.conftest import ROOT, Mock, start_server

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery-9"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def stdin(monkeypatch: pytest.MonkeyPatch, text: str, *, tty: bool = False) -> None:
    fake = io.StringIO(text)
    fake.isatty = lambda: tty  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stdin", fake)


# --- ocx user ---------------------------------------------------------------------------


def test_user_create_staff_from_stdin_can_log_in(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin(monkeypatch, PASSWORD + "\n")
    code, out, err = run(capsys, "user", "create", "alice", "--staff", "--password-stdin")
    assert (code, err) == (0, "")
    assert out == "Created admin alice (admin login at /admin/).\n"
    user = get_user_model().objects.get(username="alice")
    assert user.is_staff and user.is_active and user.check_password(PASSWORD)
    from django.http import HttpRequest
    from django.test import Client

    client = Client()
    # django-axes' backend needs the request of a login (its address); Client.login has none.
    assert client.login(request=HttpRequest(), username="alice", password=PASSWORD)
    assert client.get("/admin/").status_code == 200
    assert client.get("/admin/providers/provider/").status_code == 200  # not an empty admin


def test_user_create_prompts_twice(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin(monkeypatch, "", tty=True)
    answers = iter([PASSWORD, PASSWORD])
    prompts: list[str] = []

    def fake_getpass(prompt: str) -> str:
        prompts.append(prompt)
        return next(answers)

    monkeypatch.setattr("getpass.getpass", fake_getpass)
    code, out, err = run(capsys, "user", "create", "bob")
    assert (code, err) == (0, "")
    assert prompts == ["Password for bob: ", "Password (again): "]
    user = get_user_model().objects.get(username="bob")
    assert not user.is_staff and user.check_password(PASSWORD)


def test_user_create_mismatch_and_no_tty_change_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin(monkeypatch, "", tty=True)
    answers = iter([PASSWORD, PASSWORD + "x"])
    monkeypatch.setattr("getpass.getpass", lambda prompt: next(answers))
    code, out, err = run(capsys, "user", "create", "bob", "--staff")
    assert (code, out, err) == (1, "", "ocx: the passwords do not match\n")
    stdin(monkeypatch, "", tty=False)
    code, out, err = run(capsys, "user", "create", "bob", "--staff")
    assert code == 1 and "--password-stdin" in err
    stdin(monkeypatch, "short\n")
    code, out, err = run(capsys, "user", "create", "bob", "--staff", "--password-stdin")
    assert code == 1 and "too short" in err
    assert not get_user_model().objects.filter(username="bob").exists()


def test_user_create_existing_and_staff_without_password_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    access.client_key_create(username="carol")
    code, _, err = run(capsys, "user", "create", "carol", "--no-password")
    assert (code, err) == (1, "ocx: user carol already exists\n")
    code, _, err = run(capsys, "user", "create", "dave", "--staff", "--no-password")
    assert (code, err) == (1, "ocx: an admin or viewer needs a password to log in to /admin/\n")
    assert not get_user_model().objects.filter(username="dave").exists()


def test_user_list_and_deactivate_stops_keys(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run(capsys, "user", "list")[1] == (
        "No users. Create one with: ocx user create NAME --role admin\n"
    )
    stdin(monkeypatch, PASSWORD + "\n")
    assert run(capsys, "user", "create", "alice", "--staff", "--password-stdin")[0] == 0
    assert run(capsys, "user", "create", "bob", "--no-password")[0] == 0
    _, secret = access.client_key_create(username="bob")
    assert access.digest(secret) in access.client_keys_active()
    code, out, _ = run(capsys, "user", "list")
    assert code == 0
    assert out.splitlines() == [
        "alice  admin   active    0 key(s)",
        "bob    member  active    1 key(s)  (no password)",
    ]
    code, out, err = run(capsys, "user", "deactivate", "bob")
    assert (code, out, err) == (0, "Deactivated bob; 1 active key(s) no longer work.\n", "")
    assert access.digest(secret) not in access.client_keys_active()
    assert run(capsys, "user", "list")[1].splitlines()[1] == (
        "bob    member  inactive  1 key(s)  (no password)"
    )
    assert run(capsys, "user", "deactivate", "bob")[2] == "ocx: user bob is already inactive\n"
    assert run(capsys, "user", "deactivate", "nobody")[2] == "ocx: no user nobody\n"


# --- ocx doctor -------------------------------------------------------------------------


def doctor_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    code, out, _ = run(capsys, "doctor", "--json", *argv)
    return code, json.loads(out)


def verdicts(report: dict[str, object]) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in report["checks"]}  # type: ignore[attr-defined,index]


def test_doctor_empty_setup_is_ok_and_names_the_database(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "doctor")
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0].split(None, 2)[:2] == ["data", "directory"]
    assert lines[1].startswith("database        ")
    assert any(line.startswith("ok    migrations") for line in lines)
    assert any(line.startswith("warn  providers") for line in lines)


def test_doctor_credentials_combos_and_hosts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DOCTOR_TEST_KEY", raising=False)
    provider_services.provider_set(
        name="up", raw={"preset": "openai", "apiKeyEnv": "DOCTOR_TEST_KEY"}
    )
    provider_services.provider_set(name="local", raw={"preset": "ollama"})
    from combos import services as combo_services

    combo_services.combo_set(
        combo_id="team", raw={"targets": [{"provider": "up", "model": "gpt-5.5"}]}
    )
    code, report = doctor_json(capsys)
    assert code == 1 and report["ok"] is False
    v = verdicts(report)
    assert v["provider up"] == "fail"
    assert v["combo/team"] == "fail"
    assert v["provider local"] == "warn"  # no models yet
    detail = {c["name"]: c["detail"] for c in report["checks"]}  # type: ignore[attr-defined]
    assert "DOCTOR_TEST_KEY is not set" in detail["combo/team"]
    assert "no models" in detail["provider local"]

    monkeypatch.setenv("DOCTOR_TEST_KEY", "sk-doctor-test-0000")
    code, report = doctor_json(capsys)
    v = verdicts(report)
    assert (v["provider up"], v["combo/team"]) == ("ok", "ok")
    assert "sk-doctor-test-0000" not in json.dumps(report)
    assert code == 0  # a warn does not fail

    # A mistyped model is named, with the provider's models (issue 28 item 6).
    combo_services.combo_set(
        combo_id="team", raw={"targets": [{"provider": "up", "model": "gpt-5.55"}]}
    )
    code, report = doctor_json(capsys)
    assert code == 0 and verdicts(report)["combo/team up/gpt-5.55"] == "warn"
    detail = {c["name"]: c["detail"] for c in report["checks"]}  # type: ignore[attr-defined]
    assert detail["combo/team up/gpt-5.55"].startswith(
        'Target up/gpt-5.55: provider "up" does not declare model "gpt-5.55" (declared: '
    )
    assert "gpt-5.5," in detail["combo/team up/gpt-5.55"]
    combo_services.combo_set(
        combo_id="team", raw={"targets": [{"provider": "up", "model": "gpt-5.5"}]}
    )

    code, report = doctor_json(capsys, "--host", "0.0.0.0")
    assert code == 1 and verdicts(report)["allowed hosts"] == "fail"
    monkeypatch.setattr("django.conf.settings.ALLOWED_HOSTS", ["ocx.internal", "localhost"])
    code, report = doctor_json(capsys, "--host", "0.0.0.0")
    assert code == 0 and verdicts(report)["allowed hosts"] == "ok"
    code, report = doctor_json(capsys, "--host", "10.9.9.9")
    assert code == 1 and verdicts(report)["allowed hosts"] == "fail"


def test_doctor_names_a_stored_key_it_cannot_decrypt(
    capsys: pytest.CaptureFixture[str], settings: object
) -> None:
    provider_services.provider_set(
        name="kept", raw={"preset": "vllm", "apiKey": "sk-stored-0123456789abcdef"}
    )
    assert verdicts(doctor_json(capsys)[1])["provider kept"] == "warn"  # stored, but no models
    settings.SECRET_KEY = "another-secret-key-" + "x" * 32  # type: ignore[attr-defined]
    code, report = doctor_json(capsys)
    detail = {c["name"]: (c["verdict"], c["detail"]) for c in report["checks"]}  # type: ignore[attr-defined]
    assert detail["provider kept"] == (
        "fail",
        "the stored key cannot be decrypted (secret key changed?); "
        "no models (add some, or use a preset)",
    )
    assert code == 1


def test_doctor_redis_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("django.conf.settings.OCX_REDIS_URL", "redis://127.0.0.1:1/0")
    check = doctor.check_redis()
    assert check.verdict == "fail" and "127.0.0.1:1" in check.detail
    url = os.environ.get("REDIS_URL")
    if url:
        monkeypatch.setattr("django.conf.settings.OCX_REDIS_URL", url)
        assert doctor.check_redis().verdict == "ok"


def test_doctor_secret_key_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OCX_SECRET_KEY", "x" * 40)
    assert doctor.check_secret_key().detail == "from OCX_SECRET_KEY"
    monkeypatch.delenv("OCX_SECRET_KEY")
    assert "secret.key" in doctor.check_secret_key().detail


def test_doctor_probe_hits_each_provider_once(
    capsys: pytest.CaptureFixture[str], mock: Mock
) -> None:
    base = mock.url + "/v1"
    for name, preset, model in (
        ("o", "openai", "probe-resp"),
        ("a", "anthropic", "probe-anth"),
        ("c", "vllm", "probe-chat"),
    ):
        provider_services.provider_set(
            name=name,
            raw={
                "preset": preset,
                "baseUrl": base,
                "apiKey": "sk-probe-0123456789",
                "apiKeyEnv": None,
                "models": {model: {"contextWindow": 1000}},
            },
        )
    mock.script("probe-anth", [{"status": 401}])
    code, report = doctor_json(capsys, "--probe")
    v = verdicts(report)
    assert (v["probe o"], v["probe a"], v["probe c"]) == ("ok", "fail", "ok")
    assert code == 1
    assert mock.hits("probe-resp") == mock.hits("probe-anth") == mock.hits("probe-chat") == 1
    paths = {e["model"]: e["path"] for e in mock.log()}
    assert paths == {
        "probe-resp": "/v1/responses",
        "probe-anth": "/v1/messages",
        "probe-chat": "/v1/chat/completions",
    }
    assert all(e["stream"] is False for e in mock.log())


def test_doctor_probe_failure_hides_userinfo_and_query_of_the_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as sock:  # a port nothing listens on: the probe cannot connect
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider_services.provider_set(
        name="o",
        raw={
            "preset": "openai",
            "baseUrl": f"http://u:pw-in-url@127.0.0.1:{port}/v1?api-key=sk-in-query#frag",
            "apiKey": "sk-probe-0123456789",
            "apiKeyEnv": None,
            "models": {"m": {"contextWindow": 1000}},
        },
    )
    code, report = doctor_json(capsys, "--probe")
    probe = next(c for c in report["checks"] if c["name"] == "probe o")  # type: ignore[attr-defined]
    assert code == 1 and probe["verdict"] == "fail"
    assert probe["detail"] == f"m: ConnectError (http://127.0.0.1:{port}/v1)"


# --- data directory ---------------------------------------------------------------------


def _ocx(args: list[str], data_dir: Path | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("OCX_DATA_DIR", None)
    if data_dir is not None:
        env["OCX_DATA_DIR"] = str(data_dir)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "ocxsite.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_command_that_creates_the_database_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = _ocx(["user", "create", "ann", "--no-password"], data, tmp_path)
    assert first.returncode == 0, first.stderr
    db = (data / "ocx.sqlite3").resolve()
    assert first.stderr == (f"ocx: created a new database at {db} (OCX_DATA_DIR={data})\n")
    again = _ocx(["combo", "list"], data, tmp_path)
    assert (again.returncode, again.stderr) == (0, "")
    # The doctor looks but never creates.
    other = tmp_path / "other"
    looked = _ocx(["doctor"], other, tmp_path)
    assert looked.returncode == 1
    assert "fail  migrations" in looked.stdout and "no database at" in looked.stdout
    assert not (other / "ocx.sqlite3").exists()


def test_the_default_data_directory_is_named_when_it_is_created(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _ocx(["user", "create", "ann", "--no-password"], None, elsewhere)
    assert done.returncode == 0, done.stderr
    var = (elsewhere / "var").resolve()
    assert done.stderr == (
        f"ocx: created a new database at {var / 'ocx.sqlite3'} "
        f"(OCX_DATA_DIR not set: ./var of the current directory, {var})\n"
    )


@pytest.mark.parametrize(
    "args",
    [
        ["key", "list"],
        ["key"],
        ["status"],
        ["usage"],
        ["combo", "list"],
        ["provider", "list"],
        ["user", "list"],
        ["catalog", "show"],
        ["config", "dump"],
    ],
)
def test_a_read_command_never_creates_a_database(tmp_path: Path, args: list[str]) -> None:
    # Issue 28 item 8: `ocx key list` elsewhere exited 0 with empty output and left ./var.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _ocx(args, None, elsewhere)
    var = (elsewhere / "var").resolve()
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"ocx: no database at {var / 'ocx.sqlite3'} (OCX_DATA_DIR not set: ./var of the "
        f"current directory, {var}); set OCX_DATA_DIR to the server's data directory (or "
        "DATABASE_URL), or create one with `ocx serve`\n"
    )
    assert list(elsewhere.iterdir()) == []
    # With the data directory named, the same command reads the database it finds there.
    data = tmp_path / "data"
    assert _ocx(["user", "create", "ann", "--no-password"], data, tmp_path).returncode == 0
    found = _ocx(args, data, tmp_path)
    # (`catalog show` of an empty setup still fails, for its own reason.)
    assert "no database" not in found.stderr and found.returncode in (0, 1)
    assert found.returncode == 0 or args == ["catalog", "show"]


def test_user_command_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "user", "create")
    assert (code, out) == (1, "") and "required: name" in err
    code, out, err = run(capsys, "user", "bogus")
    assert code == 1 and "invalid choice: 'bogus'" in err


# --- demo -------------------------------------------------------------------------------


def test_two_demos_side_by_side_both_answer(tmp_path: Path) -> None:
    # The demo's mock upstream takes a free port: 8790 taken, a second demo beside the first,
    # and a rerun on the first one's data directory (its providers re-pointed) all answer.
    busy = socket.socket()
    with contextlib.suppress(OSError):  # taken already (another test run's demo): as good
        busy.bind(("127.0.0.1", 8790))
        busy.listen()

    def ask(server: object) -> int:
        out = "".join(server.output)  # type: ignore[attr-defined]
        secret = out.split("client key:")[1].split()[0]
        return server.http.post(  # type: ignore[attr-defined, no-any-return]
            "/v1/responses",
            headers={"Authorization": f"Bearer {secret}"},
            json={"model": "combo/demo", "input": "hi"},
        ).status_code

    try:
        a, stop_a = start_server(tmp_path / "a", server_args=["--demo"])
        b, stop_b = start_server(tmp_path / "b", server_args=["--demo"])
        try:
            assert (ask(a), ask(b)) == (200, 200)
        finally:
            stop_a()
            stop_b()
        again, stop_again = start_server(tmp_path / "a", server_args=["--demo"])
        try:
            assert ask(again) == 200
        finally:
            stop_again()
    finally:
        busy.close()


def test_demo_is_idempotent_one_user_one_live_key() -> None:
    access.client_key_create(username="mock", name="demo")  # left by an older release
    first = demo_setup(proxy_url="http://p", mock_url="http://m")
    assert "(revoked 1 previous demo key(s))" in first
    second = demo_setup(proxy_url="http://p", mock_url="http://m")
    assert "(revoked 1 previous demo key(s))" in second
    live = ClientKey.objects.filter(revoked__isnull=True)
    assert [k.user.get_username() for k in live] == ["demo"]
    secret = second.split("client key:")[1].split()[0]
    assert access.digest(secret) == live.get().digest
    assert "user demo" in second


def test_serve_prints_its_database_and_demo_user(tmp_path: Path) -> None:
    server, stop = start_server(tmp_path, server_args=["--demo"], fresh_db=True)
    try:
        out = "".join(server.output)
        assert f"Admin and dashboard: {server.url}/admin/" in out
        assert "ocx database: " in out
        if "DATABASE_URL" not in server.env:
            assert f"ocx database: {(tmp_path / 'ocx.sqlite3').resolve()}" in out
            assert "ocx: created a new database at" in out
        assert "(user demo, shown once)" in out
        secret = out.split("client key:")[1].split()[0]
        r = server.http.post(
            "/v1/responses",
            headers={"Authorization": f"Bearer {secret}"},
            json={"model": "combo/demo", "input": "hi"},
        )
        assert r.status_code == 200, r.text
    finally:
        stop()


def test_user_made_by_key_create_has_no_password_and_can_be_deactivated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from django.contrib.auth import get_user_model

    # `ocx key create --user carol` / POST /api/keys create the user on the fly.
    _, secret = access.client_key_create(username="carol")
    carol = get_user_model().objects.get(username="carol")
    assert not carol.has_usable_password()
    assert run(capsys, "user", "list")[1].splitlines() == [
        "carol  member  active    1 key(s)  (no password)"
    ]
    # A row from before unusable passwords were set (password "") deactivates too.
    get_user_model().objects.filter(username="carol").update(password="")
    code, out, err = run(capsys, "user", "deactivate", "carol")
    assert (code, out, err) == (0, "Deactivated carol; 1 active key(s) no longer work.\n", "")
    assert access.digest(secret) not in access.client_keys_active()


# --- typos and deactivated users (issue 28 items 2 and 3) ---------------------------------


def test_key_create_refuses_an_unknown_user_unless_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "key", "create", "--user", "alcie")
    assert (code, out) == (1, "")
    assert err == (
        "ocx: no user alcie: create it with `ocx user create alcie` (or pass --create-user)\n"
    )
    assert not get_user_model().objects.filter(username="alcie").exists()
    assert not ClientKey.objects.exists()
    code, out, _ = run(capsys, "key", "create", "--user", "alcie", "--create-user")
    assert code == 0 and out.startswith("Created key ")
    assert get_user_model().objects.get(username="alcie").is_active


def test_deactivated_user_gets_no_key_then_activate_and_remove(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, secret = access.client_key_create(username="bob")
    assert run(capsys, "user", "deactivate", "bob")[0] == 0
    code, out, err = run(capsys, "key", "create", "--user", "bob")
    assert (code, out) == (1, "")
    assert err == (
        "ocx: user bob is deactivated: reactivate it with `ocx user activate bob` "
        "before giving it a key\n"
    )
    assert ClientKey.objects.count() == 1
    assert run(capsys, "user", "activate", "bob") == (
        0,
        "Activated bob; 1 key(s) work again.\n",
        "",
    )
    assert access.digest(secret) in access.client_keys_active()
    assert run(capsys, "user", "activate", "bob")[2] == "ocx: user bob is already active\n"
    token, _ = access.mgmt_token_create(username="bob")
    # remove: confirmation first, then every key and token revoked, the row kept.
    code, _, err = run(capsys, "user", "remove", "bob")
    assert code == 1 and "add --yes to confirm" in err
    assert access.digest(secret) in access.client_keys_active()
    assert run(capsys, "user", "remove", "bob", "--yes") == (
        0,
        "Removed bob: 1 key(s) revoked, login disabled; their usage history stays.\n",
        "",
    )
    bob = get_user_model().objects.get(username="bob")
    assert not bob.is_active and not bob.has_usable_password()
    assert access.digest(secret) not in access.client_keys_active()
    token.refresh_from_db()
    assert token.revoked is not None
    assert ClientKey.objects.get().revoked is not None
    assert run(capsys, "user", "remove", "nobody", "--yes")[2] == "ocx: no user nobody\n"


def test_password_errors_read_as_sentences(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 28 item 10: "…characters.; This password is too common."
    monkeypatch.setattr("sys.stdin", io.StringIO("password\n"))
    code, out, err = run(capsys, "user", "create", "weak", "--password-stdin")
    assert (code, out) == (1, "")
    assert ".;" not in err
    assert err.startswith("ocx: This password is too short.") and err.endswith(
        " This password is too common.\n"
    ), err


def test_messages_text_joins_sentences() -> None:
    from providers.management.base import messages_text

    assert messages_text(["no user x"]) == "no user x"
    assert messages_text(["Too short.", "Too common."]) == "Too short. Too common."
    assert messages_text(["a", "b."]) == "a. b."
