"""approvals keep their review, summary and run state sealed

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-13 10:00:00

An approval's review snapshot, summary and run state move into `sealed_state`, encrypted for
the approval (`cairn.durable.sealing`, run state version 2); the clear columns become
nullable and stay NULL in new rows. `state_deleted_at` records when the sealed state was
deleted (its time to live, or its session deleted). Rows written before (version 1) keep
their clear columns: they are shown, never continued (the gate invalidates a version 1
approval as `migration_required`), and the sweep clears them like sealed ones
(docs/security.md, "Rows from before sealing").

`approvals` has no foreign key in or out, so SQLite's table rebuild (to drop NOT NULL) loses
nothing. Ledger results need no column: a sealed result is marked inside `result`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_CLEAR = (("review", sa.JSON()), ("summary", sa.Text()), ("run_state", sa.JSON()))


def upgrade() -> None:
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        batch_op.add_column(sa.Column("sealed_state", sa.LargeBinary(), nullable=True))
        batch_op.add_column(sa.Column("state_deleted_at", sa.Float(), nullable=True))
        for name, type_ in _CLEAR:
            batch_op.alter_column(name, existing_type=type_, nullable=True)


def downgrade() -> None:
    # Sealed rows have no clear state to go back to: they get empty ones, which the older
    # Cairn shows and never continues (their run state version, 2, is not its own).
    op.execute("UPDATE approvals SET review = '{}', summary = '', run_state = '{}' WHERE summary IS NULL")
    with op.batch_alter_table("approvals", schema=None) as batch_op:
        for name, type_ in _CLEAR:
            batch_op.alter_column(name, existing_type=type_, nullable=False)
        batch_op.drop_column("state_deleted_at")
        batch_op.drop_column("sealed_state")
