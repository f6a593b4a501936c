"""The schema: one SQLAlchemy MetaData shared by SQLite and PostgreSQL.

Alembic's head must equal this module (tests/migration checks it). Times are float
seconds since the epoch, taken from the database clock where they guard leases.
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = [
    "api_keys",
    "approvals",
    "artifacts",
    "credentials",
    "data_keys",
    "events",
    "idempotency_keys",
    "items",
    "jobs",
    "ledger_entries",
    "metadata",
    "required_actions",
    "session_files",
    "sessions",
    "turns",
    "vaults",
]

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
    }
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("role", sa.String(32), nullable=False),
    sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("revoked_at", sa.Float, nullable=True),
)

sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("agent", sa.JSON, nullable=False),
    sa.Column("environment", sa.JSON, nullable=False),
    sa.Column("environment_id", sa.String(64), nullable=False),
    sa.Column("metadata", sa.JSON, nullable=False),
    # The environment's variables: given at create, never rendered (they may be secrets).
    sa.Column("env", sa.JSON, nullable=False, server_default="{}"),
    # `ready` or `suspended` for a hosted environment (owned by `set_environment_status`).
    sa.Column("environment_status", sa.String(16), nullable=True),
    # Settings written by create and update only.
    sa.Column("prompt_cache_options", sa.JSON, nullable=True),
    sa.Column("review", sa.String(16), nullable=True),
    sa.Column("spend_control", sa.JSON, nullable=True),
    # The registered agent version and revision a session is pinned to (created with agent_id).
    sa.Column("agent_version", sa.String(160), nullable=True),
    sa.Column("agent_revision", sa.String(64), nullable=True),
    # The tenant's vaults whose credentials the session's turns get (`vault_ids`, at create only).
    sa.Column("vault_ids", sa.JSON, nullable=False, server_default="[]"),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("usage", sa.JSON, nullable=True),
    sa.Column("last_event_seq", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("next_turn_ordinal", sa.Integer, nullable=False, server_default="0"),
    sa.Column("outputs_manifest", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("last_active_at", sa.Float, nullable=False),
    # Lists order by (created_at, id): ids are random, so they cannot order alone.
    sa.Index("ix_sessions_tenant_created", "tenant", "created_at", "id"),
)

turns = sa.Table(
    "turns",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    sa.Column("ordinal", sa.Integer, nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("input", sa.JSON, nullable=False),
    # Run state: how many model steps are durably recorded, and the next output index.
    sa.Column("step", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_output_index", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()),
    # Fencing token of the job lease currently allowed to write for this turn.
    sa.Column("lease_token", sa.BigInteger, nullable=True),
    sa.Column("error", sa.JSON, nullable=True),
    sa.Column("usage", sa.JSON, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("started_at", sa.Float, nullable=True),
    sa.Column("completed_at", sa.Float, nullable=True),
    # The run's persisted context (the operator's declared keys), sealed for the turn.
    sa.Column("context", sa.LargeBinary, nullable=True),
    sa.UniqueConstraint("session_id", "ordinal"),
)

items = sa.Table(
    "items",
    metadata,
    sa.Column("position", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(64), nullable=False, unique=True),
    sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    sa.Column("turn_id", sa.String(64), nullable=False),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("status", sa.String(32), nullable=True),
    sa.Column("call_id", sa.String(128), nullable=True),
    # Who runs a call: "workspace" (Cairn), "client" (requires_action) or "operator" (its code, in the worker).
    sa.Column("tool_kind", sa.String(16), nullable=True),
    sa.Column("output_index", sa.Integer, nullable=True),
    sa.Column("data", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Index("ix_items_session_position", "session_id", "position"),
    sa.Index("ix_items_turn_call", "turn_id", "call_id"),
)

# What a waiting turn needs from the client, one row per pending call (spec §3.1 RequiredAction).
required_actions = sa.Table(
    "required_actions",
    metadata,
    sa.Column("position", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    sa.Column("turn_id", sa.String(64), sa.ForeignKey("turns.id", ondelete="CASCADE"), nullable=False),
    sa.Column("call_id", sa.String(128), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    # The action's fields other than type, call_id and turn_id (for a function call: name, arguments).
    sa.Column("payload", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.UniqueConstraint("turn_id", "call_id"),
    sa.Index("ix_required_actions_session_position", "session_id", "position"),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("type", sa.String(96), nullable=False),
    sa.Column("turn_id", sa.String(64), nullable=True),
    # The event exactly as sent, serialized once when appended.
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

artifacts = sa.Table(
    "artifacts",
    metadata,
    sa.Column("position", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(64), nullable=False, unique=True),
    sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id", ondelete="CASCADE"), nullable=False),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("turn_id", sa.String(64), nullable=False),
    sa.Column("environment_id", sa.String(64), nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("size_bytes", sa.BigInteger, nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False, index=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.UniqueConstraint("turn_id", "path"),
    sa.Index("ix_artifacts_session_position", "session_id", "position"),
)

idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("request_digest", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

# A session's inline files (`environment.files`), kept until the worker that first runs one of
# its turns writes them into a fresh workspace: the API process never holds a workspace.
session_files = sa.Table(
    "session_files",
    metadata,
    sa.Column("session_id", sa.String(64), sa.ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("data", sa.LargeBinary, nullable=False),
)

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("session_id", sa.String(64), nullable=False),
    sa.Column("turn_id", sa.String(64), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    # Monotonic per claim: every write under a lease names it (fencing).
    sa.Column("lease_token", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("lease_owner", sa.String(128), nullable=True),
    sa.Column("lease_expires_at", sa.Float, nullable=True),
    # A queued job is not claimed before this time (database clock): backoff after a crash.
    sa.Column("run_after", sa.Float, nullable=True),
    # What a job needs beyond its session and turn (e.g. the tenant of a deleted session).
    sa.Column("payload", sa.JSON, nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Index("ix_jobs_status_id", "status", "id"),
)

# One row per tool call held for a person's decision (docs/approvals.md). No foreign key to
# the session: an approval outlives its session's deletion, as a record of what was decided.
approvals = sa.Table(
    "approvals",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("session_id", sa.String(64), nullable=False),
    sa.Column("turn_id", sa.String(64), nullable=False),
    sa.Column("call_id", sa.String(128), nullable=False),
    sa.Column("tool_name", sa.String(128), nullable=False),
    # What the approver is shown: the tool's redacted snapshot of the arguments, and one line.
    # In clear only in rows of run state version 1 (before sealing, migration 0010); since
    # then NULL, and kept in `sealed_state` with the run state.
    sa.Column("review", sa.JSON, nullable=True),
    sa.Column("summary", sa.Text, nullable=True),
    # HMAC-SHA-256 of the canonical JSON of the call's identity and arguments.
    sa.Column("arguments_digest", sa.String(64), nullable=False),
    sa.Column("agent_version", sa.String(128), nullable=False),
    sa.Column("agent_revision", sa.String(64), nullable=False),
    # The roles that may decide, as the tool named them when the call was held.
    sa.Column("approvers", sa.JSON, nullable=False),
    # What continues exactly this call: references (the call's item, the pinned agent), versioned.
    # Clear in version 1 rows only; NULL since (sealed).
    sa.Column("run_state", sa.JSON, nullable=True),
    sa.Column("run_state_version", sa.Integer, nullable=False),
    # Review, summary and run state sealed for this approval (`cairn.durable.sealing`), and when
    # they were deleted (shredded after their time to live, or with the session).
    sa.Column("sealed_state", sa.LargeBinary, nullable=True),
    sa.Column("state_deleted_at", sa.Float, nullable=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.String(32), nullable=True),
    # The approver's rejection message, or why it was revoked.
    sa.Column("message", sa.Text, nullable=True),
    # Times on the database clock.
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("decided_at", sa.Float, nullable=True),
    # When a worker let the approved call through to run it: from then on it cannot be revoked.
    sa.Column("started_at", sa.Float, nullable=True),
    # The deciding key, and its tenant and role at decision time.
    sa.Column("decided_by", sa.String(64), nullable=True),
    sa.Column("decided_tenant", sa.String(128), nullable=True),
    sa.Column("decided_role", sa.String(32), nullable=True),
    sa.UniqueConstraint("turn_id", "call_id"),
    sa.Index("ix_approvals_tenant_created", "tenant", "created_at", "id"),
    sa.Index("ix_approvals_session_id", "session_id"),
    sa.Index("ix_approvals_status_expires", "status", "expires_at"),
)

# One row per side effect, keyed by an operation key the model never chooses (design §1,
# invariant 5). No foreign key to the session: entries outlive it for a retention period.
ledger_entries = sa.Table(
    "ledger_entries",
    metadata,
    sa.Column("operation_key", sa.String(128), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("session_id", sa.String(64), nullable=False),
    sa.Column("turn_id", sa.String(64), nullable=False),
    sa.Column("call_id", sa.String(128), nullable=False),
    sa.Column("approval_id", sa.String(64), nullable=True),
    sa.Column("tool_name", sa.String(64), nullable=False),
    sa.Column("arguments_digest", sa.String(64), nullable=False),
    sa.Column("status", sa.String(24), nullable=False),
    # Executions started (reserved -> executing), for the retry limit.
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    # The job claim (its lease token) that holds the entry; its job's lease says whether it lives.
    sa.Column("holder_token", sa.BigInteger, nullable=True),
    # failed_retryable: not claimed again before this time (database clock).
    sa.Column("retry_after", sa.Float, nullable=True),
    # The stored result, sealed for the entry: {"sealed": base64} or {"blob": sha256, "size": n,
    # "sealed": true} for a large one (the blob holds the sealed bytes). Before migration 0010:
    # {"output": ...} or {"blob": sha256, "size": n} in clear.
    sa.Column("result", sa.JSON, nullable=True),
    # The blob a large result is stored in (indexed: the blob garbage collector asks for it).
    sa.Column("result_blob", sa.String(64), nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    # Why the entry is uncertain, or how it was resolved, for the person who reads it.
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("resolved_by", sa.String(64), nullable=True),
    sa.Column("reuses", sa.Integer, nullable=False, server_default="0"),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Index("ix_ledger_entries_tenant_status", "tenant", "status"),
    sa.Index("ix_ledger_entries_session", "session_id"),
    sa.Index("ix_ledger_entries_turn", "turn_id"),
    sa.Index("ix_ledger_entries_result_blob", "result_blob"),
)

# A tenant's vaults of credentials (spec §2.5): the vault holds no secret itself.
vaults = sa.Table(
    "vaults",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("name", sa.Text, nullable=True),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Index("ix_vaults_tenant_created", "tenant", "created_at", "id"),
)

# A vault's credentials: what may be shown (`auth`, without any secret) apart from the secret
# values, which are only ever stored sealed (`cairn.durable.sealing`).
credentials = sa.Table(
    "credentials",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("vault_id", sa.String(64), sa.ForeignKey("vaults.id", ondelete="CASCADE"), nullable=False),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("auth", sa.JSON, nullable=False),
    sa.Column("secret", sa.LargeBinary, nullable=False),
    sa.Column("metadata", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.UniqueConstraint("vault_id", "name"),
    sa.Index("ix_credentials_vault_created", "vault_id", "created_at", "id"),
)

# The data key of every sealed blob, wrapped by a master key version (`cairn.durable.crypto`).
# The blob names its key by `id`; deleting the row makes the blob unreadable wherever a copy
# of it remains. `record_id` is the record the blob belongs to, for deletion and sweeps.
data_keys = sa.Table(
    "data_keys",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("record_id", sa.String(255), nullable=False),
    sa.Column("key_version", sa.Integer, nullable=False),
    sa.Column("wrapped", sa.LargeBinary, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Index("ix_data_keys_key_version", "key_version"),
    sa.Index("ix_data_keys_kind_record", "kind", "record_id"),
)
