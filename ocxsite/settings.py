"""ocx settings: one env-driven file with strict helpers and a SQLite default."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import secrets
import tempfile
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from server.paths import SQLITE_NAME, data_dir_path


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false/1/0), got {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {value}")
    return value


def env_list(name: str, default: str) -> list[str]:
    raw = os.environ.get(name, default)
    items = [item.strip() for item in raw.split(",")]
    if any(not item for item in items):
        raise ImproperlyConfigured(f"{name} must be a comma-separated list without empty items")
    return items


def env_names(name: str) -> list[str]:
    """A comma list of environment variable names (or name prefixes); empty when unset."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return []
    items = [item.strip() for item in raw.split(",")]
    bad = [item for item in items if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", item)]
    if bad:
        raise ImproperlyConfigured(
            f"{name} must be a comma-separated list of environment variable names, got {bad[0]!r}"
        )
    return items


def _data_dir() -> Path:
    path = data_dir_path()
    try:
        # 0700: it holds the database and the secret key (an existing one: `ocx doctor` warns).
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ImproperlyConfigured(f"OCX_DATA_DIR {str(path)!r} is not usable: {exc}") from None
    return path


def _secret_key(data_dir: Path) -> str:
    key = os.environ.get("OCX_SECRET_KEY", "")
    if key:
        if len(key) < 32:
            raise ImproperlyConfigured("OCX_SECRET_KEY must be at least 32 characters")
        return key
    # Generated once so that stored provider keys stay decryptable across restarts.
    key_file = data_dir / "secret.key"
    if not key_file.exists():
        # Written whole under another name, then linked into place: processes starting at once
        # on a new data directory (workers, a CLI, parallel tests) all read the one that won.
        fd, tmp = tempfile.mkstemp(prefix=".secret.key.", dir=data_dir)  # mode 0600
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(48))
            with contextlib.suppress(FileExistsError):
                os.link(tmp, key_file)
        finally:
            os.unlink(tmp)
    return key_file.read_text().strip()


def _database(data_dir: Path) -> dict[str, object]:
    url = os.environ.get("DATABASE_URL") or f"sqlite:///{data_dir / SQLITE_NAME}"
    scheme = urlsplit(url).scheme
    if scheme not in ("sqlite", "postgres", "postgresql", "pgsql", "mysql"):
        raise ImproperlyConfigured(
            f"DATABASE_URL must be a sqlite:// or postgres:// URL, got scheme {scheme!r}"
        )
    try:
        config: dict[str, object] = dict(dj_database_url.parse(url))
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is malformed: {exc}") from None
    # Under ASGI connections are per thread; persistent ones would leak (Django docs).
    config["CONN_MAX_AGE"] = 0
    if scheme == "sqlite":
        from server.datafiles import note_new_sqlite

        note_new_sqlite(str(config["NAME"]))  # made 0600 once created (server.datafiles)
        # IMMEDIATE: a write transaction takes the lock up front instead of failing with
        # "database is locked" when the request-log writer and an API write overlap.
        config["OPTIONS"] = {
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL;",
            "transaction_mode": "IMMEDIATE",
        }
    return config


def _time_zone() -> str:
    # Budgets' calendar days, weeks and months (PRODUCT §9.5) are counted in this zone.
    name = os.environ.get("OCX_TIME_ZONE") or "UTC"
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ImproperlyConfigured(
            f"OCX_TIME_ZONE must be an IANA time zone such as UTC or Europe/Berlin, got {name!r}"
        ) from None
    return name


def _redis_url() -> str | None:
    url = os.environ.get("REDIS_URL") or None
    if url is not None and urlsplit(url).scheme not in ("redis", "rediss", "unix"):
        raise ImproperlyConfigured(f"REDIS_URL must be a redis:// URL, got {url!r}")
    return url


_LOOPBACK = ("localhost", "127.0.0.1", "::1")
_DOMAIN_RE = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+")


