from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from routing import recall as recall_mod
from routing.recall import (
    MAX_LANES,
    MAX_TOTAL_BYTES,
    TTL_MS,
    RecallStore,
    lane_of,
    name_size,
    snapshot_liveness,
)
from routing.types import ComboSpec, ConfigSnapshot, ProviderSpec, TargetSpec

T0 = 1_700_000_000_000
KEY = "key-1"


def test_remember_then_recall_exact_name() -> None:
    store = RecallStore()
    assert store.remember(KEY, "lane", "claude-sonnet-4-5", "fast", now=T0)
    assert store.recall(KEY, "lane", "claude-sonnet-4-5", now=T0 + 1) == "fast"
    assert store.recall(KEY, "lane", "Claude-Sonnet-4-5", now=T0 + 1) is None  # exact match
    assert store.recall(KEY, "other-lane", "claude-sonnet-4-5", now=T0 + 1) is None
    assert store.recall("key-2", "lane", "claude-sonnet-4-5", now=T0 + 1) is None  # per key


def test_latest_completed_response_replaces_the_lane() -> None:
    store = RecallStore()
    store.remember(KEY, "lane", "m1", "a", now=T0)
    store.remember(KEY, "lane", "m2", "b", now=T0 + 5)
    assert store.recall(KEY, "lane", "m1", now=T0 + 6) is None
    assert store.recall(KEY, "lane", "m2", now=T0 + 6) == "b"
    assert len(store) == 1 and store.total_bytes == 2


@pytest.mark.parametrize("name", ["", "a/m1", "combo/fast"])
def test_recall_ignores_empty_and_explicit_selectors(name: str) -> None:
    store = RecallStore()
    store.remember(KEY, "lane", "a/m1", "fast", now=T0)
    assert store.recall(KEY, "lane", name, now=T0) is None


@pytest.mark.parametrize(
    ("lane", "name", "combo_id"),
    [(None, "m", "c"), ("", "m", "c"), ("lane", "   ", "c"), ("lane", "m", "")],
)
def test_remember_skips_unusable_input(lane: str | None, name: str, combo_id: str) -> None:
    store = RecallStore()
    assert not store.remember(KEY, lane, name, combo_id, now=T0)
    assert len(store) == 0


def test_recall_without_lane_is_unused() -> None:
    store = RecallStore()
    store.remember(KEY, "lane", "m", "c", now=T0)
    assert store.recall(KEY, None, "m", now=T0) is None


def test_ttl_boundary_is_exactly_thirty_minutes() -> None:
    store = RecallStore()
    store.remember(KEY, "lane", "m", "c", now=T0)
    assert TTL_MS == 1_800_000
    assert store.recall(KEY, "lane", "m", now=T0 + TTL_MS - 1) == "c"
    assert store.recall(KEY, "lane", "m", now=T0 + TTL_MS) is None
    assert len(store) == 0  # the expired entry was deleted
    assert store.recall(KEY, "lane", "m", now=T0 + 1) is None


def test_sweep_removes_only_expired() -> None:
    store = RecallStore()
    store.remember(KEY, "old", "m", "c", now=T0)
    store.remember(KEY, "new", "mm", "c", now=T0 + 1)
    assert store.sweep(now=T0 + TTL_MS) == 1
    assert store.recall(KEY, "new", "mm", now=T0 + TTL_MS) == "c"
    assert store.total_bytes == 2


def test_257th_lane_evicts_the_oldest() -> None:
    store = RecallStore()
    assert MAX_LANES == 256
    for i in range(256):
        store.remember(KEY, f"lane{i}", "m", f"c{i}", now=T0 + i)
    assert len(store) == 256
    assert store.recall(KEY, "lane0", "m", now=T0 + 300) == "c0"
    store.remember(KEY, "lane256", "m", "c256", now=T0 + 256)
    assert len(store) == 256
    assert store.recall(KEY, "lane0", "m", now=T0 + 300) is None
    assert store.recall(KEY, "lane1", "m", now=T0 + 300) == "c1"
    assert store.recall(KEY, "lane256", "m", now=T0 + 300) == "c256"


def test_rewriting_a_lane_makes_it_newest() -> None:
    store = RecallStore()
    for i in range(256):
        store.remember(KEY, f"lane{i}", "m", "c", now=T0 + i)
    store.remember(KEY, "lane0", "m", "c", now=T0 + 500)  # refresh: now newest
    store.remember(KEY, "lane256", "m", "c", now=T0 + 501)
    assert store.recall(KEY, "lane0", "m", now=T0 + 502) == "c"
    assert store.recall(KEY, "lane1", "m", now=T0 + 502) is None


