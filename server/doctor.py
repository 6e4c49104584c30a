"""`ocx doctor`: where the data lives and whether this setup can serve a team, check by check.

Each check returns one `Check` (ok / warn / fail). Database checks run only when the database
exists and is migrated, so the doctor never creates a database itself.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor

OK, WARN, FAIL = "ok", "warn", "fail"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
PROBE_TEXT = "ping"


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


# --- where the data lives ------------------------------------------------------------------


def data_dir_note() -> str:
    """How the data directory was chosen, for messages ("OCX_DATA_DIR=/x" or the default)."""
    if os.environ.get("OCX_DATA_DIR"):
        return f"OCX_DATA_DIR={os.environ['OCX_DATA_DIR']}"
    return f"OCX_DATA_DIR not set: ./var of the current directory, {settings.OCX_DATA_DIR}"


def _is_sqlite() -> bool:
    return str(connection.settings_dict["ENGINE"]).endswith("sqlite3")


def database_label() -> str:
    """The database in use, without a password: a file path or a postgres:// URL."""
    db = connection.settings_dict
    if _is_sqlite():
        name = str(db["NAME"])
        return name if name.startswith(("file:", ":memory:")) else str(Path(name).resolve())
    user = f"{db['USER']}@" if db.get("USER") else ""
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{user}{db.get('HOST') or 'localhost'}{port}/{db['NAME']}"


def _sqlite_missing() -> bool:
    name = str(connection.settings_dict["NAME"])
    if not _is_sqlite() or name.startswith(("file:", ":memory:")):
        return False
    return not Path(name).exists()


def pending_migrations() -> tuple[int, int]:
    """(applied, pending) migration counts of the default database."""
    executor = MigrationExecutor(connection)
    applied = len(executor.loader.applied_migrations)
    return applied, len(executor.migration_plan(executor.loader.graph.leaf_nodes()))


def migrate_if_needed() -> bool:
    """Apply pending migrations; True when the database was new (nothing applied before)."""
    from django.core.management import call_command

    applied, pending = pending_migrations()
    if pending:
        call_command("migrate", verbosity=0, interactive=False)
    return pending > 0 and applied == 0


def created_message() -> str:
    return f"ocx: created a new database at {database_label()} ({data_dir_note()})"


# --- the checks ------------------------------------------------------------------------------


def check_migrations() -> Check:
    if _sqlite_missing():
        return Check(
            "migrations",
            FAIL,
            f"no database at {database_label()} yet: is OCX_DATA_DIR right? "
            "(`ocx serve` creates it)",
        )
    try:
        applied, pending = pending_migrations()
    except DatabaseError as exc:  # the database itself is unreachable: report it
        return Check("migrations", FAIL, f"database unreachable: {type(exc).__name__}: {exc}")
    if pending:
        return Check(
            "migrations", FAIL, f"{pending} migration(s) not applied (`ocx serve` applies them)"
        )
    return Check("migrations", OK, f"all {applied} applied")


def check_secret_key() -> Check:
    if os.environ.get("OCX_SECRET_KEY"):
        return Check("secret key", OK, "from OCX_SECRET_KEY")
    path = settings.OCX_DATA_DIR / "secret.key"
    if not _is_sqlite():
        return Check(
            "secret key",
            WARN,
            f"generated file {path}: with a shared database every host needs the same key; "
            "set OCX_SECRET_KEY (stored provider keys are sealed with it)",
        )
    return Check("secret key", OK, f"generated file {path} (back it up with the database)")


def check_permissions() -> Check:
    """The data directory and a SQLite database readable by other local users: warn (ocx creates
    them 0700 and 0600; older ones, or ones made by hand, may be wider)."""
    paths = [Path(settings.OCX_DATA_DIR)]
    if _is_sqlite() and not _sqlite_missing():
        name = Path(str(connection.settings_dict["NAME"]))
        paths += [name, *(name.with_name(name.name + s) for s in ("-wal", "-shm"))]
    paths.append(Path(settings.OCX_DATA_DIR) / "secret.key")
    wide = []
    for path in paths:
        try:
            mode = path.stat().st_mode & 0o777
        except OSError:
            continue
        if mode & 0o077:
            wide.append(f"{path} ({mode:o})")
    if wide:
        return Check(
            "permissions",
            WARN,
            "readable by other users: " + ", ".join(wide) + " (chmod 700 the directory, "
            "600 the files)",
        )
    return Check("permissions", OK, "data directory 700, database and secret key 600")


