"""pinned agents: a session created with a registered agent's id keeps its version and revision

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-08 10:00:00

`cairn serve --agents MODULE:ATTR` registers the operator's agents; a session created with
`agent_id` is pinned to the newest version of that agent and its revision for its life. Both
are written at create only; sessions that brought their own agent have neither.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE on both databases: never a rebuild of `sessions` (see 0003).
    op.add_column("sessions", sa.Column("agent_version", sa.String(length=160), nullable=True))
    op.add_column("sessions", sa.Column("agent_revision", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("sessions", "agent_revision")
    op.drop_column("sessions", "agent_version")
