"""Bearer-key authentication and the caller's tenant and role.

A tenant never learns that another tenant's objects exist: lookups are scoped by tenant,
so a foreign id is a 404 like an unknown one.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from cairn.engine.runtime import Runtime
from cairn.errors import AuthenticationError, PermissionDeniedError
from cairn.store.approvals import Decider
from cairn.store.keys import find_key

__all__ = ["Principal", "authenticate"]

_WRITE_ROLES = ("admin", "member")


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: str
    tenant: str
    role: str

    def require_write(self) -> None:
        """Sessions and their inputs are written by `admin` and `member` keys; a `reader` or an
        `approver` may read them (an approver decides approvals, checked per approval)."""
        if self.role not in _WRITE_ROLES:
            raise PermissionDeniedError(f"API key {self.key_id} has role {self.role!r}, which may only read")

    def require_admin(self, what: str) -> None:
        """Only the tenant's `admin` keys may do `what` (manage vaults and credentials)."""
        if self.role != "admin":
            raise PermissionDeniedError(f"API key {self.key_id} has role {self.role!r}; only an admin key may {what}")

    @property
    def decider(self) -> Decider:
        """This key as the decider of an approval: its role is checked against the tool's approvers."""
        return Decider(key_id=self.key_id, tenant=self.tenant, role=self.role)


async def authenticate(request: Request, runtime: Runtime) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise AuthenticationError("Missing API key: send 'Authorization: Bearer <key>'.")
    async with runtime.db.read() as conn:
        key = await find_key(conn, secret.strip())
    if key is None:
        raise AuthenticationError("Incorrect API key provided.")
    return Principal(key_id=key.id, tenant=key.tenant, role=key.role)
