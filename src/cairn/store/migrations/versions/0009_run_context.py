"""run context: a turn's persisted context, sealed

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 12:30:00

`turns.context` holds what an operator agent's tools keep across a pause (their declared
context keys), sealed for the turn; NULL for every existing turn, which had none. Added and
dropped with plain ALTER TABLE, never a rebuild of `turns`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("context", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE: a batch rebuild of `turns` on SQLite would cascade-delete what
    # references them (see 0003).
    op.drop_column("turns", "context")