def test_name_size_limits() -> None:
    assert name_size("x" * 1024) == 1024
    assert name_size("x" * 1025) is None
    assert name_size("é" * 512) == 1024
    assert name_size("é" * 513) is None  # 513 characters but 1026 bytes


@pytest.mark.parametrize("oversized", ["x" * 1025, "é" * 513])
def test_oversized_name_leaves_previous_selection_untouched(oversized: str) -> None:
    store = RecallStore()
    store.remember(KEY, "lane", "m1", "first", now=T0)
    assert not store.remember(KEY, "lane", oversized, "second", now=T0 + 1)
    assert store.recall(KEY, "lane", "m1", now=T0 + 2) == "first"
    assert store.recall(KEY, "lane", oversized, now=T0 + 2) is None
    assert store.total_bytes == 2


def test_1024_byte_name_is_accepted() -> None:
    store = RecallStore()
    assert store.remember(KEY, "lane", "x" * 1024, "c", now=T0)
    assert store.recall(KEY, "lane", "x" * 1024, now=T0) == "c"


def test_total_name_bytes_bounded_to_64_kib() -> None:
    store = RecallStore()
    assert MAX_TOTAL_BYTES == 65_536
    for i in range(64):
        store.remember(KEY, f"lane{i}", f"{i:04d}" + "x" * 1020, "c", now=T0 + i)
    assert len(store) == 64 and store.total_bytes == 65_536  # exactly at the bound: kept
    store.remember(KEY, "lane64", "y", "c", now=T0 + 64)
    assert len(store) == 64 and store.total_bytes == 65_536 - 1024 + 1
    assert store.recall(KEY, "lane0", "0000" + "x" * 1020, now=T0 + 65) is None
    assert store.recall(KEY, "lane1", "0001" + "x" * 1020, now=T0 + 65) == "c"
    assert store.recall(KEY, "lane64", "y", now=T0 + 65) == "c"


def _snapshot(*, disabled: bool = False, targets: tuple[TargetSpec, ...] | None = None) -> Any:
    combo = ComboSpec(id="fast", targets=targets or (TargetSpec("a", "m1"), TargetSpec("b", "m2")))
    providers = {
        "a": ProviderSpec(name="a", adapter="anthropic", base_url="https://a", disabled=disabled),
        "b": ProviderSpec(name="b", adapter="openai-chat", base_url="https://b"),
    }
    return ConfigSnapshot(version=1, providers=providers, combos={"fast": combo})


@pytest.mark.parametrize(
    ("snapshot", "expected"),
    [
        (_snapshot(), "fast"),
        (_snapshot(disabled=True), None),  # provider disabled
        (_snapshot(targets=(TargetSpec("b", "m2"),)), None),  # combo no longer has the target
        (ConfigSnapshot(version=2, providers={}, combos={}), None),  # combo deleted
    ],
)
def test_recall_drops_entries_that_are_no_longer_live(
    snapshot: ConfigSnapshot, expected: str | None
) -> None:
    store = RecallStore()
    store.remember(KEY, "lane", "m1", "fast", now=T0, target="a/m1")
    live = snapshot_liveness(snapshot)
    assert store.recall(KEY, "lane", "m1", now=T0 + 1, live=live) == expected
    assert len(store) == (1 if expected else 0)


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        ({"session_id": "019a3c5e-7c2b-7d10"}, {"prompt_cache_key": "pck"}, "019a3c5e-7c2b-7d10"),
        ({"Session-Id": " s1 "}, None, "s1"),
        ({"thread-id": "t1", "x-session-id": "x1"}, None, "t1"),
        ({"X-Session-Id": "x1"}, None, "x1"),
        ({"x-session-id": "bad value!"}, {"prompt_cache_key": "pck"}, "pck"),
        ({"x-session-id": "-leading"}, None, None),
        ({"x-session-id": "a" * 128}, None, "a" * 128),
        ({"x-session-id": "a" * 129}, None, None),
        ({"conversation_id": "conv1"}, None, "conv1"),
        ({}, {"prompt_cache_key": "019a3c5e"}, "019a3c5e"),
        ({}, {"prompt_cache_key": 7}, None),
        ({}, None, None),
    ],
)
def test_lane_of(
    headers: dict[str, str], body: dict[str, Any] | None, expected: str | None
) -> None:
    assert lane_of(headers, body) == expected


def test_module_is_framework_free() -> None:
    tree = ast.parse(Path(recall_mod.__file__).read_text())
    imported = {
        (node.module or "") if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not any(name.split(".")[0] in {"django", "ninja", "channels"} for name in imported)
