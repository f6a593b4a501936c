"""Cairn's error tree, the one place where failure kinds are named.

Every error Cairn raises on purpose is a `CairnError` (or a `CairnMisuseError` for
Cairn code calling itself wrongly). The API renders a `CairnError` into the error
envelope of spec §1.5 from its fields; nothing else decides a status code.

    CairnError                         message, code, http_status, param, retryable, context
    ├── ClientError                    the caller can fix it (4xx)
    │   ├── InvalidRequestError        400 malformed or semantically wrong input
    │   │   └── AgentDefinitionError   400 the operator's agents, tools or `--agents` spec are not usable
    │   ├── AuthenticationError        401 missing or unknown API key
    │   ├── PermissionDeniedError      403 the key's role may not do this
    │   ├── NotFoundError              404 unknown id, or another tenant's
    │   ├── ConflictError              409 valid, but not now (a turn is running)
    │   │   └── StatusConflictError    409 the row left the state its writer read (a racing writer won)
    │   ├── PayloadTooLargeError       413 body over the configured limit
    │   └── UnsupportedMediaTypeError  415 a body that is not JSON (by its Content-Type)
    └── ServerError                    Cairn or a dependency failed (5xx)
        ├── StoreError                 database unreachable, schema out of date
        ├── SandboxError               the sandbox could not run a command
        ├── ModelError                 the model provider failed
        ├── WorkspaceError             workspace files could not be read or written
        ├── BlobStoreError             artifact content could not be stored, found or collected
        ├── RunStateRefusedError       a pausing turn would store a secret or an undeclared context value
        ├── LeaseLostError             a worker's job lease was taken over (fencing)
        ├── StateDeserializeError      a sealed blob does not open: altered, moved, truncated or another master key
        └── RetryableToolError         raised by an operator's tool: it failed, nothing took effect,
                                       and trying again may succeed (the ledger retries it)
    CairnMisuseError (RuntimeError)    a bug: Cairn used its own API wrongly
    └── IllegalTransitionError         a status move that its entity's table forbids (cairn.states)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "AgentDefinitionError",
    "AgentVersionError",
    "AuthenticationError",
    "BlobStoreError",
    "CairnError",
    "CairnMisuseError",
    "ClientError",
    "ConflictError",
    "IllegalTransitionError",
    "InvalidRequestError",
    "LeaseLostError",
    "ModelError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RetryableToolError",
    "SandboxError",
    "ServerError",
    "StateDeserializeError",
    "StatusConflictError",
    "StoreError",
    "UnsupportedMediaTypeError",
    "WorkspaceError",
]


class CairnError(Exception):
    """Root of every deliberate Cairn failure; fields map one-to-one onto the error envelope."""

    default_code: ClassVar[str] = "server_error"
    default_status: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_retryable: ClassVar[bool | None] = None

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        http_status: int | None = None,
        retryable: bool | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param
        self.http_status = http_status or self.default_status
        self.retryable = self.default_retryable if retryable is None else retryable
        self.context: Mapping[str, Any] = dict(context or {})

    def __str__(self) -> str:
        return self.message


class ClientError(CairnError):
    default_code = "invalid_request_error"
    default_status = 400
    error_type = "invalid_request_error"
    default_retryable = False


class InvalidRequestError(ClientError):
    pass


class AgentDefinitionError(InvalidRequestError):
    """An operator's code (a `@cairn.tool`, a `cairn.Agent`, an `AgentRegistry` or the
    `--agents MODULE:ATTR` that names it) cannot be used; the message says what to change."""

    default_code = "invalid_agent_definition"


class AuthenticationError(ClientError):
    default_code = "invalid_api_key"
    default_status = 401
    error_type = "authentication_error"


class PermissionDeniedError(ClientError):
    default_code = "permission_denied"
    default_status = 403
    error_type = "permission_error"


class NotFoundError(ClientError):
    default_code = "not_found"
    default_status = 404
    error_type = "not_found_error"


class ConflictError(ClientError):
    default_code = "conflict"
    default_status = 409
    error_type = "conflict_error"


class StatusConflictError(ConflictError):
    """A guarded status write found its row no longer in the state the writer read: another
    writer moved it first. Retrying re-reads the new state (a cancel then finds the turn done)."""

    default_code = "status_conflict"
    default_retryable = True


class PayloadTooLargeError(ClientError):
    default_code = "payload_too_large"
    default_status = 413


class UnsupportedMediaTypeError(ClientError):
    default_code = "unsupported_media_type"
    default_status = 415


class ServerError(CairnError):
    pass


class StoreError(ServerError):
    default_code = "store_error"
    default_status = 503
    default_retryable = True


class SandboxError(ServerError):
    default_code = "sandbox_error"


class ModelError(ServerError):
    """A model provider failure; `code` is one of the turn error codes of spec §3.6."""

    default_code = "server_error"
    default_status = 502


class WorkspaceError(ServerError):
    default_code = "sandbox_error"


class BlobStoreError(ServerError):
    default_code = "blob_store_error"


class StateDeserializeError(ServerError):
    """A sealed blob (run state, review snapshot, credential secret) does not decrypt or
    verify: one byte changed, truncated, moved to another record or tenant, its data key
    gone, or sealed under a master key this process does not have. Nothing is continued on
    it; the message names the record, never its content."""

    default_code = "state_deserialize_failure"
    default_retryable = False


class RunStateRefusedError(ServerError):
    """What a pausing turn would store holds something it must not: a secret value, or a
    context value its agent does not declare. Nothing is stored; the turn fails with this
    code and the message (which names the key or field, never the value)."""

    default_code = "run_state_refused"


class LeaseLostError(ServerError):
    default_code = "lease_lost"
    default_retryable = True


class RetryableToolError(ServerError):
    """Raised by an operator's tool (`cairn.RetryableToolError`): this attempt failed without
    taking effect, and the same call may succeed later (a 503 from the deploy API). The
    idempotency ledger runs the call again after a backoff, up to its attempt limit; any
    other exception, or a returned error, fails the call for good (docs/ledger.md)."""

    default_code = "tool_failed_retryable"
    default_retryable = True


class AgentVersionError(ServerError):
    """A session is pinned to an agent version this process does not have, or whose factory
    changed since (its revision differs). `reason` is "missing" or "revision_changed"; the code
    is the turn error code of spec §3.6 for it."""

    default_code = "executor_version_incompatible"

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message, context={"reason": reason})
        self.reason = reason


class CairnMisuseError(RuntimeError):
    """Cairn code called its own API wrongly; always a bug, always a 500."""


class IllegalTransitionError(CairnMisuseError):
    """Cairn asked for a status move its entity's transition table does not have; raised
    before any SQL runs."""
