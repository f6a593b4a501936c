"""Alembic's head equals `store.tables`, and the migrations run down and up again."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from cairn.errors import StoreError
from cairn.store.db import Database
from cairn.store.migrate import check_schema, current_revision, downgrade, head_revision, upgrade
from cairn.store.tables import metadata

pytestmark = pytest.mark.anyio


async def test_head_matches_the_schema_module(db: Database) -> None:
    async with db.read() as conn:
        diff = await conn.run_sync(lambda sync: compare_metadata(MigrationContext.configure(sync), metadata))
    assert diff == []


async def test_downgrade_then_upgrade_round_trips(db: Database) -> None:
    await downgrade(db, "base")
    assert await current_revision(db) is None
    await upgrade(db)
    assert await current_revision(db) == head_revision()
    await check_schema(db)


async def test_an_unmigrated_database_is_refused_with_the_command_to_run(database_url: str) -> None:
    fresh = Database(database_url)
    try:
        with pytest.raises(StoreError, match="cairn db upgrade"):
            await check_schema(fresh)
    finally:
        await fresh.dispose()