def _names(name: str, raw: str) -> list[str]:
    """A comma list that may be empty (unset) but has no empty items."""
    if not raw.strip():
        return []
    items = [item.strip() for item in raw.split(",")]
    if any(not item for item in items):
        raise ImproperlyConfigured(f"{name} must be a comma-separated list without empty items")
    return items


def oidc_config(environ: Mapping[str, str]) -> dict[str, Any]:
    """The OCX_OIDC_* settings of the sign-in with the company's identity provider
    (docs/people.md#sso): issuer, client id and client secret together, or none of them."""
    trio = ("OCX_OIDC_ISSUER", "OCX_OIDC_CLIENT_ID", "OCX_OIDC_CLIENT_SECRET")
    given = {name: environ.get(name, "").strip() for name in trio}
    missing = [name for name in trio if not given[name]]
    if len(missing) not in (0, len(trio)):
        present = ", ".join(name for name in trio if given[name])
        raise ImproperlyConfigured(
            "SSO needs OCX_OIDC_ISSUER, OCX_OIDC_CLIENT_ID and OCX_OIDC_CLIENT_SECRET together: "
            f"{present} set, {', '.join(missing)} missing"
        )
    issuer = given["OCX_OIDC_ISSUER"].rstrip("/")
    if issuer:
        parts = urlsplit(issuer)
        loopback = parts.scheme == "http" and parts.hostname in _LOOPBACK
        if not (parts.scheme == "https" or loopback) or not parts.hostname:
            raise ImproperlyConfigured(
                "OCX_OIDC_ISSUER must be an https:// URL (http:// only on localhost), "
                f"got {issuer!r}"
            )
        if parts.query or parts.fragment:
            raise ImproperlyConfigured(f"OCX_OIDC_ISSUER must have no query, got {issuer!r}")
    domains = [
        d.lower().lstrip("@")
        for d in _names("OCX_OIDC_ALLOWED_DOMAINS", environ.get("OCX_OIDC_ALLOWED_DOMAINS", ""))
    ]
    bad = [d for d in domains if _DOMAIN_RE.fullmatch(d) is None]
    if bad:
        raise ImproperlyConfigured(
            f"OCX_OIDC_ALLOWED_DOMAINS must list e-mail domains (example.com), got {bad[0]!r}"
        )
    return {
        "OCX_OIDC_ISSUER": issuer,
        "OCX_OIDC_CLIENT_ID": given["OCX_OIDC_CLIENT_ID"],
        "OCX_OIDC_CLIENT_SECRET": given["OCX_OIDC_CLIENT_SECRET"],
        "OCX_OIDC_USERNAME_CLAIM": environ.get("OCX_OIDC_USERNAME_CLAIM", "").strip()
        or "preferred_username",
        "OCX_OIDC_ALLOWED_DOMAINS": domains,
        "OCX_OIDC_TEAMS_CLAIM": environ.get("OCX_OIDC_TEAMS_CLAIM", "").strip(),
        "OCX_OIDC_GROUPS_CLAIM": environ.get("OCX_OIDC_GROUPS_CLAIM", "").strip() or "groups",
        "OCX_OIDC_ADMIN_GROUPS": _names(
            "OCX_OIDC_ADMIN_GROUPS", environ.get("OCX_OIDC_ADMIN_GROUPS", "")
        ),
        "OCX_OIDC_VIEWER_GROUPS": _names(
            "OCX_OIDC_VIEWER_GROUPS", environ.get("OCX_OIDC_VIEWER_GROUPS", "")
        ),
    }


OCX_DATA_DIR = _data_dir()
SECRET_KEY = _secret_key(OCX_DATA_DIR)
DEBUG = env_bool("OCX_DEBUG", False)
# `apiKeyEnv` may never name these (beyond DATABASE_URL, REDIS_URL, OCX_*, DJANGO_*), and,
# when the allow-list is set, must start with one of its prefixes (routing.envpolicy).
OCX_PROVIDER_ENV_DENY = env_names("OCX_PROVIDER_ENV_DENY")
OCX_PROVIDER_ENV_ALLOW = env_names("OCX_PROVIDER_ENV_ALLOW")
ALLOWED_HOSTS = env_list("OCX_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
# Peers whose X-Forwarded-For / -Proto are honoured (server/forwarded.py); default none.
OCX_TRUSTED_PROXIES = [p.strip() for p in os.environ.get("OCX_TRUSTED_PROXIES", "").split(",")]
OCX_TRUSTED_PROXIES = [p for p in OCX_TRUSTED_PROXIES if p]
for _proxy in OCX_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"OCX_TRUSTED_PROXIES: {_proxy!r} is not an IP address or network"
        ) from None
