"""API keys: stored as SHA-256 digests of high-entropy secrets; each carries a tenant and role."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cairn.errors import InvalidRequestError
from cairn.store.db import Connection
from cairn.store.tables import api_keys

__all__ = ["ROLES", "KeyRecord", "create_key", "find_key", "get_key", "hash_secret", "list_keys", "revoke_key", "set_role"]

# admin: everything in its tenant; member: sessions and their inputs; reader: GET only;
# approver: reads, and decides the approvals whose tool names it (docs/approvals.md).
ROLES = ("admin", "member", "reader", "approver")


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise InvalidRequestError(f"unknown role {role!r}; choose one of {', '.join(ROLES)}", param="role")


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    tenant: str
    role: str
    created_at: float
    revoked_at: float | None


def hash_secret(secret: str) -> str:
    # A plain digest suffices: secrets carry 256 bits of entropy, so there is nothing to brute-force.
    return hashlib.sha256(secret.encode()).hexdigest()


async def create_key(conn: Connection, *, tenant: str, role: str) -> tuple[KeyRecord, str]:
    """Create a key and return it with its secret, which is never stored or shown again."""
    _check_role(role)
    if not tenant or len(tenant) > 128 or not tenant.replace("-", "").replace("_", "").isalnum():
        raise InvalidRequestError("tenant must be 1-128 letters, digits, '-' or '_'", param="tenant")
    secret = f"cairn_sk_{secrets.token_urlsafe(32)}"
    record = KeyRecord(id=f"key_{secrets.token_hex(8)}", tenant=tenant, role=role, created_at=time.time(), revoked_at=None)
    await conn.execute(
        sa.insert(api_keys).values(
            id=record.id, tenant=tenant, role=role, key_hash=hash_secret(secret), created_at=record.created_at
        )
    )
    return record, secret


def _record(row: sa.Row[Any]) -> KeyRecord:
    return KeyRecord(id=row.id, tenant=row.tenant, role=row.role, created_at=row.created_at, revoked_at=row.revoked_at)


async def find_key(conn: Connection, secret: str) -> KeyRecord | None:
    """The live key for `secret`, or None."""
    stmt = sa.select(api_keys).where(api_keys.c.key_hash == hash_secret(secret), api_keys.c.revoked_at.is_(None))
    row = (await conn.execute(stmt)).first()
    return _record(row) if row is not None else None


async def get_key(conn: Connection, key_id: str) -> KeyRecord | None:
    """The key with this id as it is now, revoked or not."""
    row = (await conn.execute(sa.select(api_keys).where(api_keys.c.id == key_id))).first()
    return _record(row) if row is not None else None


async def list_keys(conn: Connection) -> list[KeyRecord]:
    rows = (await conn.execute(sa.select(api_keys).order_by(api_keys.c.created_at))).all()
    return [_record(r) for r in rows]


async def revoke_key(conn: Connection, key_id: str) -> bool:
    stmt = sa.update(api_keys).where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None)).values(revoked_at=time.time())
    return (await conn.execute(stmt)).rowcount == 1


async def set_role(conn: Connection, key_id: str, role: str) -> KeyRecord | None:
    """Give a live key another role; None when there is no live key with that id. What the key
    decided before keeps the role it had then; what it decides next, and any approved call it
    decided that has not run yet, is judged by the new one."""
    _check_role(role)
    stmt = sa.update(api_keys).where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None)).values(role=role).returning(api_keys)
    row = (await conn.execute(stmt)).first()
    return _record(row) if row is not None else None
