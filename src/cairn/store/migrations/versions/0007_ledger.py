"""the idempotency ledger: one entry per side effect, keyed by its operation key

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 11:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ledger_entries",
        sa.Column("operation_key", sa.String(length=128), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=64), nullable=False),
        sa.Column("turn_id", sa.String(length=64), nullable=False),
        sa.Column("call_id", sa.String(length=128), nullable=False),
        sa.Column("approval_id", sa.String(length=64), nullable=True),
        sa.Column("tool_name", sa.String(length=64), nullable=False),
        sa.Column("arguments_digest", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=24), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("holder_token", sa.BigInteger(), nullable=True),
        sa.Column("retry_after", sa.Float(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("result_blob", sa.String(length=64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("resolved_by", sa.String(length=64), nullable=True),
        sa.Column("reuses", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("operation_key", name=op.f("pk_ledger_entries")),
    )
    op.create_index("ix_ledger_entries_tenant_status", "ledger_entries", ["tenant", "status"], unique=False)
    op.create_index("ix_ledger_entries_session", "ledger_entries", ["session_id"], unique=False)
    op.create_index("ix_ledger_entries_turn", "ledger_entries", ["turn_id"], unique=False)
    op.create_index("ix_ledger_entries_result_blob", "ledger_entries", ["result_blob"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_ledger_entries_result_blob", table_name="ledger_entries")
    op.drop_index("ix_ledger_entries_turn", table_name="ledger_entries")
    op.drop_index("ix_ledger_entries_session", table_name="ledger_entries")
    op.drop_index("ix_ledger_entries_tenant_status", table_name="ledger_entries")
    op.drop_table("ledger_entries")
