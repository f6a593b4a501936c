"""approvals: one row per tool call held for a person's decision

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-10 10:00:00

A new table only; nothing existing changes. It has no foreign key to sessions: an approval
is kept as a record of what was decided after its session is deleted.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "approvals",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("call_id", sa.String(length=128), nullable=False),
        sa.Column("tool_name", sa.String(length=128), nullable=False),
        sa.Column("review", sa.JSON(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("arguments_digest", sa.String(length=64), nullable=False),
        sa.Column("agent_version", sa.String(length=128), nullable=False),
        sa.Column("agent_revision", sa.String(length=64), nullable=False),
        sa.Column("approvers", sa.JSON(), nullable=False),
        sa.Column("run_state", sa.JSON(), nullable=False),
        sa.Column("run_state_version", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=32), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("decided_at", sa.Float(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("decided_by", sa.String(length=64), nullable=True),
        sa.Column("decided_tenant", sa.String(length=128), nullable=True),
        sa.Column("decided_role", sa.String(length=32), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_approvals")),
        sa.UniqueConstraint("turn_id", "call_id", name=op.f("uq_approvals_turn_id_call_id")),
    )
    op.create_index("ix_approvals_tenant_created", "approvals", ["tenant", "created_at", "id"])
    op.create_index("ix_approvals_session_id", "approvals", ["session_id"])
    op.create_index("ix_approvals_status_expires", "approvals", ["status", "expires_at"])


def downgrade() -> None:
    op.drop_index("ix_approvals_status_expires", table_name="approvals")
    op.drop_index("ix_approvals_session_id", table_name="approvals")
    op.drop_index("ix_approvals_tenant_created", table_name="approvals")
    op.drop_table("approvals")
