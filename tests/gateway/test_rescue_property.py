"""Property: whatever the cut point, the seam whitespace, the continuation's own faults and the
policy's bound, a client of a "continue" combo gets either one whole answer (exactly the
canonical text, one terminal) or an explicit error after a prefix of it (never a truncated
answer marked complete, never text duplicated at the seam). Runs `gateway.rescue.Rescue` over
upstream attempts that write client frames as `providers.upstream` does."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.rescue import Rescue
from providers.wire.commit import terminal_error_frame, truncation_failure
from providers.wire.sse import DONE_FRAME, encode_json_event
from providers.wire.usage import Usage
from routing.attempts import Outcome
from routing.classify import Failure
from routing.types import ComboSpec, ModelSpec, ProviderSpec, TargetSpec
from tests.conftest import sse_events

Inbound = Literal["chat", "responses"]


@dataclass
class Client:
    """The client side of the exchange: everything written, in order."""

    started: bool = False
    upstream_done: bool = False
    data: bytearray = field(default_factory=bytearray)

    async def commit(self, status: int, headers: Any, target: TargetSpec) -> None:
        assert not self.started, "the status line went out twice"
        self.started = True

    async def write(self, data: bytes) -> None:
        self.data += data


def _frames(inbound: Inbound, pieces: list[str], *, tag: str, complete: bool) -> list[bytes]:
    """A client-protocol stream of `pieces`, its terminal when `complete` (a pass-through as
    `providers.upstream._stream` forwards it; ids and numbers per attempt, as upstreams do)."""
    if inbound == "chat":
        cid = f"chatcmpl-{tag}"

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return encode_json_event(
                None,
                {
                    "id": cid,
                    "model": tag,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                },
            )

        out = [chunk({"role": "assistant", "content": ""})]
        out += [chunk({"content": p}) for p in pieces]
        if complete:
            out.append(chunk({}, "stop"))
            out.append(
                encode_json_event(
                    None,
                    {
                        "id": cid,
                        "choices": [],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
                    },
                )
            )
            out.append(DONE_FRAME)
        return out
    seq = iter(range(10_000))
    rid, mid = f"resp_{tag}", f"msg_{tag}"

    def ev(kind: str, **fields: Any) -> bytes:
        return encode_json_event(kind, {"type": kind, "sequence_number": next(seq), **fields})

    text = "".join(pieces)
    out = [
        ev("response.created", response={"id": rid, "output": []}),
        ev("response.in_progress", response={"id": rid}),
        ev(
            "response.output_item.added",
            output_index=0,
            item={"type": "message", "id": mid, "role": "assistant", "content": []},
        ),
        ev(
            "response.content_part.added",
            output_index=0,
            item_id=mid,
            content_index=0,
            part={"type": "output_text", "text": ""},
        ),
    ]
    out += [
        ev("response.output_text.delta", output_index=0, item_id=mid, content_index=0, delta=p)
        for p in pieces
    ]
    if complete:
        item = {
            "type": "message",
            "id": mid,
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        }
        out += [
            ev(
                "response.output_text.done", output_index=0, item_id=mid, content_index=0, text=text
            ),
            ev(
                "response.content_part.done",
                output_index=0,
                item_id=mid,
                content_index=0,
                part={"type": "output_text", "text": text},
            ),
            ev("response.output_item.done", output_index=0, item=item),
            ev(
                "response.completed",
                response={
                    "id": rid,
                    "output": [item],
                    "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8},
                },
            ),
        ]
    return out


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False) if text[a:b]]


@dataclass
class Upstream:
    """Scripted attempts: the first breaks after `shown` characters; each continuation then
    behaves as `faults` says ("ok", "refuse" before output, or "cut" after some of its text)."""

    inbound: Inbound
    canonical: str
    shown: int
    faults: list[str]
    splits: list[int]
    bodies: list[Any] = field(default_factory=list)

    async def dispatch(
        self, target: TargetSpec, last: bool, *, body: Any = None, responder: Any = None
    ) -> Outcome:
        self.bodies.append(body)
        n = len(self.bodies)
        cut = truncation_failure("connection was cut")
        broken = Failure(
            status=cut.status, error_type=cut.type, error_code=cut.code, message=cut.message
        )
        if body is None:
            pieces = _split(self.canonical[: self.shown], self.splits)
            await responder.commit(200, [], target)
            for frame in _frames(self.inbound, pieces, tag=f"a{n}", complete=False):
                await responder.write(frame)
            await responder.write(terminal_error_frame(self.inbound, cut))
            return Outcome(True, broken, usage=Usage(7, None))
        fault = self.faults[n - 2] if n - 2 < len(self.faults) else "ok"
        if fault == "refuse":
            return Outcome(False, Failure(status=400, error_code="invalid_prefill", message="no"))
        said = _prefill(self.inbound, body)
        assert self.canonical.startswith(said) and said == said.rstrip()
        rest = self.canonical[len(said) :]
        pieces = _split(rest, self.splits)
        await responder.commit(200, [], target)
        if fault == "cut":
            half = pieces[: len(pieces) // 2]
            for frame in _frames(self.inbound, half, tag=f"c{n}", complete=False):
                await responder.write(frame)
            await responder.write(terminal_error_frame(self.inbound, cut))
            return Outcome(True, broken, usage=Usage(3, 1))
        for frame in _frames(self.inbound, pieces, tag=f"c{n}", complete=True):
            await responder.write(frame)
        return Outcome(True, None, usage=Usage(5, 3))


def _prefill(inbound: Inbound, body: Any) -> str:
    if inbound == "chat":
        text: str = body["messages"][-1]["content"]
        return text
    text = body["input"][-1]["content"][0]["text"]
    return text


def _client_view(inbound: Inbound, data: bytes) -> tuple[str, int, bool]:
    """(text, terminals, ended with an error) as a client reads the stream."""
    events = sse_events(data.decode())
    if inbound == "chat":
        payloads = [d for _, d in events]
        chunks = [p for p in payloads if isinstance(p, dict) and "choices" in p]
        text = "".join(
            c["delta"].get("content") or "" for p in chunks for c in p["choices"] if "delta" in c
        )
        errored = isinstance(payloads[-1], dict) and "error" in payloads[-1]
        return text, payloads.count("[DONE]"), errored
    kinds = [e for e, _ in events]
    text = "".join(d["delta"] for e, d in events if e == "response.output_text.delta")
    if "response.completed" in kinds:
        final = events[kinds.index("response.completed")][1]["response"]
        shown = "".join(part["text"] for item in final["output"] for part in item["content"])
        assert shown == text, "the final output disagrees with the deltas"
        seqs = [d["sequence_number"] for _, d in events if "sequence_number" in d]
        assert seqs == sorted(set(seqs)), seqs
    return text, kinds.count("response.completed"), kinds[-1] in ("response.failed", "error")


WORDS = st.lists(
    st.sampled_from(["alpha", "beta", "gamma", "  ", "\n", "delta.", "é", "x"]),
    min_size=2,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    inbound=st.sampled_from(["chat", "responses"]),
    words=WORDS,
    shown_at=st.integers(min_value=0, max_value=10_000),
    faults=st.lists(st.sampled_from(["ok", "refuse", "cut"]), max_size=3),
    splits=st.lists(st.integers(min_value=0, max_value=10_000), max_size=6),
    bound=st.integers(min_value=1, max_value=3),
    targets=st.integers(min_value=1, max_value=4),
)
def test_a_client_gets_the_whole_answer_or_an_explicit_error(
    inbound: Inbound,
    words: list[str],
    shown_at: int,
    faults: list[str],
    splits: list[int],
    bound: int,
    targets: int,
) -> None:
    canonical = " ".join(words)
    shown = 1 + shown_at % len(canonical)  # at least one character reached the client
    upstream = Upstream(inbound, canonical, shown, faults, splits)
    combo = ComboSpec(
        id="c",
        targets=tuple(TargetSpec(f"p{i}", "m") for i in range(targets)),
        after_commit="continue",
        max_continuations=bound,
    )
    providers = {
        f"p{i}": ProviderSpec(
            f"p{i}", "anthropic", "http://x", models={"m": ModelSpec("m", prefill=True)}
        )
        for i in range(targets)
    }
    client = Client()

    async def eligible(target: TargetSpec) -> bool:
        return True

    rescue = Rescue(
        combo=combo,
        providers=providers,
        inbound=inbound,
        request={"model": "c", "messages": [], "input": "hi"},
        exchange=client,
        dispatch=upstream.dispatch,
        eligible=eligible,
    )
    outcome = asyncio.run(rescue.dispatch(combo.targets[0], False))

    text, terminals, errored = _client_view(inbound, bytes(client.data))
    prefix = canonical[:shown]
    if canonical[:shown].strip():
        assert len(upstream.bodies) - 1 <= bound
    if terminals:
        # A completed answer is the canonical text, whole, with one terminal and no error.
        assert terminals == 1 and not errored
        assert text == canonical
        assert rescue.continued and outcome.committed
        assert rescue.usage is not None and rescue.usage.input is not None
    else:
        # Otherwise an explicit error ends a prefix of the answer (nothing doubled at a seam).
        assert errored
        assert canonical.startswith(text) and text.startswith(prefix.rstrip())
        assert not rescue.continued
