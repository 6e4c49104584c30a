"""The sign-in with the company's identity provider (OpenID Connect, docs/people.md#sso): its
configuration as mozilla-django-oidc reads it, and the provider's endpoints, discovered from
`{issuer}/.well-known/openid-configuration` at the first sign-in (a short timeout, kept for an
hour per process). Nothing here runs on the proxy's path."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.http import HttpRequest
from django.utils.http import url_has_allowed_host_and_scheme
from mozilla_django_oidc.utils import import_from_settings

SCOPES = "openid email profile"
DISCOVERY_TIMEOUT_S = 5.0
DISCOVERY_TTL_S = 3600.0
# The token, userinfo and JWKS requests the library makes.
REQUEST_TIMEOUT_S = 10.0
CALLBACK_URL_NAME = "ocx-sso-callback"
START_PATH = "/login/sso"
DEFAULT_NEXT = "/me/"


class SsoUnavailable(Exception):
    """The identity provider could not be used (unreachable, or an unusable discovery
    document); the message names what, never a secret."""


@dataclass(frozen=True)
class Endpoints:
    issuer: str
    authorization: str
    token: str
    userinfo: str
    jwks: str
    sign_algo: str
    basic_auth: bool  # client_secret_basic (the default of the spec), else client_secret_post


_cache: dict[str, tuple[float, Endpoints]] = {}
_lock = threading.Lock()


def enabled() -> bool:
    return bool(settings.OCX_OIDC_ISSUER)


def context(request: HttpRequest) -> dict[str, Any]:
    """Template context: whether the login pages offer the SSO sign-in."""
    return {"sso_enabled": enabled(), "sso_start": START_PATH}


def endpoints() -> Endpoints:
    """The provider's endpoints (discovered once an hour). Raises SsoUnavailable."""
    issuer = settings.OCX_OIDC_ISSUER
    now = time.monotonic()
    with _lock:
        cached = _cache.get(issuer)
        if cached is not None and now - cached[0] < DISCOVERY_TTL_S:
            return cached[1]
    found = _discover(issuer)
    with _lock:
        _cache[issuer] = (now, found)
    return found


def forget_endpoints() -> None:
    with _lock:
        _cache.clear()


def _discover(issuer: str) -> Endpoints:
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        response = httpx.get(url, timeout=DISCOVERY_TIMEOUT_S, follow_redirects=False)
    except httpx.HTTPError as exc:
        raise SsoUnavailable(
            f"the identity provider's discovery document could not be read ({type(exc).__name__})"
        ) from None
    if response.status_code != 200:
        raise SsoUnavailable(
            f"the identity provider's discovery document answered {response.status_code}"
        )
    try:
        doc = response.json()
    except ValueError:
        raise SsoUnavailable("the identity provider's discovery document is not JSON") from None
    if not isinstance(doc, dict):
        raise SsoUnavailable("the identity provider's discovery document is not a JSON object")
    # OpenID Connect Discovery §4.3: the document's issuer is exactly the one configured.
    if str(doc.get("issuer", "")).rstrip("/") != issuer:
        raise SsoUnavailable(
            f"the discovery document names issuer {doc.get('issuer')!r}, not OCX_OIDC_ISSUER"
        )
    names = ("authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")
    urls = {name: doc.get(name) for name in names}
    for name, value in urls.items():
        if not isinstance(value, str) or urlsplit(value).scheme not in ("https", "http"):
            raise SsoUnavailable(f"the discovery document has no usable {name}")
    algs = doc.get("id_token_signing_alg_values_supported") or ["RS256"]
    # The library verifies RS*/ES* signatures with the provider's keys (JWKS).
    usable = [a for a in algs if isinstance(a, str) and a.startswith(("RS", "ES"))]
    if not usable:
        raise SsoUnavailable(f"the provider signs ID tokens with none of RS*/ES* ({algs})")
    methods = doc.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
    return Endpoints(
        issuer=issuer,
        authorization=str(urls["authorization_endpoint"]),
        token=str(urls["token_endpoint"]),
        userinfo=str(urls["userinfo_endpoint"]),
        jwks=str(urls["jwks_uri"]),
        sign_algo="RS256" if "RS256" in usable else usable[0],
        basic_auth="client_secret_basic" in methods or "client_secret_post" not in methods,
    )


def library_setting(attr: str, *default: Any) -> Any:
    """A setting of mozilla-django-oidc, from ocx's own (OCX_OIDC_*) and the discovered
    endpoints; anything else from Django's settings (or `default`)."""
    fixed: dict[str, Any] = {
        "OIDC_RP_CLIENT_ID": settings.OCX_OIDC_CLIENT_ID,
        "OIDC_RP_CLIENT_SECRET": settings.OCX_OIDC_CLIENT_SECRET,
        "OIDC_RP_SCOPES": SCOPES,
        "OIDC_USE_NONCE": True,
        "OIDC_USE_PKCE": True,
        "OIDC_TIMEOUT": REQUEST_TIMEOUT_S,
        "OIDC_AUTHENTICATION_CALLBACK_URL": CALLBACK_URL_NAME,
        "OIDC_STORE_ACCESS_TOKEN": False,
        "OIDC_STORE_ID_TOKEN": False,
        "OIDC_CREATE_USER": True,
        "OIDC_ALLOW_UNSECURED_JWT": False,
        "LOGIN_REDIRECT_URL": DEFAULT_NEXT,
    }
    if attr in fixed:
        return fixed[attr]
    discovered = {
        "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization",
        "OIDC_OP_TOKEN_ENDPOINT": "token",
        "OIDC_OP_USER_ENDPOINT": "userinfo",
        "OIDC_OP_JWKS_ENDPOINT": "jwks",
        "OIDC_RP_SIGN_ALGO": "sign_algo",
        "OIDC_TOKEN_USE_BASIC_AUTH": "basic_auth",
    }
    if attr in discovered:
        return getattr(endpoints(), discovered[attr])
    return import_from_settings(attr, *default)


def safe_next(value: str | None) -> str | None:
    """`value` when it is a path of this site (`/me/`, `/admin/…`); else None (no other host,
    no scheme, no `//host`)."""
    if not value or not value.startswith("/") or value.startswith(("//", "/\\")):
        return None
    if not url_has_allowed_host_and_scheme(value, allowed_hosts=set()):
        return None
    return value
