"""Schemathesis fuzzing of the management API of a real `ocx serve` (its django-ninja OpenAPI).

Every operation gets schema-driven positive and negative examples (bounded, derandomized);
PUT /api/providers and PUT /api/combos, whose bodies the OpenAPI declares only as "object",
also get near-valid bodies (valid skeletons with fuzzed leaves) so that the validators and the
database are reached. The property: never a 5xx, and responses match the declared schemas.
A failure message carries the tracebacks the server logged.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from tests.conftest import ADMIN_TOKEN, Server

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import response_schema_conformance  # noqa: E402

from routing.types import ADAPTERS, EFFORTS, STRATEGIES  # noqa: E402

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CHECKS = [not_a_server_error, response_schema_conformance]
# OCX_FUZZ_EXAMPLES=200 for a deeper local run.
MAX_EXAMPLES = int(os.environ.get("OCX_FUZZ_EXAMPLES", "25"))


def fuzz_settings(max_examples: int = MAX_EXAMPLES) -> settings:
    return settings(
        max_examples=max_examples,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: keep the run bounded
        suppress_health_check=list(HealthCheck),
    )


@pytest.fixture
def api_schema(server: Server) -> Any:
    # Two providers so that near-valid combos can name existing targets.
    for name in ("p1", "p2"):
        server.put_provider(
            name,
            {
                "adapter": "openai-responses",
                "baseUrl": "http://127.0.0.1:9/v1",
                "models": {"m": {}},
            },
        )
    return schemathesis.openapi.from_url(server.url + "/api/openapi.json", headers=AUTH)


@pytest.fixture
def server_log(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Any:
    """The server's output during the test (tests/conftest.py echoes it when OCX_TEST_ECHO)."""
    monkeypatch.setenv("OCX_TEST_ECHO", "1")
    capsys.readouterr()
    return lambda: capsys.readouterr().err


def tracebacks(log: str) -> list[str]:
    """The 'Internal Server Error' records with their tracebacks from the server's output."""
    out: list[str] = []
    for block in re.split(r"\n(?=\S+ \S+ (?:INFO|WARNING|ERROR) )", log):
        if "Traceback (most recent call last)" in block:
            out.append(block.strip())
    return out


def run(operation: Any, strategy: Any, failures: list[str], max_examples: int) -> None:
    @fuzz_settings(max_examples)
    @given(case=strategy)
    def fuzz(case: Any) -> None:
        case.call_and_validate(headers=AUTH, checks=CHECKS)

    try:
        fuzz()
    except Unsatisfiable:
        pass  # e.g. no negative example exists for an operation without inputs
    except Exception as exc:  # schemathesis failure groups, one per operation
        failures.append(f"{operation.label}:\n{exc}")


def report(failures: list[str], log: str) -> str:
    text = "\n\n".join(failures)
    found = tracebacks(log)
    if found:
        text += "\n\nserver tracebacks:\n" + "\n\n".join(found)
    return text


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_management_api_schema_fuzz(
    server: Server, api_schema: Any, server_log: Any, mode: GenerationMode
) -> None:
    failures: list[str] = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:
        # The auth header is fixed: a negative example without it is just a documented 401.
        strategy = operation.as_strategy(generation_mode=mode, headers=AUTH)
        run(operation, strategy, failures, MAX_EXAMPLES)
    log = server_log()
    assert not failures and not tracebacks(log), report(failures, log)


# --- near-valid bodies for the two PUT operations ---------------------------------------------

