"""Prepared statements behave like the Core statements they are built from, on both databases."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from cairn.errors import CairnMisuseError
from cairn.store.db import Database
from cairn.store.migrate import upgrade
from cairn.store.prepared import Prepared
from cairn.store.tables import api_keys, sessions, turns

pytestmark = pytest.mark.anyio

_INSERT_KEY = Prepared(sa.insert(api_keys), column_keys=["id", "tenant", "role", "key_hash", "created_at"])
_REVOKE = Prepared(
    sa.update(api_keys)
    .where(api_keys.c.tenant == sa.bindparam("for_tenant"), api_keys.c.revoked_at.is_(None))
    .values(revoked_at=sa.bindparam("at"))
)
_ROLE_OF = Prepared(sa.select(api_keys.c.role).where(api_keys.c.id == sa.bindparam("key_id")))


def _key(n: int, tenant: str = "t1") -> dict[str, object]:
    return {"id": f"key_{n}", "tenant": tenant, "role": "member", "key_hash": f"hash_{n}", "created_at": 1.0 + n}


async def test_writes_count_rows_and_return_values_like_core(db: Database) -> None:
    async with db.write() as conn:
        await _INSERT_KEY.execute(conn, [_key(1), _key(2), _key(3, tenant="t2")])
        assert await _REVOKE.execute(conn, {"for_tenant": "t1", "at": 5.0}) == 2
        assert await _REVOKE.execute(conn, {"for_tenant": "t1", "at": 6.0}) == 0
        assert await _ROLE_OF.scalar(conn, {"key_id": "key_3"}) == "member"
    async with db.read() as conn:
        rows = (await conn.execute(sa.select(api_keys.c.id, api_keys.c.revoked_at).order_by(api_keys.c.id))).all()
    assert [tuple(r) for r in rows] == [("key_1", 5.0), ("key_2", 5.0), ("key_3", None)]


async def test_parameters_go_through_the_column_types(db: Database) -> None:
    # JSON and Boolean columns: stored as Core would store them, and read back by Core.
    insert = Prepared(
        sa.insert(turns),
        column_keys=["id", "session_id", "ordinal", "status", "input", "cancel_requested", "usage", "created_at"],
    )
    await _insert_session(db)
    values = {
        "id": "turn_1", "session_id": "sess_1", "ordinal": 0, "status": "queued", "cancel_requested": True,
        "input": [{"role": "user", "content": "héllo"}], "usage": None, "created_at": 1.0,
    }
    async with db.write() as conn:
        await insert.execute(conn, values)
    async with db.read() as conn:
        row = (await conn.execute(sa.select(turns).where(turns.c.id == "turn_1"))).one()
    assert row.input == values["input"] and row.cancel_requested is True and row.usage is None


async def test_a_constraint_violation_is_sqlalchemys_error_and_rolls_back(db: Database) -> None:
    with pytest.raises(sa.exc.IntegrityError):
        async with db.write() as conn:
            await _INSERT_KEY.execute(conn, _key(1))
            await _INSERT_KEY.execute(conn, _key(1))
    async with db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(api_keys))).scalar_one() == 0


async def test_scalar_refuses_a_statement_that_returns_no_single_value(db: Database) -> None:
    async with db.read() as conn:
        with pytest.raises(CairnMisuseError):
            await _ROLE_OF.scalar(conn, {"key_id": "key_none"})


async def test_one_statement_serves_two_databases_alternately(db: Database, tmp_path: Path) -> None:
    other = Database(f"sqlite:///{tmp_path / 'other.db'}")
    await upgrade(other)
    try:
        for n, database in enumerate([db, other, db, other]):
            async with database.write() as conn:
                await _INSERT_KEY.execute(conn, _key(n))
        for database in (db, other):
            async with database.read() as conn:
                assert (await conn.execute(sa.select(sa.func.count()).select_from(api_keys))).scalar_one() == 2
    finally:
        await other.dispose()


async def _insert_session(db: Database) -> None:
    async with db.write() as conn:
        await conn.execute(
            sa.insert(sessions).values(
                id="sess_1", tenant="t1", status="idle", agent={}, environment={}, environment_id="env_1", metadata={},
                outputs_manifest={}, created_at=1.0, last_active_at=1.0,
            )
        )
