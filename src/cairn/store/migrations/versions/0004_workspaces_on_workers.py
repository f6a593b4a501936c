"""workspaces on workers: a session's inline files are stored with it; jobs carry a payload

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03 09:40:00

The API process used to write inline files into a workspace on its own disk at create time.
Now they are stored here and written by the worker that first runs one of the session's
turns; a deleted session's workspace is removed by a `remove_workspace` job, whose payload
names the tenant (the session row is gone by then).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_files",
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_session_files_session_id_sessions"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("session_id", "position", name=op.f("pk_session_files")),
    )
    # A plain ALTER TABLE on both databases (no table rebuild).
    op.add_column("jobs", sa.Column("payload", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("payload")
    op.drop_table("session_files")