BIG = st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**53 + 1, 2**63, 10**30, 1.5, 1e308])
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    BIG,
    st.integers(),
    st.text(max_size=20),
    st.sampled_from(["", " ", "\x00", "a\x00b", "é" * 200, "x" * 5000, "p1", "m", "combo/x"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def maybe(value: Any) -> Any:
    """A valid-looking value nine times in ten, junk otherwise (one_of would flatten JUNK)."""
    return st.integers(0, 9).flatmap(lambda n: JUNK if n == 0 else value)


def optional(*, required: tuple[str, ...] = (), **fields: Any) -> Any:
    """An object with the `required` keys always and the other keys sometimes."""
    return st.fixed_dictionaries(
        {k: maybe(v) for k, v in fields.items() if k in required},
        optional={k: maybe(v) for k, v in fields.items() if k not in required},
    )


NAMES = st.sampled_from(["p1", "p2", "p3", "new", "x" * 64, "x" * 65, "a.b-c_d"])
INT_MS = st.integers(min_value=0, max_value=700_000)

PROVIDER = optional(
    required=("adapter", "baseUrl"),
    adapter=st.sampled_from(ADAPTERS),
    baseUrl=st.sampled_from(["http://127.0.0.1:9/v1", "https://api.example.com", "ftp://x"]),
    apiKey=st.text(min_size=1, max_size=40),
    apiKeyEnv=st.sampled_from(["OPENAI_API_KEY", "1BAD", "A" * 300]),
    headers=st.dictionaries(st.sampled_from(["X-Org", "Authorization", "bad name"]), st.text()),
    disabled=st.booleans(),
    timeouts=optional(connectMs=INT_MS, firstByteMs=INT_MS, idleMs=INT_MS, totalMs=INT_MS),
    models=st.dictionaries(
        st.sampled_from(["m", "m2", "", "x" * 300]),
        optional(
            contextWindow=st.integers(min_value=1),
            maxInputTokens=st.integers(min_value=1),
            inputModalities=st.lists(st.sampled_from(["text", "image", "audio"])),
            reasoningEfforts=st.lists(st.sampled_from(EFFORTS)),
            displayName=st.text(max_size=300),
            parallelToolCalls=st.booleans(),
        ),
        max_size=3,
    ),
)
PROVIDER_BODY = st.fixed_dictionaries({"name": maybe(NAMES), "provider": maybe(PROVIDER)})

TARGET = optional(
    required=("provider", "model"),
    provider=st.sampled_from(["p1", "p2", "p3"]),
    model=st.sampled_from(["m", "m2", "x" * 300]),
    weight=st.integers(min_value=1, max_value=10_000),
    lastResort=st.booleans(),
)
COMBO = optional(
    required=("targets",),
    targets=st.lists(TARGET, min_size=1, max_size=3),
    strategy=st.sampled_from(STRATEGIES),
    stickyLimit=st.integers(min_value=1, max_value=100),
    cooldownMs=st.integers(min_value=1, max_value=600_000),
    waitForCooldownMs=INT_MS,
    cooldownWaitPolicy=st.just("before-last-resort"),
    defaultEffort=st.sampled_from(EFFORTS),
    defaultEffortMode=st.sampled_from(["fallback", "force"]),
    reasoningEffortMode=st.sampled_from(["strict", "adaptive"]),
    imageInput=st.sampled_from(["auto", "disabled"]),
    alias=st.sampled_from(["fast", "team/fast", "gpt-x", "combo/x", "a" * 200]),
    nativeAlias=st.booleans(),
    displayName=st.text(max_size=200),
    override=st.fixed_dictionaries({"target": st.sampled_from(["p1/m", "p2/m", "nope"])}),
)
COMBO_BODY = st.fixed_dictionaries(
    {"id": maybe(st.sampled_from(["c1", "c2", "x" * 64, "x" * 65])), "combo": maybe(COMBO)},
    optional={"renameFrom": maybe(st.sampled_from(["c1", "c2", "c2", "missing"]))},
)


@pytest.mark.parametrize(
    ("path", "bodies"), [("/api/providers", PROVIDER_BODY), ("/api/combos", COMBO_BODY)]
)
def test_put_near_valid_bodies(
    server: Server, api_schema: Any, server_log: Any, path: str, bodies: Any
) -> None:
    operation = api_schema[path]["PUT"]
    strategy = bodies.map(
        lambda body: operation.Case(body=body, headers=dict(AUTH), media_type="application/json")
    )
    failures: list[str] = []
    run(operation, strategy, failures, 4 * MAX_EXAMPLES)
    log = server_log()
    assert not failures and not tracebacks(log), report(failures, log)


# --- inputs that once answered 500 (found by this fuzzing; PostgreSQL and SQLite) --------------

_P = {"adapter": "openai-responses", "baseUrl": "http://127.0.0.1:9/v1"}
_T = [{"provider": "p1", "model": "m"}]
KNOWN_BAD: list[tuple[str, str, Any]] = [
    ("POST", "/api/keys", {"user": "u", "rpm_limit": 2**63}),
    ("POST", "/api/keys", {"user": "u", "rpm_limit": 2**31}),
    ("POST", "/api/keys", {"user": "u", "name": "x" * 65}),
    ("POST", "/api/keys", {"user": "x" * 151}),
    ("POST", "/api/keys", {"user": "a\x00b"}),
    ("PUT", "/api/providers", {"name": "p9", "provider": {**_P, "apiKeyEnv": "A" * 300}}),
    (
        "PUT",
        "/api/providers",
        {"name": "p9", "provider": {**_P, "baseUrl": "http://x/" + "a" * 5000}},
    ),
    ("PUT", "/api/providers", {"name": "p9", "provider": {**_P, "timeouts": {"totalMs": 2**63}}}),
    (
        "PUT",
        "/api/providers",
        {"name": "p9", "provider": {**_P, "models": {"m": {"contextWindow": 2**63}}}},
    ),
    (
        "PUT",
        "/api/combos",
        {"id": "c1", "combo": {"targets": [{"provider": "p1", "model": "m\x00"}]}},
    ),
    (
        "PUT",
        "/api/combos",
        {"id": "c1", "combo": {"targets": [{"provider": "p1", "model": "x" * 300}]}},
    ),
    ("PUT", "/api/combos", {"id": "c1", "renameFrom": "a\x00", "combo": {"targets": _T}}),
    ("GET", "/api/combos/a%00b", None),
    ("GET", "/api/providers/a%00b", None),
    ("DELETE", "/api/combos?id=a%00b", None),
    ("DELETE", "/api/providers?name=a%00b", None),
    ("DELETE", "/api/keys/99999999999999999999999", None),
]


def test_known_bad_inputs_are_client_errors(
    server: Server, api_schema: Any, server_log: Any
) -> None:
    answers = []
    for method, path, body in KNOWN_BAD:
        r = server.api.request(method, path, json=body)
        answers.append((r.status_code, method, path, r.text[:200]))
    log = server_log()
    bad = [a for a in answers if a[0] >= 500]
    assert not bad and not tracebacks(log), report([str(a) for a in bad], log)
    # Every refusal is the API's JSON error shape.
    assert all(status < 300 or '"error"' in text for status, _, _, text in answers), answers