def check_redis() -> Check:
    url = settings.OCX_REDIS_URL
    if not url:
        return Check("redis", OK, "not configured (one worker; --workers N needs REDIS_URL)")
    import redis

    parts = urlsplit(url)  # shown without a password
    shown = parts._replace(netloc=f"{parts.hostname or ''}:{parts.port or 6379}").geturl()
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except redis.RedisError as exc:
        return Check("redis", FAIL, f"{shown} unreachable: {exc}")
    return Check("redis", OK, f"{shown} reachable")


def check_bind(host: str) -> Check:
    allowed = list(settings.ALLOWED_HOSTS)
    names = ", ".join(allowed)
    if "*" in allowed:
        return Check("allowed hosts", WARN, "OCX_ALLOWED_HOSTS=* accepts any Host header")
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        addr = None
    if addr is not None and addr.is_loopback:
        return Check("allowed hosts", OK, f"--host {host}: this machine only; allowed: {names}")
    if addr is not None and addr.is_unspecified:
        if all(h in LOOPBACK_NAMES or h == "testserver" for h in allowed):
            return Check(
                "allowed hosts",
                FAIL,
                f"--host {host} listens on every interface but OCX_ALLOWED_HOSTS allows only "
                f"{names}: teammates get 400; set OCX_ALLOWED_HOSTS to the server's name or IP",
            )
        return Check("allowed hosts", OK, f"--host {host}; allowed: {names}")
    if host in allowed or any(h.startswith(".") and host.endswith(h) for h in allowed):
        return Check("allowed hosts", OK, f"--host {host} is allowed")
    return Check(
        "allowed hosts",
        FAIL,
        f"--host {host} is not in OCX_ALLOWED_HOSTS ({names}): requests to it get 400",
    )


def _credential_state(spec: object) -> tuple[str, str]:
    """(verdict, detail) for one provider's own credential."""
    from combos.selectors import credential_for
    from routing import envpolicy
    from routing.types import ProviderSpec

    assert isinstance(spec, ProviderSpec)
    if spec.adapter == "chatgpt":
        return OK, "caller-forward: each caller's own ChatGPT token"
    if spec.api_key_env:
        refused = envpolicy.refusal(spec.api_key_env)
        if refused is not None:
            # Never read nor sent (combos.selectors.credential_for); fix the provider.
            return FAIL, f"${spec.api_key_env} is refused and not used: {refused}"
        if os.environ.get(spec.api_key_env):
            return OK, f"${spec.api_key_env} is set"
        return FAIL, f"${spec.api_key_env} is not set in this environment"
    if credential_for(spec) is not None:
        return OK, "stored key"
    if spec.adapter == "openai-chat":
        return OK, "no credential (a local OpenAI-compatible server)"
    return FAIL, "no credential: set --api-key-env VAR or store a key"


def check_providers(snapshot: object) -> list[Check]:
    from providers.models import Provider
    from routing.types import ConfigSnapshot

    assert isinstance(snapshot, ConfigSnapshot)
    if not snapshot.providers:
        return [Check("providers", WARN, "none configured (ocx provider add NAME --preset P)")]
    undecryptable = {
        p.name for p in Provider.objects.exclude(api_key_sealed="") if p.name in snapshot.providers
    }
    out: list[Check] = []
    for name in sorted(snapshot.providers):
        spec = snapshot.providers[name]
        verdict, detail = _credential_state(spec)
        if spec.api_key is None and name in undecryptable and not spec.api_key_env:
            verdict, detail = FAIL, "the stored key cannot be decrypted (secret key changed?)"
        if spec.disabled:
            verdict, detail = WARN, f"disabled ({detail})"
        elif not spec.models:
            verdict = FAIL if verdict == FAIL else WARN
            detail += "; no models (add some, or use a preset)"
        out.append(Check(f"provider {name}", verdict, detail))
    return out