OCX_REDIS_URL = _redis_url()
# Set by `ocx serve` for its workers: a per-start token good only for GET /api/status, which
# `ocx status` reads from the data directory's server.json (server.paths). Not for operators.
OCX_STATUS_TOKEN = os.environ.get("OCX_STATUS_TOKEN", "")
OCX_ADMIN_TOKEN = os.environ.get("OCX_ADMIN_TOKEN") or None
if OCX_ADMIN_TOKEN is not None and len(OCX_ADMIN_TOKEN) < 16:
    raise ImproperlyConfigured("OCX_ADMIN_TOKEN must be at least 16 characters")
# How often a worker checks the config version (PRODUCT §4.2: changes served within 1 s).
OCX_CONFIG_POLL_MS = env_int("OCX_CONFIG_POLL_MS", 500, minimum=50)
# A buffered stream (a combo with afterCommit "buffer") sends an SSE comment this often while it
# holds the answer back, so clients and proxies keep the connection open.
OCX_BUFFER_KEEPALIVE_MS = env_int("OCX_BUFFER_KEEPALIVE_MS", 10000, minimum=10)
# What all the answers buffer mode holds in one worker may take together (gateway/buffer_budget).
OCX_BUFFER_BUDGET_BYTES = env_int("OCX_BUFFER_BUDGET_BYTES", 256 * 1024 * 1024, minimum=1024)
OCX_PROXY_MAX_BODY = env_int("OCX_PROXY_MAX_BODY", 32 * 1024 * 1024, minimum=1024)
OCX_API_MAX_BODY = env_int("OCX_API_MAX_BODY", 1024 * 1024, minimum=1024)
# Every other path (the admin's forms, …); /healthz, /readyz, /metrics take 1 KiB (body_limits).
OCX_OTHER_MAX_BODY = env_int("OCX_OTHER_MAX_BODY", 256 * 1024, minimum=1024)
# /v1 and /api requests that present no credential at all: their answer is a 401 anyway.
OCX_UNAUTH_MAX_BODY = env_int("OCX_UNAUTH_MAX_BODY", 64 * 1024, minimum=1024)
OCX_STATE_KEY_PREFIX = os.environ.get("OCX_STATE_KEY_PREFIX", "ocx")
# Redis calls on the request path give up after this; then the worker routes on its own state.
OCX_REDIS_TIMEOUT_MS = env_int("OCX_REDIS_TIMEOUT_MS", 50, minimum=1)
OCX_REQUEST_LOG = env_bool("OCX_REQUEST_LOG", True)
OCX_REQUEST_LOG_QUEUE = env_int("OCX_REQUEST_LOG_QUEUE", 10000, minimum=1)
OCX_REQUEST_LOG_RETENTION_DAYS = env_int("OCX_REQUEST_LOG_RETENTION_DAYS", 14, minimum=1)
# Usage rollups (usage app): written by the request-log writer even when the log is off.
OCX_USAGE = env_bool("OCX_USAGE", True)
OCX_USAGE_RETENTION_DAYS = env_int("OCX_USAGE_RETENTION_DAYS", 90, minimum=1)
# The portal (/me/, docs/people.md): whether members create their own keys, how many each may
# hold (0: no limit), the longest expiry in days (0: no limit; else an expiry is required).
OCX_PORTAL_MEMBERS_CREATE_KEYS = env_bool("OCX_PORTAL_MEMBERS_CREATE_KEYS", True)
OCX_PORTAL_MAX_KEYS = env_int("OCX_PORTAL_MAX_KEYS", 5, minimum=0)
OCX_PORTAL_MAX_EXPIRY_DAYS = env_int("OCX_PORTAL_MAX_EXPIRY_DAYS", 0, minimum=0)
# The audit trail (app `audit`): entries older than this are deleted.
OCX_AUDIT_RETENTION_DAYS = env_int("OCX_AUDIT_RETENTION_DAYS", 365, minimum=1)
# Sign-in with the company's identity provider (OpenID Connect; docs/people.md#sso): on when
# OCX_OIDC_ISSUER is set. Its endpoints are discovered at the first sign-in (accounts.sso).
_oidc = oidc_config(os.environ)
OCX_OIDC_ISSUER: str = _oidc["OCX_OIDC_ISSUER"]
OCX_OIDC_CLIENT_ID: str = _oidc["OCX_OIDC_CLIENT_ID"]
OCX_OIDC_CLIENT_SECRET: str = _oidc["OCX_OIDC_CLIENT_SECRET"]
OCX_OIDC_USERNAME_CLAIM: str = _oidc["OCX_OIDC_USERNAME_CLAIM"]
OCX_OIDC_ALLOWED_DOMAINS: list[str] = _oidc["OCX_OIDC_ALLOWED_DOMAINS"]
OCX_OIDC_TEAMS_CLAIM: str = _oidc["OCX_OIDC_TEAMS_CLAIM"]
OCX_OIDC_GROUPS_CLAIM: str = _oidc["OCX_OIDC_GROUPS_CLAIM"]
OCX_OIDC_ADMIN_GROUPS: list[str] = _oidc["OCX_OIDC_ADMIN_GROUPS"]
OCX_OIDC_VIEWER_GROUPS: list[str] = _oidc["OCX_OIDC_VIEWER_GROUPS"]
OCX_LOG_JSON = env_bool("OCX_LOG_JSON", False)
# A worker moves its startup heap out of the cyclic collector once it serves (lifecycle).
OCX_GC_FREEZE = env_bool("OCX_GC_FREEZE", True)
# A worker's youngest-generation collector threshold (lifecycle.freeze_heap); 0: Python's own
# (700, 10, 10). Hundreds of long streams otherwise trigger full collections over all of them.
OCX_GC_YOUNG = env_int("OCX_GC_YOUNG", 20_000, minimum=0)
OCX_TIME_ZONE = _time_zone()
# Upstream connections per provider per worker (a provider's `maxConnections` overrides it):
# a team's hundreds of long streams must never queue behind ocx's own pool.
OCX_UPSTREAM_MAX_CONNECTIONS = env_int("OCX_UPSTREAM_MAX_CONNECTIONS", 1024, minimum=1)
# Idle keep-alive connections kept per provider origin per worker.
OCX_UPSTREAM_MAX_KEEPALIVE = env_int("OCX_UPSTREAM_MAX_KEEPALIVE", 64, minimum=0)
# Deployments behind TLS (docs/deployment.md "Security"): cookies only over HTTPS, HSTS, a CSP.
OCX_SECURE_COOKIES = env_bool("OCX_SECURE_COOKIES", False)
OCX_HSTS_SECONDS = env_int("OCX_HSTS_SECONDS", 0)
OCX_CSP = os.environ.get("OCX_CSP", "").strip() or None
# Admin login throttling (django-axes): this many failed logins lock the user name, and the
# address, for OCX_LOGIN_LOCKOUT_MINUTES; 0 switches the throttling off.
OCX_LOGIN_FAILURE_LIMIT = env_int("OCX_LOGIN_FAILURE_LIMIT", 5)
OCX_LOGIN_LOCKOUT_MINUTES = env_int("OCX_LOGIN_LOCKOUT_MINUTES", 15, minimum=1)
# Alerts (docs/alerts.md): admin links start with OCX_PUBLIC_URL; one message per event key
# and destination per OCX_ALERT_MIN_INTERVAL seconds; e-mail through OCX_EMAIL_*.
OCX_PUBLIC_URL = os.environ.get("OCX_PUBLIC_URL", "").strip().rstrip("/")
OCX_ALERT_MIN_INTERVAL = env_int("OCX_ALERT_MIN_INTERVAL", 300)
OCX_ALERT_QUOTA_PERCENT = env_int("OCX_ALERT_QUOTA_PERCENT", 90, minimum=1)
OCX_ALERT_POLL_MS = env_int("OCX_ALERT_POLL_MS", 2000, minimum=10)
OCX_ALERT_RETRY_MS = env_int("OCX_ALERT_RETRY_MS", 30_000, minimum=1)
EMAIL_BACKEND = os.environ.get("OCX_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = os.environ.get("OCX_EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("OCX_EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = os.environ.get("OCX_EMAIL_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("OCX_EMAIL_PASSWORD", "")
EMAIL_USE_TLS = env_bool("OCX_EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("OCX_EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = os.environ.get("OCX_EMAIL_FROM", "ocx@localhost")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "providers",
    "combos",
    "quota",
    "usage",
    "dashboard",
    "accounts",
    "alerts",
    "audit",  # the audit trail (docs/people.md)
    "server",  # its management commands: `ocx status`, `ocx doctor`
    "ninja",  # Swagger UI / ReDoc served from our own static files (no CDN)
    "axes",  # admin login throttling
    "ocxsite",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "server.http_errors.json_api_errors",
    "server.db_unavailable.DatabaseUnavailableMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # Who changes things, through which interface: the audit trail's origin.
    "audit.middleware.audit_origin",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "server.security_headers.content_security_policy",
    # Last, as django-axes asks: turns a locked-out login into its lockout answer.
    "axes.middleware.AxesMiddleware",
]

AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out user name or address before the password is checked.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
    # Viewers (staff, not superusers) read every admin page: docs/people.md.
    "accounts.roles.ViewOnlyStaffBackend",
    # The OpenID Connect sign-in (accounts.sso_views): only the SSO callback calls it.
    "accounts.sso_views.SsoBackend",
]
AXES_ENABLED = OCX_LOGIN_FAILURE_LIMIT > 0
AXES_FAILURE_LIMIT = max(OCX_LOGIN_FAILURE_LIMIT, 1)
AXES_COOLOFF_TIME = timedelta(minutes=OCX_LOGIN_LOCKOUT_MINUTES)
# Per user name and, separately, per address: either one reaching the limit locks.
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "ocx/lockout.html"
# Failed attempts are kept (they are the count); no row per successful login.
AXES_DISABLE_ACCESS_LOG = True
AXES_VERBOSE = False

# Every path that sets a password (the admin's user forms, `ocx user create`) checks these.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 10},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

SESSION_COOKIE_SECURE = OCX_SECURE_COOKIES
CSRF_COOKIE_SECURE = OCX_SECURE_COOKIES
# SecurityMiddleware sends it on HTTPS requests (X-Forwarded-Proto from the reverse proxy).
SECURE_HSTS_SECONDS = OCX_HSTS_SECONDS

ROOT_URLCONF = "ocxsite.urls"
ASGI_APPLICATION = "ocxsite.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # Overrides of the admin's own templates: searched before the apps' directories.
        "DIRS": [Path(__file__).resolve().parent.parent / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                # `sso_enabled`: the login pages offer the SSO sign-in (docs/people.md#sso).
                "accounts.sso.context",
            ],
        },
    },
]

DATABASES = {"default": _database(OCX_DATA_DIR)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATA_UPLOAD_MAX_MEMORY_SIZE = OCX_API_MAX_BODY

if OCX_REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [OCX_REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = OCX_DATA_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
# The admin's CSS/JS are served by WhiteNoise straight from the installed apps, so
# `ocx serve` needs no collectstatic step and no separate web server.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "server.logjson.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if OCX_LOG_JSON else "plain",
        }
    },
    "root": {"handlers": ["console"], "level": os.environ.get("OCX_LOG_LEVEL", "INFO")},
    # django-axes logs every login at INFO; its warnings (failures, lockouts) stay.
    "loggers": {"axes": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}
