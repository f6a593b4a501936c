"""session facts in their own columns and a required_actions table, instead of sessions.extra

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04 10:00:00.000000

`sessions.extra` was one JSON object rewritten whole by several writers. Its keys move:
`env`, `environment_status`, `prompt_cache_options`, `review` and `spend_control` to columns
of their own, `required_actions` to one row per pending action (kept only while the session
requires action and the action's turn waits: the rest were stale), `vault_ids` nowhere
(vaults are refused at create, so it was always empty).

Columns are added and dropped with plain ALTER TABLE, never by rebuilding `sessions`: on
SQLite a rebuild drops the old table, and with foreign keys on that deletes every turn,
item and event of every session through ON DELETE CASCADE.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

_SETTINGS = ('prompt_cache_options', 'review', 'spend_control')
_NEW_COLUMNS = ('env', 'environment_status', *_SETTINGS)

_sessions = sa.table(
    'sessions',
    sa.column('id', sa.String),
    sa.column('status', sa.String),
    sa.column('environment', sa.JSON),
    sa.column('extra', sa.JSON),
    sa.column('env', sa.JSON),
    sa.column('environment_status', sa.String),
    sa.column('prompt_cache_options', sa.JSON),
    sa.column('review', sa.String),
    sa.column('spend_control', sa.JSON),
)
_turns = sa.table('turns', sa.column('id', sa.String), sa.column('status', sa.String))
_actions = sa.table(
    'required_actions',
    sa.column('position', sa.Integer),
    sa.column('session_id', sa.String),
    sa.column('turn_id', sa.String),
    sa.column('call_id', sa.String),
    sa.column('kind', sa.String),
    sa.column('payload', sa.JSON),
    sa.column('created_at', sa.Float),
)


def upgrade() -> None:
    op.add_column('sessions', sa.Column('env', sa.JSON(), server_default='{}', nullable=False))
    op.add_column('sessions', sa.Column('environment_status', sa.String(length=16), nullable=True))
    op.add_column('sessions', sa.Column('prompt_cache_options', sa.JSON(), nullable=True))
    op.add_column('sessions', sa.Column('review', sa.String(length=16), nullable=True))
    op.add_column('sessions', sa.Column('spend_control', sa.JSON(), nullable=True))
    op.create_table('required_actions',
    sa.Column('position', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('session_id', sa.String(length=64), nullable=False),
    sa.Column('turn_id', sa.String(length=64), nullable=False),
    sa.Column('call_id', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_required_actions_session_id_sessions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['turn_id'], ['turns.id'], name=op.f('fk_required_actions_turn_id_turns'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('position', name=op.f('pk_required_actions')),
    sa.UniqueConstraint('turn_id', 'call_id', name=op.f('uq_required_actions_turn_id_call_id'))
    )
    with op.batch_alter_table('required_actions', schema=None) as batch_op:
        batch_op.create_index('ix_required_actions_session_position', ['session_id', 'position'], unique=False)

    bind = op.get_bind()
    waiting_turns = set(bind.execute(sa.select(_turns.c.id).where(_turns.c.status == 'waiting')).scalars())
    rows = bind.execute(sa.select(_sessions.c.id, _sessions.c.status, _sessions.c.environment, _sessions.c.extra)).all()
    for session_id, status, environment, extra in rows:
        extra = extra or {}
        hosted = (environment or {}).get('type') != 'none'
        bind.execute(
            sa.update(_sessions).where(_sessions.c.id == session_id).values(
                env=extra.get('env') or {},
                environment_status=(extra.get('environment_status') or 'ready') if hosted else None,
                **{key: extra.get(key) for key in _SETTINGS},
            )
        )
        if status != 'requires_action':
            continue
        actions = [
            {'session_id': session_id, 'turn_id': a['turn_id'], 'call_id': a['call_id'], 'kind': a.get('type', 'function_call'),
             'payload': {k: v for k, v in a.items() if k not in ('type', 'call_id', 'turn_id')}, 'created_at': 0.0}
            for a in extra.get('required_actions') or []
            if a.get('turn_id') in waiting_turns and a.get('call_id')
        ]
        if actions:
            bind.execute(sa.insert(_actions), actions)
    op.drop_column('sessions', 'extra')


def downgrade() -> None:
    op.add_column('sessions', sa.Column('extra', sa.JSON(), server_default='{}', nullable=False))
    bind = op.get_bind()
    pending: dict[str, list[dict[str, Any]]] = {}
    for action in bind.execute(sa.select(_actions).order_by(_actions.c.position)).mappings():
        rendered = {'type': action['kind'], 'call_id': action['call_id'], **action['payload'], 'turn_id': action['turn_id']}
        pending.setdefault(action['session_id'], []).append(rendered)
    for row in bind.execute(sa.select(_sessions)).mappings():
        extra: dict[str, Any] = {key: row[key] for key in _SETTINGS if row[key] is not None}
        extra['env'] = row['env'] or {}
        if row['environment_status'] == 'suspended':
            extra['environment_status'] = 'suspended'
        if row['id'] in pending:
            extra['required_actions'] = pending[row['id']]
        bind.execute(sa.update(_sessions).where(_sessions.c.id == row['id']).values(extra=extra))
    if bind.dialect.name != 'sqlite':
        # Revision 0001 has no default; SQLite could drop it only by rebuilding the table.
        op.alter_column('sessions', 'extra', server_default=None)

    with op.batch_alter_table('required_actions', schema=None) as batch_op:
        batch_op.drop_index('ix_required_actions_session_position')

    op.drop_table('required_actions')
    for column in reversed(_NEW_COLUMNS):
        op.drop_column('sessions', column)