def _eligible(snapshot: object, provider_name: str) -> str | None:
    """None when a target on this provider can be chosen now, else why not."""
    from routing.types import ConfigSnapshot

    assert isinstance(snapshot, ConfigSnapshot)
    spec = snapshot.providers.get(provider_name)
    if spec is None:
        return "provider missing"
    if spec.disabled:
        return "provider disabled"
    verdict, detail = _credential_state(spec)
    return None if verdict == OK else detail


def check_combos(snapshot: object) -> list[Check]:
    from routing.types import ConfigSnapshot
    from routing.validate import undeclared_target_notes

    assert isinstance(snapshot, ConfigSnapshot)
    out: list[Check] = []
    for combo_id in sorted(snapshot.combos):
        combo = snapshot.combos[combo_id]
        why = {t.key: _eligible(snapshot, t.provider) for t in combo.targets}
        usable = [k for k, v in why.items() if v is None]
        if usable:
            skipped = [f"{k} ({v})" for k, v in why.items() if v is not None]
            detail = f"{len(usable)} of {len(why)} target(s) eligible"
            if skipped:
                detail += "; not: " + ", ".join(skipped)
            out.append(Check(f"combo/{combo_id}", WARN if skipped else OK, detail))
        else:
            reasons = ", ".join(f"{k} ({v})" for k, v in why.items()) or "no targets"
            out.append(Check(f"combo/{combo_id}", FAIL, f"no eligible target: {reasons}"))
        declared = {name: tuple(p.models) for name, p in snapshot.providers.items()}
        for t in combo.targets:
            out.extend(
                Check(f"combo/{combo_id} {t.key}", WARN, note)
                for note in undeclared_target_notes([(t.provider, t.model)], declared)
            )
    return out


def check_catalog(snapshot: object) -> list[Check]:
    from routing.catalog import (
        build_catalog,
        catalog_json,
        catalog_problems,
        validate_catalog,
    )
    from routing.types import ConfigSnapshot

    assert isinstance(snapshot, ConfigSnapshot)
    result = build_catalog(snapshot)
    problems = validate_catalog(catalog_json(result))
    if problems:
        hints = catalog_problems(snapshot, result)
        # Nothing configured yet is a warning (said above); a broken catalog is a failure.
        verdict = WARN if not snapshot.providers else FAIL
        return [Check("catalog", verdict, "; ".join((hints or problems)[:3]))]
    out = [Check("catalog", OK, f"valid, {len(result.models)} model(s)")]
    out.extend(Check("catalog", WARN, line) for line in catalog_problems(snapshot, result))
    return out


def check_prices(snapshot: object) -> list[Check]:
    """A warning per configured (or recently served) model without a price: its requests get
    no cost and count as unpriced (docs/usage.md)."""
    from combos.selectors import unpriced_targets
    from routing import pricing
    from routing.types import ConfigSnapshot

    assert isinstance(snapshot, ConfigSnapshot)
    if not snapshot.providers:
        return []
    missing = unpriced_targets(snapshot)
    if not missing:
        return [Check("prices", OK, "every configured model has a price")]
    return [Check(f"price {key}", WARN, pricing.unpriced_note(key)) for key in missing]


def check_open_files() -> Check:
    """The open-files limit `ocx serve` will run with (it raises the soft limit to the hard)
    against `HEADROOM` × the streams one worker is expected to carry."""
    from server import fdlimit

    served = fdlimit.served_limit()
    if served is None:
        return Check("open files", OK, "no RLIMIT_NOFILE on this system")
    streams = fdlimit.expected_streams()
    need = fdlimit.HEADROOM * streams
    detail = (
        f"{served} per worker (the hard limit; ocx serve raises the soft limit to it), "
        f"{fdlimit.HEADROOM} x {streams} expected streams = {need}"
    )
    if served < need:
        return Check(
            "open files",
            WARN,
            f"{detail}: a worker may run out of file descriptors (503 ocx_overloaded); raise "
            "the hard limit (systemd LimitNOFILE=65536, docker --ulimit nofile=65536) or lower "
            "OCX_UPSTREAM_MAX_CONNECTIONS (docs/deployment.md)",
        )
    return Check("open files", OK, detail)


