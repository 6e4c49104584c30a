"""`eligibility.target_state`: the one rule for selection, status, badges (PRODUCT §8.7)."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from routing.eligibility import (
    RESOLVED,
    STATES,
    Access,
    credential_problem,
    target_state,
)
from routing.state import ComboState
from routing.strategies import assess
from routing.types import ComboSpec, ProviderSpec, TargetSpec

NOW = 1_000_000
T = TargetSpec("a", "m")
OK = ProviderSpec(name="a", adapter="openai-responses", base_url="http://x.test/v1", api_key="k")
COOLING = ComboState(cooldowns=MappingProxyType({"a/m": NOW + 5_000}))
PROBING = ComboState(
    cooldowns=MappingProxyType({"a/m": NOW - 1}), probes=MappingProxyType({"a/m": NOW + 9_000})
)
NO_KEY = Access(missing="environment variable A_KEY is not set")
EMPTY = ComboState()
LIMITED = Access(credential="fp1", quota="limited", quota_until=NOW + 60_000)


def state_of(
    *,
    provider: ProviderSpec | None = OK,
    state: ComboState = EMPTY,
    override: str | None = None,
    access: Access = RESOLVED,
) -> tuple[str, str | None]:
    ts = target_state(
        T,
        providers={} if provider is None else {"a": provider},
        state=state,
        now=NOW,
        override=override,
        access=access,
    )
    return ts.state, ts.skip


DISABLED = replace(OK, disabled=True)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # Everything at once: the pin shows first, the disabled provider still blocks it.
        (
            {"provider": DISABLED, "override": "a/m", "access": NO_KEY, "state": COOLING},
            ("pinned", "provider_disabled"),
        ),
        (
            {"provider": DISABLED, "access": NO_KEY, "state": COOLING},
            ("disabled", "provider_disabled"),
        ),
        ({"provider": None}, ("disabled", "provider_missing")),
        (
            {"access": NO_KEY, "state": COOLING},
            ("no_credential", "credential_missing: environment variable A_KEY is not set"),
        ),
        ({"access": LIMITED, "state": COOLING}, ("out_of_quota", "quota_exhausted")),
        ({"access": LIMITED, "state": PROBING}, ("out_of_quota", "quota_exhausted")),
        ({"state": COOLING}, ("cooling", "cooling")),
        ({"state": PROBING}, ("probing", "probing")),
        ({}, ("available", None)),
        # A pin bypasses quota, cooldowns and probes (no automatic switching, §8.5).
        ({"override": "a/m", "access": LIMITED, "state": COOLING}, ("pinned", None)),
        # Another target's pin: the own state shows, the router skips it for the pin.
        ({"override": "b/m", "state": COOLING}, ("cooling", "override")),
        ({"override": "b/m"}, ("available", "override")),
        ({"override": "b/m", "access": LIMITED}, ("out_of_quota", "quota_exhausted")),
    ],
)
def test_precedence(kwargs: dict[str, object], expected: tuple[str, str | None]) -> None:
    assert state_of(**kwargs) == expected  # type: ignore[arg-type]


def test_states_are_listed_in_precedence_order() -> None:
    assert STATES == (
        "pinned",
        "disabled",
        "no_credential",
        "out_of_quota",
        "cooling",
        "probing",
        "available",
    )


def test_out_of_quota_and_cooling_carry_until_credential_and_reason() -> None:
    ts = target_state(T, providers={"a": OK}, state=COOLING, now=NOW, access=LIMITED)
    assert (ts.until, ts.credential) == (NOW + 60_000, "fp1")
    ts = target_state(
        T, providers={"a": OK}, state=COOLING, now=NOW, reasons={"a/m": "rate_limited"}
    )
    assert (ts.state, ts.until, ts.reason) == ("cooling", NOW + 5_000, "rate_limited")
    assert target_state(T, providers={"a": OK}, state=PROBING, now=NOW).until == NOW + 9_000


def test_available_details_say_why_nothing_blocks() -> None:
    fresh = target_state(T, providers={"a": OK}, state=ComboState(), now=NOW)
    assert (fresh.state, fresh.detail) == ("available", "no quota data yet")
    known = target_state(
        T, providers={"a": OK}, state=ComboState(), now=NOW, access=Access(quota="available")
    )
    assert (known.state, known.detail, known.eligible) == ("available", None, True)
    half_open = target_state(
        T,
        providers={"a": OK},
        state=ComboState(cooldowns=MappingProxyType({"a/m": NOW})),
        now=NOW,
        access=Access(quota="available"),
    )
    assert (half_open.state, half_open.eligible) == ("available", True)
    assert half_open.detail == "half-open: the next request probes it"


def test_quota_probe_is_pickable_only_for_the_lease_holder() -> None:
    due = Access(credential="fp1", quota="probe_due")
    assert state_of(access=due) == ("probing", "quota_probing")
    assert state_of(access=Access(credential="fp1", quota="probe_due", probe_granted=True)) == (
        "available",
        None,
    )
    in_flight = Access(credential="fp1", quota="probing", quota_until=NOW + 1)
    assert state_of(access=in_flight) == ("probing", "quota_probing")


@pytest.mark.parametrize(
    ("provider", "secret", "caller", "expected"),
    [
        (ProviderSpec("c", "chatgpt", "http://x"), None, True, None),
        (ProviderSpec("c", "chatgpt", "http://x"), None, False, "caller ChatGPT token"),
        (
            ProviderSpec("o", "openai-responses", "http://x", api_key_env="O_KEY"),
            None,
            True,
            "environment variable O_KEY is not set",
        ),
        (ProviderSpec("o", "openai-responses", "http://x"), None, True, "no API key stored"),
        (ProviderSpec("o", "openai-responses", "http://x", api_key="k"), "k", True, None),
        # A local OpenAI-compatible server may need no key at all.
        (ProviderSpec("l", "openai-chat", "http://x"), None, True, None),
    ],
)
def test_credential_problem(
    provider: ProviderSpec, secret: str | None, caller: bool, expected: str | None
) -> None:
    assert credential_problem(provider, secret, caller_token=caller) == expected


def test_selection_derives_from_target_state() -> None:
    """`assess` skips each target with the reason `target_state` gives it."""
    providers = {
        "a": OK,
        "b": ProviderSpec("b", "openai-responses", "http://x", api_key="k", disabled=True),
        "c": ProviderSpec("c", "openai-responses", "http://x", api_key_env="C_UNSET"),
        "d": replace(OK, name="d"),
        "e": replace(OK, name="e"),
    }
    combo = ComboSpec("x", tuple(TargetSpec(p, "m") for p in "abcde"))
    state = ComboState(cooldowns=MappingProxyType({"e/m": NOW + 1}))
    access = {
        "c/m": Access(missing="environment variable C_UNSET is not set"),
        "d/m": Access(credential="fp", quota="limited", quota_until=NOW + 9),
    }
    el = assess(combo, providers, state, now=NOW, access=lambda t: access.get(t.key, Access()))
    assert [t.key for t in el.eligible] == ["a/m"]
    assert dict(el.skipped) == {
        "b/m": "provider_disabled",
        "c/m": "credential_missing: environment variable C_UNSET is not set",
        "d/m": "quota_exhausted",
        "e/m": "cooling",
    }
    assert [(t.key, until) for t, until in el.cooling] == [("e/m", NOW + 1)]


def test_details_name_the_cause_without_secrets() -> None:
    def detail(**kwargs: object) -> str | None:
        return target_state(T, now=NOW, state=EMPTY, **kwargs).detail  # type: ignore[arg-type]

    assert detail(providers={"a": OK}, access=NO_KEY) == "environment variable A_KEY is not set"
    assert detail(providers={"a": DISABLED}, override="a/m") == "pinned, but provider a is disabled"
    assert detail(providers={"a": OK}, override="a/m", access=NO_KEY) == (
        "pinned, but no credential: environment variable A_KEY is not set"
    )
    assert detail(providers={}) == "provider a is not configured"
    assert detail(providers={"a": OK}, override="b/m") == (
        "not used while the combo is pinned to b/m"
    )
