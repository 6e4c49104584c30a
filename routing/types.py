"""Frozen configuration types shared by the pure core and the Django shell.

The Django side turns ORM rows into a `ConfigSnapshot` once per config version
(`combos.selectors.config_snapshot`); the hot path only ever sees these.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

EFFORTS: tuple[str, ...] = ("low", "medium", "high", "xhigh", "max", "ultra")
STRATEGIES: tuple[str, ...] = ("failover", "round-robin", "random", "least-used", "reset-window")
ADAPTERS: tuple[str, ...] = ("openai-responses", "openai-chat", "anthropic", "chatgpt")
COMBO_NAMESPACE = "combo"
# What a combo does when a stream breaks after its first output (`routing.rescue`).
AFTER_COMMIT_MODES: tuple[str, ...] = ("error", "continue", "buffer")
DEFAULT_BUFFER_MAX_BYTES = 4 * 1024 * 1024


def _empty_map() -> Mapping[str, object]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Timeouts:
    connect_ms: int = 5000
    first_byte_ms: int = 20000
    idle_ms: int = 60000
    total_ms: int = 600000


@dataclass(frozen=True)
class ModelPrice:
    """A model's own price in USD per million tokens (metadata `price`); it wins over the
    genai-prices data. `cached_input` None = cached input at the `input` price."""

    input: float
    output: float
    cached_input: float | None = None


@dataclass(frozen=True)
class ModelSpec:
    """One model of a provider. `reasoning_efforts`: None = unknown, () = no effort control."""

    id: str
    context_window: int | None = None
    max_input_tokens: int | None = None
    input_modalities: tuple[str, ...] | None = None
    reasoning_efforts: tuple[str, ...] | None = None
    display_name: str | None = None
    parallel_tool_calls: bool | None = None
    price: ModelPrice | None = None
    # The model continues a final assistant message (prefill); None = not known to.
    prefill: bool | None = None


@dataclass(frozen=True)
class ProviderSpec:
    name: str
    adapter: str
    base_url: str
    api_key_env: str | None = None
    # The decrypted stored key, kept in memory only; never printed (repr=False).
    api_key: str | None = field(default=None, repr=False)
    headers: tuple[tuple[str, str], ...] = ()
    disabled: bool = False
    timeouts: Timeouts = Timeouts()
    models: Mapping[str, ModelSpec] = field(default_factory=_empty_map)  # type: ignore[arg-type]
    # Upstream connections per worker; None = `OCX_UPSTREAM_MAX_CONNECTIONS`.
    max_connections: int | None = None
    # The genai-prices provider id this provider's prices come from; None = inferred from the
    # adapter and base URL (`routing.pricing.pricing_provider`).
    pricing_provider: str | None = None


@dataclass(frozen=True)
class TargetSpec:
    provider: str
    model: str
    weight: int = 1
    last_resort: bool = False

    @property
    def key(self) -> str:
        return f"{self.provider}/{self.model}"


@dataclass(frozen=True)
class RetryPolicy:
    """A combo's `retrySameTarget`: retry a transient pre-commit failure on the same target up
    to `attempts` times, waiting at most `max_wait_ms` each time (`routing.retry`)."""

    attempts: int
    max_wait_ms: int


@dataclass(frozen=True)
class ComboSpec:
    """A normalized combo (combos-behaviour.md §1.6) plus ocx's manual `override`."""

    id: str
    targets: tuple[TargetSpec, ...]
    strategy: str = "failover"
    sticky_limit: int = 1
    cooldown_ms: int | None = None
    wait_for_cooldown_ms: int = 0
    cooldown_wait_policy: str | None = None
    default_effort: str | None = None
    default_effort_mode: str = "fallback"
    reasoning_effort_mode: str = "strict"
    image_input: str = "auto"
    alias: str | None = None
    native_alias: bool = False
    display_name: str | None = None
    # After-commit rescue (`routing.rescue`): "error" (default), "continue" or "buffer".
    after_commit: str = "error"
    max_continuations: int = 1
    buffer_max_bytes: int = DEFAULT_BUFFER_MAX_BYTES
    # None = automatic; otherwise the "provider/model" key every request is pinned to.
    override: str | None = None
    # None = off: a transient failure hops at once (today's behaviour).
    retry_same_target: RetryPolicy | None = None
    # When an operator last cleared the routing state ("*": the whole combo, else a target key;
    # epoch ms). Not part of the definition: no equality, no fingerprint (`repr`).
    resets: Mapping[str, int] = field(
        default_factory=_empty_map,  # type: ignore[arg-type]
        repr=False,
        compare=False,
    )

    @property
    def public_id(self) -> str:
        return self.alias or f"{COMBO_NAMESPACE}/{self.id}"

    @functools.cached_property
    def fingerprint(self) -> str:
        """A stable id of this definition, the same in every worker and process (computed once
        per snapshot object; the routing state records it, see `state.stamped`)."""
        return hashlib.sha256(repr(self).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ConfigSnapshot:
    version: int
    providers: Mapping[str, ProviderSpec]
    combos: Mapping[str, ComboSpec]
    disabled_models: frozenset[str] = frozenset()
