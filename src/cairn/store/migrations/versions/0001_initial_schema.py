"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 15:01:10.306250
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('api_keys',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('role', sa.String(length=32), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('revoked_at', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('key_hash', name=op.f('uq_api_keys_key_hash'))
    )
    op.create_table('jobs',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('session_id', sa.String(length=64), nullable=False),
    sa.Column('turn_id', sa.String(length=64), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default='0', nullable=False),
    sa.Column('lease_token', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('lease_owner', sa.String(length=128), nullable=True),
    sa.Column('lease_expires_at', sa.Float(), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs'))
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index('ix_jobs_status_id', ['status', 'id'], unique=False)

    op.create_table('sessions',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('agent', sa.JSON(), nullable=False),
    sa.Column('environment', sa.JSON(), nullable=False),
    sa.Column('environment_id', sa.String(length=64), nullable=False),
    sa.Column('metadata', sa.JSON(), nullable=False),
    sa.Column('extra', sa.JSON(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('usage', sa.JSON(), nullable=True),
    sa.Column('last_event_seq', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('next_turn_ordinal', sa.Integer(), server_default='0', nullable=False),
    sa.Column('outputs_manifest', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('last_active_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sessions'))
    )
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.create_index('ix_sessions_tenant_created', ['tenant', 'created_at', 'id'], unique=False)

    op.create_table('artifacts',
    sa.Column('position', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('session_id', sa.String(length=64), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('turn_id', sa.String(length=64), nullable=False),
    sa.Column('environment_id', sa.String(length=64), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_artifacts_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('position', name=op.f('pk_artifacts')),
    sa.UniqueConstraint('id', name=op.f('uq_artifacts_id')),
    sa.UniqueConstraint('turn_id', 'path', name=op.f('uq_artifacts_turn_id_path'))
    )
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.create_index('ix_artifacts_session_position', ['session_id', 'position'], unique=False)
        batch_op.create_index(batch_op.f('ix_artifacts_sha256'), ['sha256'], unique=False)

    op.create_table('events',
    sa.Column('session_id', sa.String(length=64), nullable=False),
    sa.Column('seq', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('type', sa.String(length=96), nullable=False),
    sa.Column('turn_id', sa.String(length=64), nullable=True),
    sa.Column('data', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_events_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('session_id', 'seq', name=op.f('pk_events'))
    )
    op.create_table('idempotency_keys',
    sa.Column('session_id', sa.String(length=64), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('request_digest', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_idempotency_keys_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('session_id', 'key', name=op.f('pk_idempotency_keys'))
    )
    op.create_table('items',
    sa.Column('position', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('session_id', sa.String(length=64), nullable=False),
    sa.Column('turn_id', sa.String(length=64), nullable=False),
    sa.Column('type', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=True),
    sa.Column('call_id', sa.String(length=128), nullable=True),
    sa.Column('tool_kind', sa.String(length=16), nullable=True),
    sa.Column('output_index', sa.Integer(), nullable=True),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_items_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('position', name=op.f('pk_items')),
    sa.UniqueConstraint('id', name=op.f('uq_items_id'))
    )
    with op.batch_alter_table('items', schema=None) as batch_op:
        batch_op.create_index('ix_items_session_position', ['session_id', 'position'], unique=False)
        batch_op.create_index('ix_items_turn_call', ['turn_id', 'call_id'], unique=False)

    op.create_table('turns',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('session_id', sa.String(length=64), nullable=False),
    sa.Column('ordinal', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=32), nullable=False),
    sa.Column('input', sa.JSON(), nullable=False),
    sa.Column('step', sa.Integer(), server_default='0', nullable=False),
    sa.Column('next_output_index', sa.Integer(), server_default='0', nullable=False),
    sa.Column('cancel_requested', sa.Boolean(), server_default=sa.false(), nullable=False),
    sa.Column('lease_token', sa.BigInteger(), nullable=True),
    sa.Column('error', sa.JSON(), nullable=True),
    sa.Column('usage', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('started_at', sa.Float(), nullable=True),
    sa.Column('completed_at', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_turns_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_turns')),
    sa.UniqueConstraint('session_id', 'ordinal', name=op.f('uq_turns_session_id_ordinal'))
    )


def downgrade() -> None:
    op.drop_table('turns')
    with op.batch_alter_table('items', schema=None) as batch_op:
        batch_op.drop_index('ix_items_turn_call')
        batch_op.drop_index('ix_items_session_position')

    op.drop_table('items')
    op.drop_table('idempotency_keys')
    op.drop_table('events')
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_artifacts_sha256'))
        batch_op.drop_index('ix_artifacts_session_position')

    op.drop_table('artifacts')
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_index('ix_sessions_tenant_created')

    op.drop_table('sessions')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_status_id')

    op.drop_table('jobs')
    op.drop_table('api_keys')
