"""`GET /login/sso` (start) and `GET /login/sso/callback` (the provider's answer): the sign-in
with the company's identity provider through mozilla-django-oidc (state, nonce, PKCE, the code
exchange, the ID token's signature), with ocx's rules (accounts.sso_services) on who signs in.
A refusal or a provider failure is a page that says what happened, never a token or secret."""

from __future__ import annotations

import logging
import re
from typing import Any

import jwt
import requests
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.views import View
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from accounts import sso
from accounts.sso_services import SsoRefused, sso_sign_in

log = logging.getLogger("ocx.sso")
CALLBACK_PATH = "/login/sso/callback"


def failure_page(request: HttpRequest, message: str, *, status: int) -> HttpResponse:
    context = {
        "site_header": "ocx",
        "site_title": "ocx",
        "title": "Sign-in failed",
        "has_permission": False,
        "message": message,
        "sso_again": sso.START_PATH,
    }
    response = TemplateResponse(request, "portal/sso_failed.html", context, status=status)
    response["Cache-Control"] = "no-store"
    return response


class SsoBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    """The library's backend with the endpoints discovered when first used (not when built:
    Django builds every backend for each password login too), the token's issuer and audience
    checked, and ocx's rules for the user. Only the SSO callback calls it (its keyword-only
    arguments match no other sign-in)."""

    get_settings = staticmethod(sso.library_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.UserModel = get_user_model()

    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:  # noqa: N802 (the library's names)
        return sso.endpoints().token

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str:  # noqa: N802
        return sso.endpoints().userinfo

    @property
    def OIDC_OP_JWKS_ENDPOINT(self) -> str:  # noqa: N802
        return sso.endpoints().jwks

    @property
    def OIDC_RP_SIGN_ALGO(self) -> str:  # noqa: N802
        return sso.endpoints().sign_algo

    @property
    def OIDC_RP_CLIENT_ID(self) -> str:  # noqa: N802
        return str(sso.library_setting("OIDC_RP_CLIENT_ID"))

    @property
    def OIDC_RP_CLIENT_SECRET(self) -> str:  # noqa: N802
        return str(sso.library_setting("OIDC_RP_CLIENT_SECRET"))

    OIDC_RP_IDP_SIGN_KEY = None

    def authenticate(  # type: ignore[override]
        self, request: HttpRequest | None, *, nonce: str | None, code_verifier: str | None
    ) -> Any:
        if request is None or not sso.enabled() or request.path_info != CALLBACK_PATH:
            return None
        return super().authenticate(request, nonce=nonce, code_verifier=code_verifier)

    def retrieve_matching_jwk(self, token: str) -> Any:
        if "kid" in jwt.get_unverified_header(token):
            return super().retrieve_matching_jwk(token)
        # A `kid` is optional (RFC 7515): a provider with one signing key may leave it out.
        response = requests.get(self.OIDC_OP_JWKS_ENDPOINT, timeout=sso.REQUEST_TIMEOUT_S)
        response.raise_for_status()
        keys = [
            key
            for key in response.json().get("keys", [])
            if key.get("use", "sig") == "sig"
            and key.get("alg", self.OIDC_RP_SIGN_ALGO) == self.OIDC_RP_SIGN_ALGO
        ]
        if len(keys) != 1:
            raise SuspiciousOperation(
                "The ID token names no key (kid) and the provider has several."
            )
        return jwt.PyJWK(keys[0])

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        issuer = sso.endpoints().issuer
        # The library checks the signature, expiry and nonce; the issuer and audience here.
        if str(payload.get("iss", "")).rstrip("/") != issuer:
            raise SsoRefused("The ID token was issued by another provider than OCX_OIDC_ISSUER.")
        audience = payload.get("aud")
        audiences = [audience] if isinstance(audience, str) else list(audience or [])
        if sso.library_setting("OIDC_RP_CLIENT_ID") not in audiences:
            raise SsoRefused("The ID token was issued to another client than OCX_OIDC_CLIENT_ID.")
        user_info = self.get_userinfo(access_token, id_token, payload)
        if not isinstance(user_info, dict) or user_info.get("sub") != payload.get("sub"):
            raise SsoRefused("The identity provider's user info names another account.")
        # Claims some providers put only in the ID token (groups) count too.
        return sso_sign_in(issuer=issuer, claims={**payload, **user_info})

    def get_user(self, user_id: Any) -> AbstractBaseUser | None:
        # Django's: a user deactivated since they signed in is signed out at their next request.
        return ModelBackend.get_user(self, user_id)  # type: ignore[arg-type]


class SsoStart(OIDCAuthenticationRequestView):  # type: ignore[misc]
    """`GET /login/sso?next=/path`: to the provider's sign-in page (`next`: paths of this site
    only)."""

    get_settings = staticmethod(sso.library_setting)

    def __init__(self, **kwargs: Any) -> None:
        View.__init__(self, **kwargs)  # the library reads the endpoints here; we do in get()

    def get(self, request: HttpRequest) -> HttpResponse:
        if not sso.enabled():
            raise Http404("SSO is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = sso.endpoints().authorization
        except sso.SsoUnavailable as exc:
            log.warning("sso: %s", exc)
            return failure_page(request, f"Sign-in is unavailable: {exc}.", status=502)
        self.OIDC_RP_CLIENT_ID = sso.library_setting("OIDC_RP_CLIENT_ID")
        response: HttpResponse = super().get(request)
        request.session["oidc_login_next"] = sso.safe_next(request.GET.get("next"))
        return response


_ERROR_CODE = re.compile(r"[a-z_]{1,64}")


class SsoCallback(OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """`GET /login/sso/callback?code=…&state=…`: the provider's answer."""

    get_settings = staticmethod(sso.library_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not sso.enabled():
            raise Http404("SSO is not configured")
        if request.GET.get("error"):
            # The library would also sign out whoever is signed in: a link to this URL must not.
            return self.login_failure()
        try:
            response: HttpResponse = super().get(request)
        except SsoRefused as exc:
            log.info("sso: sign-in refused: %s", exc.message)
            return failure_page(request, exc.message, status=403)
        except sso.SsoUnavailable as exc:
            log.warning("sso: %s", exc)
            return failure_page(request, f"Sign-in is unavailable: {exc}.", status=502)
        except SuspiciousOperation as exc:
            log.warning("sso: sign-in not verified: %s", exc)
            return failure_page(
                request,
                "The sign-in could not be verified (its state, nonce or signature). Start again.",
                status=400,
            )
        except requests.RequestException as exc:
            # Its text may carry the provider's answer; only the kind and status are logged.
            status = getattr(exc.response, "status_code", None)
            log.warning("sso: the provider failed: %s (status %s)", type(exc).__name__, status)
            return failure_page(
                request, "The identity provider did not complete the sign-in.", status=502
            )
        return response

    def login_failure(self) -> HttpResponse:
        error = self.request.GET.get("error", "")
        if error:
            code = error if _ERROR_CODE.fullmatch(error) else "error"
            message = f"The identity provider did not sign you in ({code})."
        else:
            message = "The sign-in expired or was started elsewhere. Start again."
        return failure_page(self.request, message, status=403)
