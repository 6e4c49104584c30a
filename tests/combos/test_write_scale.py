"""A config write at a team's scale checks only what it touches (issue #24): a combo write
reads the other combos' aliases, not every combo whole; a key's allowed models are checked
against the committed config, rebuilt only when the config moved."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from accounts import key_services
from combos import selectors, services
from combos.models import Combo, ComboTarget
from providers import services as provider_services
from providers.errors import ConfigError
from providers.models import Provider

PROVIDER = {
    "adapter": "openai-responses",
    "baseUrl": "http://127.0.0.1:9/v1",
    "models": {"m": {}, "n": {}},
}


def make_combos(start: int, count: int) -> None:
    provider = Provider.objects.get(name="p")
    rows = Combo.objects.bulk_create(
        Combo(combo_id=f"c{i:04d}", alias=f"team/c{i}" if i % 10 == 0 else None)
        for i in range(start, start + count)
    )
    ComboTarget.objects.bulk_create(
        ComboTarget(combo=c, provider=provider, model=m, position=j)
        for c in rows
        for j, m in enumerate("mn")
    )


def write_queries(combo_id: str, model: str) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        services.combo_set(combo_id=combo_id, raw={"targets": [{"provider": "p", "model": model}]})
    return [q["sql"] for q in ctx.captured_queries]


@pytest.mark.django_db
def test_a_combo_write_costs_the_same_queries_with_5_or_300_other_combos() -> None:
    provider_services.provider_set(name="p", raw=PROVIDER)
    make_combos(0, 5)
    write_queries("w", "m")
    few = write_queries("w", "n")
    make_combos(5, 295)
    many = write_queries("w", "m")
    assert len(many) == len(few)
    # No query reads every combo's targets: each one that reads targets names its combos.
    for sql in many:
        if 'FROM "combos_combotarget"' in sql and sql.lstrip().startswith("SELECT"):
            assert "WHERE" in sql, sql


@pytest.mark.django_db
def test_a_combo_write_still_refuses_another_combos_alias_among_many() -> None:
    provider_services.provider_set(name="p", raw=PROVIDER)
    make_combos(0, 300)
    raw = {"targets": [{"provider": "p", "model": "m"}], "alias": "team/c290"}
    with pytest.raises(ConfigError) as caught:
        services.combo_set(combo_id="w", raw=raw)
    assert caught.value.args[0] == 'alias "team/c290" is already used by combo "c0290"'
    # Its own alias is no collision on a rewrite, nor the rename source's.
    services.combo_set(combo_id="c0290", raw=raw)
    services.combo_set(combo_id="renamed", raw=raw, rename_from="c0290")
    assert selectors.combo_aliases()["renamed"] == {"alias": "team/c290"}
    assert "c0291" not in selectors.combo_aliases()  # no alias: not listed


@pytest.mark.django_db(transaction=True)
def test_allowed_models_are_checked_against_a_snapshot_rebuilt_only_when_the_config_moved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider_services.provider_set(name="p", raw=PROVIDER)
    services.combo_set(combo_id="first", raw={"targets": [{"provider": "p", "model": "m"}]})
    builds: list[int] = []
    original = selectors.config_snapshot

    def counted() -> Any:
        builds.append(1)
        return original()

    monkeypatch.setattr(selectors, "config_snapshot", counted)
    assert key_services.allowed_models_problem(["combo/first", "p/n"]) is None
    with CaptureQueriesContext(connection) as ctx:
        assert key_services.allowed_models_problem(["combo/first"]) is None
        assert key_services.allowed_models_problem(["combo/second"]) == (
            "unknown combo second in allowedModels (combo/second)"
        )
    assert len(ctx.captured_queries) == 2  # the config row's stamp, once per check
    assert builds == [1]

    # A config write moves the stamp: the next check sees the new combo.
    services.combo_set(combo_id="second", raw={"targets": [{"provider": "p", "model": "n"}]})
    assert key_services.allowed_models_problem(["combo/second"]) is None
    assert builds == [1, 1]

    # Inside a transaction (which may have changed the config before bumping) it reads afresh.
    with transaction.atomic():
        Combo.objects.create(combo_id="third")
        assert key_services.allowed_models_problem(["combo/third"]) is None
        transaction.set_rollback(True)
    assert key_services.allowed_models_problem(["combo/third"]) == (
        "unknown combo third in allowedModels (combo/third)"
    )
