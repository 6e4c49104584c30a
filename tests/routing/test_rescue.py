"""The pure decisions of the after-commit rescue (`routing.rescue`) and the validation of its
combo and model fields (`routing.validate`)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routing import validate
from routing.classify import Failure
from routing.rescue import (
    continuation_body,
    continuation_targets,
    is_break,
    prefill_for,
    seam,
)
from routing.types import ComboSpec, ModelSpec, ProviderSpec, TargetSpec

PROVIDERS = {"p": validate.ProviderInfo(name="p", disabled=False)}


def _issues(**fields: Any) -> list[str]:
    raw = {"targets": [{"provider": "p", "model": "m"}], **fields}
    return [i.message for i in validate.validate_combo("c", raw, providers=PROVIDERS, combos={})]


def test_the_combo_fields_are_validated() -> None:
    assert _issues(afterCommit="continue", maxContinuations=3, bufferMaxBytes=1024) == []
    assert _issues(afterCommit="retry") == [validate.MSG_AFTER_COMMIT]
    assert _issues(maxContinuations=0) == [validate.MSG_MAX_CONTINUATIONS]
    assert _issues(maxContinuations=4) == [validate.MSG_MAX_CONTINUATIONS]
    assert _issues(maxContinuations=True) == [validate.MSG_MAX_CONTINUATIONS]
    assert _issues(bufferMaxBytes=1023) == [validate.MSG_BUFFER_MAX_BYTES]
    assert _issues(bufferMaxBytes=64 * 1024 * 1024 + 1) == [validate.MSG_BUFFER_MAX_BYTES]


def test_the_combo_fields_normalize_and_stay_sparse() -> None:
    raw = {"targets": [{"provider": "p", "model": "m"}]}
    spec = validate.normalize_combo("c", raw)
    assert (spec.after_commit, spec.max_continuations, spec.buffer_max_bytes) == (
        "error",
        1,
        4 * 1024 * 1024,
    )
    out = validate.combo_to_sparse(spec)
    assert not {"afterCommit", "maxContinuations", "bufferMaxBytes"} & set(out)
    spec = validate.normalize_combo(
        "c", {**raw, "afterCommit": "buffer", "maxContinuations": 2, "bufferMaxBytes": 2048}
    )
    out = validate.combo_to_api(spec)
    assert (out["afterCommit"], out["maxContinuations"], out["bufferMaxBytes"]) == (
        "buffer",
        2,
        2048,
    )
    assert validate.normalize_combo("c", {**out}) == spec


def test_a_put_that_omits_them_keeps_them() -> None:
    assert {"afterCommit", "maxContinuations", "bufferMaxBytes"} <= set(
        validate.PRESERVED_COMBO_FIELDS
    )


def test_model_prefill_is_a_validated_boolean() -> None:
    base = {"adapter": "anthropic", "baseUrl": "https://x.example/v1"}
    good = {**base, "models": {"m": {"prefill": True}}}
    assert validate.validate_provider("p", good, combo_ids=()) == []
    bad = {**base, "models": {"m": {"prefill": "yes"}}}
    assert [i.message for i in validate.validate_provider("p", bad, combo_ids=())] == [
        validate.msg_model_prefill("m")
    ]
    spec = validate.normalize_provider("p", good)
    assert spec.models["m"].prefill is True
    assert validate.provider_to_sparse(spec)["models"] == {"m": {"prefill": True}}


def _failure(code: str, message: str) -> Failure:
    return Failure(status=502, error_type="upstream_error", error_code=code, message=message)


def test_only_a_break_is_continued() -> None:
    assert is_break(_failure("upstream_stream_truncated", "Upstream connection was cut"))
    assert is_break(_failure("upstream_stream_truncated", "Upstream stalled (idle timeout)"))
    assert is_break(
        _failure("upstream_stream_truncated", "Upstream stream ended before completion")
    )
    assert not is_break(
        _failure("upstream_stream_truncated", "Upstream sent malformed stream data")
    )
    assert not is_break(_failure("server_error", "boom"))
    assert not is_break(Failure(transport="undeclared_tool", message="x"))
    assert not is_break(None)


def _providers(prefill: dict[str, bool | None]) -> dict[str, ProviderSpec]:
    return {
        name: ProviderSpec(
            name, "anthropic", "http://x", models=MappingProxyType({"m": ModelSpec("m", prefill=p)})
        )
        for name, p in prefill.items()
    }


def test_continuation_targets_follow_the_broken_one_and_take_a_prefill() -> None:
    combo = ComboSpec(id="c", targets=tuple(TargetSpec(n, "m") for n in ("a", "b", "c", "d")))
    providers = _providers({"a": True, "b": None, "c": True, "d": True})
    keys = [t.key for t in continuation_targets(combo, providers, broken="c/m")]
    assert keys == ["d/m", "a/m"]  # after the broken one, wrapping; b takes no prefill
    keys = [
        t.key
        for t in continuation_targets(
            combo, providers, broken="c/m", attempted=["a/m"], eligible=lambda t: t.key != "d/m"
        )
    ]
    assert keys == []


def test_the_only_target_continues_itself_when_it_takes_a_prefill() -> None:
    combo = ComboSpec(id="c", targets=(TargetSpec("a", "m"),))
    assert continuation_targets(combo, _providers({"a": True}), broken="a/m") == [
        TargetSpec("a", "m")
    ]
    assert continuation_targets(combo, _providers({"a": False}), broken="a/m") == []


@given(
    st.text(alphabet="ab \n\t", max_size=12),
    st.text(alphabet="ab \n", max_size=12),
    st.lists(st.integers(min_value=0, max_value=30), max_size=4),
)
def test_the_seam_never_doubles_whitespace(so_far: str, rest: str, cuts: list[int]) -> None:
    """The client has `so_far`; the prefill drops its trailing whitespace, and the model goes
    on from the prefill, repeating that whitespace (`model`). However the continuation is split
    into deltas, the client ends with exactly the prefill plus the model's text."""
    prefill = prefill_for(so_far)
    assert prefill.text + prefill.trailing == so_far
    assert prefill.text == prefill.text.rstrip()
    model = prefill.trailing + rest
    points = sorted({c % (len(model) + 1) for c in cuts} | {0, len(model)})
    shown, pending = so_far, prefill.trailing
    for start, end in zip(points, points[1:], strict=False):
        piece, pending = seam(model[start:end], pending)
        shown += piece
    assert shown == prefill.text + model


@pytest.mark.parametrize("inbound", ["chat", "responses"])
def test_continuation_body_appends_the_prefill(inbound: str) -> None:
    if inbound == "chat":
        body = continuation_body({"messages": [{"role": "user", "content": "q"}]}, "chat", "ab")
        assert body["messages"][-1] == {"role": "assistant", "content": "ab"}
        return
    body = continuation_body({"input": "q"}, "responses", "ab")
    assert body["input"] == [
        {"type": "message", "role": "user", "content": "q"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ab"}],
        },
    ]


def test_a_config_file_is_validated_the_same_way() -> None:
    config = {
        "providers": {
            "p": {
                "adapter": "anthropic",
                "baseUrl": "https://x.example/v1",
                "models": {"m": {"prefill": 1}},
            }
        },
        "combos": {"c": {"targets": [{"provider": "p", "model": "m"}], "afterCommit": "sometimes"}},
    }
    found = {(".".join(map(str, i.path)), i.message) for i in validate.validate_config(config)}
    assert any(
        path.endswith("afterCommit") and message == validate.MSG_AFTER_COMMIT
        for path, message in found
    ), found
    assert any(message == validate.msg_model_prefill("m") for _, message in found), found