def run_checks(*, host: str) -> list[Check]:
    checks = [
        check_migrations(),
        check_secret_key(),
        check_permissions(),
        check_redis(),
        check_bind(host),
        check_open_files(),
    ]
    if checks[0].verdict != OK:
        return checks
    from combos.selectors import config_snapshot

    snapshot = config_snapshot()
    checks.extend(check_providers(snapshot))
    checks.extend(check_combos(snapshot))
    checks.extend(check_catalog(snapshot))
    checks.extend(check_prices(snapshot))
    checks.extend(check() for check in _added)
    return checks


# Checks of the domains above `server` (imports flow down): each registers its own from its
# app's ready(), e.g. `usage` the ledger (`ocx usage verify` for today).
_added: list[Callable[[], Check]] = []


def add_check(check: Callable[[], Check]) -> None:
    if check not in _added:
        _added.append(check)


# --- --probe ---------------------------------------------------------------------------------


def _url_without_secrets(url: str) -> str:
    """`url` without userinfo, query or fragment: a base URL may carry a credential there."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return parts._replace(netloc=netloc, query="", fragment="").geturl()


def _probe_request(spec: object, model: str) -> tuple[str, dict[str, str], dict[str, object]]:
    """(url, headers, body) of the smallest request the adapter's upstream accepts."""
    from combos.selectors import credential_for
    from routing.types import ProviderSpec

    assert isinstance(spec, ProviderSpec)
    base = spec.base_url.rstrip("/")
    headers = {"content-type": "application/json", **dict(spec.headers)}
    credential = credential_for(spec)
    if spec.adapter == "anthropic":
        headers.setdefault("anthropic-version", "2023-06-01")
        if credential:
            headers["x-api-key"] = credential
        body: dict[str, object] = {
            "model": model,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": PROBE_TEXT}],
        }
        return f"{base}/messages", headers, body
    if credential:
        headers["authorization"] = f"Bearer {credential}"
    if spec.adapter == "openai-chat":
        body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
        return f"{base}/chat/completions", headers, body
    body = {"model": model, "input": PROBE_TEXT, "max_output_tokens": 16, "store": False}
    return f"{base}/responses", headers, body


def probe_providers(*, timeout_s: float = 10.0) -> list[Check]:
    """One tiny non-streaming request per enabled provider, to its first model."""
    import httpx

    from combos.selectors import config_snapshot

    snapshot = config_snapshot()
    out: list[Check] = []
    with httpx.Client(timeout=timeout_s) as client:
        for name in sorted(snapshot.providers):
            spec = snapshot.providers[name]
            check = f"probe {name}"
            if spec.disabled:
                out.append(Check(check, WARN, "disabled, not probed"))
                continue
            if spec.adapter == "chatgpt":
                out.append(Check(check, OK, "not probed: only callers' own tokens reach it"))
                continue
            if not spec.models:
                out.append(Check(check, WARN, "no models to probe"))
                continue
            model = next(iter(spec.models))
            url, headers, body = _probe_request(spec, model)
            try:
                resp = client.post(url, headers=headers, json=body)
            except httpx.HTTPError as exc:
                shown = _url_without_secrets(url)
                out.append(Check(check, FAIL, f"{model}: {type(exc).__name__} ({shown})"))
                continue
            if resp.status_code < 300:
                out.append(Check(check, OK, f"{model}: HTTP {resp.status_code}"))
            else:
                hint = {401: " (credential refused)", 403: " (forbidden)", 404: " (wrong URL?)"}
                extra = hint.get(resp.status_code, "")
                out.append(Check(check, FAIL, f"{model}: HTTP {resp.status_code}{extra}"))
    return out
