"""vaults, credentials and data keys: secrets stored sealed, sessions naming their vaults

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-12 10:00:00

New tables for vaults and their credentials (a credential's secret values only ever sealed),
the data keys of every sealed blob (wrapped by a master key version), and the session's
`vault_ids`, written at create. Nothing existing changes: `sessions.vault_ids` is added with
plain ALTER TABLE (never a rebuild of `sessions`, see 0003), as an empty list for every
session that exists, which is what they had (vaults were refused at create).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("vault_ids", sa.JSON(), server_default="[]", nullable=False))
    op.create_table(
        "vaults",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("name", sa.Text(), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_vaults")),
    )
    op.create_index("ix_vaults_tenant_created", "vaults", ["tenant", "created_at", "id"])
    op.create_table(
        "credentials",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("vault_id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("auth", sa.JSON(), nullable=False),
        sa.Column("secret", sa.LargeBinary(), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["vault_id"], ["vaults.id"], name=op.f("fk_credentials_vault_id_vaults"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_credentials")),
        sa.UniqueConstraint("vault_id", "name", name=op.f("uq_credentials_vault_id_name")),
    )
    op.create_index("ix_credentials_vault_created", "credentials", ["vault_id", "created_at", "id"])
    op.create_table(
        "data_keys",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("record_id", sa.String(length=255), nullable=False),
        sa.Column("key_version", sa.Integer(), nullable=False),
        sa.Column("wrapped", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_data_keys")),
    )
    op.create_index("ix_data_keys_key_version", "data_keys", ["key_version"])
    op.create_index("ix_data_keys_kind_record", "data_keys", ["kind", "record_id"])


def downgrade() -> None:
    op.drop_index("ix_data_keys_kind_record", table_name="data_keys")
    op.drop_index("ix_data_keys_key_version", table_name="data_keys")
    op.drop_table("data_keys")
    op.drop_index("ix_credentials_vault_created", table_name="credentials")
    op.drop_table("credentials")
    op.drop_index("ix_vaults_tenant_created", table_name="vaults")
    op.drop_table("vaults")
    op.drop_column("sessions", "vault_ids")
