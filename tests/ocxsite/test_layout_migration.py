"""A database of the release before the layout move (issue #25) upgrades with nothing lost.

The test builds the database from nothing with the migrations as they were (the `ocxsite` app
owning keys, tokens, user budgets, the request log and budget events), fills it through the
historical models, then runs the new migrations (`accounts` 0001, `usage` 0002, `ocxsite` 0003:
state-only moves, the tables keep their names) and checks every row, that a key still
authenticates, that a management token still works, and that a permission granted on a moved
model is still held. Runs on SQLite and, with DATABASE_URL, on PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from django.apps import apps as global_apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from accounts import access
from accounts.models import ClientKey, ManagementToken, UserBudget
from usage.models import BudgetEvent, RequestLog, UsageRollup

# The leaf migrations of the apps whose models moved, before and after the move.
OLD = {"ocxsite": "0002_budgets", "usage": "0001_initial", "accounts": None}
AT = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
KEY_SECRET = "ocx_layout-test-secret-of-a-key-made-before-the-move"
TOKEN_SECRET = "ocxm_layout-test-secret-of-a-token-made-before-the-move"


def _leaves(executor: MigrationExecutor) -> list[tuple[str, str | None]]:
    return list(executor.loader.graph.leaf_nodes())


def _old_targets(executor: MigrationExecutor) -> list[tuple[str, str | None]]:
    targets = [(app, name) for app, name in _leaves(executor) if app not in OLD]
    return targets + [(app, name) for app, name in OLD.items()]


def _old_apps(executor: MigrationExecutor):  # type: ignore[no-untyped-def]
    """The models as the old release had them."""
    nodes = [(app, name) for app, name in _old_targets(executor) if name is not None]
    return executor.loader.project_state(nodes, at_end=True).apps


@pytest.fixture
def old_database(transactional_db: None) -> Iterator[MigrationExecutor]:
    """Every table dropped and rebuilt by the pre-move migrations; back at the leaves after."""
    executor = MigrationExecutor(connection)
    apps_with_migrations = {app for app, _ in _leaves(executor)}
    try:
        executor.migrate([(app, None) for app in apps_with_migrations])
        executor = MigrationExecutor(connection)
        executor.migrate(_old_targets(executor))
        yield MigrationExecutor(connection)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(_leaves(executor))


def _fill(executor: MigrationExecutor) -> dict[str, int]:
    """Rows as the old release wrote them, through its own (historical) models."""
    old = _old_apps(executor)
    assert {m.__name__ for m in old.get_app_config("ocxsite").get_models()} == {
        "ClientKey",
        "ManagementToken",
        "UserBudget",
        "RequestLog",
        "BudgetEvent",
    }
    user_model = old.get_model("auth", "User")
    alice = user_model.objects.create(username="alice", password="!")
    boss = user_model.objects.create(username="boss", password="!", is_staff=True)
    key = old.get_model("ocxsite", "ClientKey").objects.create(
        user=alice,
        name="laptop",
        prefix=KEY_SECRET[:10],
        digest=access.digest(KEY_SECRET),
        allowed_models=["combo/main"],
        rpm_limit=60,
        budgets=[{"tokens": 1000, "period": "day"}],
    )
    old.get_model("ocxsite", "ClientKey").objects.create(
        user=alice, name="old", prefix="ocx_revoked", digest="0" * 64, revoked=AT
    )
    old.get_model("ocxsite", "UserBudget").objects.create(
        user=alice, budgets=[{"tokens": 5000, "period": "week"}]
    )
    old.get_model("ocxsite", "ManagementToken").objects.create(
        user=boss, name="ci", prefix=TOKEN_SECRET[:10], digest=access.digest(TOKEN_SECRET)
    )
    old.get_model("ocxsite", "RequestLog").objects.create(
        request_id="req-1",
        at=AT,
        key_prefix=key.prefix,
        user="alice",
        requested_model="combo/main",
        combo="main",
        target="openai/gpt-5",
        status=200,
        outcome="ok",
        stream=True,
        duration_ms=1234,
        input_tokens=10,
        output_tokens=20,
        cached_tokens=5,
        attempts=[{"target": "openai/gpt-5", "status": 200}],
        skipped=[["b/x", "cooling"]],
    )
    old.get_model("ocxsite", "BudgetEvent").objects.create(
        at=AT,
        owner="key ocx_layout",
        scope="key",
        percent=80,
        budget={"tokens": 1000, "period": "day"},
        used=800.0,
        limit=1000.0,
        resets_at=AT + dt.timedelta(days=1),
        message="80 % of the daily budget",
    )
    old.get_model("usage", "UsageRollup").objects.create(
        bucket=AT, user="alice", key_id=key.pk, key_prefix=key.prefix, requests=3, input_tokens=30
    )
    # What the old release's post_migrate made: the content types and permissions of its
    # models; one permission granted to a user, to be still held after the move.
    content_type = old.get_model("contenttypes", "ContentType")
    permission = old.get_model("auth", "Permission")
    types = {
        model: content_type.objects.create(app_label="ocxsite", model=model)
        for model in ("clientkey", "managementtoken", "userbudget", "requestlog", "budgetevent")
    }
    change_key = permission.objects.create(
        name="Can change client key", content_type=types["clientkey"], codename="change_clientkey"
    )
    view_log = permission.objects.create(
        name="Can view request log", content_type=types["requestlog"], codename="view_requestlog"
    )
    boss.user_permissions.add(change_key, view_log)
    return {
        "key": key.pk,
        "boss": boss.pk,
        "clientkey_type": types["clientkey"].pk,
        "requestlog_type": types["requestlog"].pk,
    }


# accounts 0003: teams (auth.Group's one-to-one profile; `Team` is a proxy, no table).
ADDED_SINCE_THE_MOVE = {
    "accounts_teamprofile",
    "accounts_teamprofile_managers",
    "accounts_ssoidentity",
}


@pytest.mark.django_db(transaction=True)
def test_a_database_from_before_the_move_upgrades_with_every_row(
    old_database: MigrationExecutor,
) -> None:
    ids = _fill(old_database)
    tables = set(connection.introspection.table_names())

    old_database.migrate(_leaves(old_database))

    # No table was dropped or renamed: the moves are state-only. The only new tables are those
    # of models added after the move (the leaves migrate past it).
    after = set(connection.introspection.table_names())
    assert tables - after == set()
    assert after - tables == ADDED_SINCE_THE_MOVE
    key = ClientKey.objects.get(pk=ids["key"])
    assert (key.user.username, key.name, key.allowed_models, key.rpm_limit) == (
        "alice",
        "laptop",
        ["combo/main"],
        60,
    )
    assert key.budgets == [{"tokens": 1000, "period": "day"}]
    assert ClientKey.objects.count() == 2
    assert UserBudget.objects.get().budgets == [{"tokens": 5000, "period": "week"}]
    assert ManagementToken.objects.get().name == "ci"
    log = RequestLog.objects.get()
    assert (log.request_id, log.at, log.status, log.stream, log.duration_ms) == (
        "req-1",
        AT,
        200,
        True,
        1234,
    )
    assert (log.input_tokens, log.output_tokens, log.cached_tokens) == (10, 20, 5)
    assert log.attempts == [{"target": "openai/gpt-5", "status": 200}]
    assert log.skipped == [["b/x", "cooling"]]
    event = BudgetEvent.objects.get()
    assert (event.percent, event.used, event.limit, event.resets_at) == (
        80,
        800.0,
        1000.0,
        AT + dt.timedelta(days=1),
    )
    rollup = UsageRollup.objects.get()
    assert (rollup.user, rollup.key_id, rollup.requests, rollup.input_tokens) == (
        "alice",
        ids["key"],
        3,
        30,
    )

    # The key still authenticates (the proxy's key map), with its own and its user's budgets.
    info = access.client_keys_active()[access.digest(KEY_SECRET)]
    assert (info.id, info.user, info.rpm_limit) == (ids["key"], "alice", 60)
    assert info.allowed_models == frozenset({"combo/main"})
    assert [(b.kind, b.budget.describe()) for b in info.budgets] == [
        ("key", "1000 tokens per day"),
        ("user", "5000 tokens per week"),
    ]
    assert "0" * 64 not in access.client_keys_active()  # the revoked key stays revoked
    # The management token too.
    token_user = access.mgmt_user_for(TOKEN_SECRET)
    assert token_user is not None and token_user.pk == ids["boss"]

    # The content types moved with the models (same rows), so granted permissions hold.
    content_type = global_apps.get_model("contenttypes", "ContentType")
    assert content_type.objects.get(pk=ids["clientkey_type"]).app_label == "accounts"
    assert content_type.objects.get(pk=ids["requestlog_type"]).app_label == "usage"
    assert not content_type.objects.filter(app_label="ocxsite").exists()
    boss = global_apps.get_model("auth", "User").objects.get(pk=ids["boss"])
    assert boss.has_perm("accounts.change_clientkey")
    assert boss.has_perm("usage.view_requestlog")


@pytest.mark.django_db(transaction=True)
def test_the_moves_migrate_back_to_the_old_owners(old_database: MigrationExecutor) -> None:
    """Reversible: back at the old leaves, the old release finds its rows and content types."""
    ids = _fill(old_database)
    old_database.migrate(_leaves(old_database))
    executor = MigrationExecutor(connection)
    executor.migrate(_old_targets(executor))
    old = _old_apps(executor)
    assert old.get_model("ocxsite", "ClientKey").objects.get(pk=ids["key"]).name == "laptop"
    assert old.get_model("ocxsite", "RequestLog").objects.get().request_id == "req-1"
    content_type = old.get_model("contenttypes", "ContentType")
    assert content_type.objects.get(pk=ids["clientkey_type"]).app_label == "ocxsite"
