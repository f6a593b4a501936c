"""Schema migrations with Alembic: upgrade to head, and check that a database is current.

Opening a store only checks the revision; `cairn db upgrade` (or the first start on an
empty embedded database) is what migrates.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from cairn.errors import StoreError
from cairn.store.db import Database

__all__ = ["check_schema", "current_revision", "head_revision", "upgrade"]

_SCRIPTS = Path(__file__).with_name("migrations")


def _config(connection: sa.Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_SCRIPTS))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None, "the migrations folder has no revisions"
    return head


async def current_revision(db: Database) -> str | None:
    async with db.read() as conn:
        return await conn.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())


async def upgrade(db: Database, revision: str = "head") -> None:
    await db.run_admin(lambda sync: command.upgrade(_config(sync), revision))


async def downgrade(db: Database, revision: str) -> None:
    await db.run_admin(lambda sync: command.downgrade(_config(sync), revision))


async def check_schema(db: Database) -> None:
    """Refuse to run on a database whose schema is not Cairn's current one."""
    current = await current_revision(db)
    head = head_revision()
    if current != head:
        raise StoreError(
            f"database schema is at {current or 'nothing'}, this Cairn needs {head}: run `cairn db upgrade`",
            code="schema_out_of_date",
            retryable=False,
        )
