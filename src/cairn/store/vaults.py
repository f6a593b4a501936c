"""Vault and credential rows, always read within a tenant.

This module is the only writer of `vaults` and `credentials`. A credential row keeps what may
be shown (`auth`: its type and non-secret settings) apart from its secret values, which this
module only ever receives sealed (`secret`, opened by `cairn.durable.sealing` for the
credential's id). Deleting a vault deletes its credentials; the data keys of their secrets
are the caller's to shred in the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cairn.errors import ConflictError, InvalidRequestError
from cairn.store.db import Connection
from cairn.store.pages import Order, Page, fetch_page
from cairn.store.tables import credentials, vaults

__all__ = [
    "CredentialRecord",
    "VaultRecord",
    "credentials_of_vaults",
    "delete_credential",
    "delete_vault",
    "existing_vaults",
    "get_credential",
    "get_vault",
    "insert_credential",
    "insert_vault",
    "list_credentials",
    "list_vaults",
    "update_credential",
    "update_vault",
]


@dataclass(frozen=True, slots=True)
class VaultRecord:
    id: str
    tenant: str
    name: str | None
    metadata: dict[str, str]
    created_at: float


@dataclass(frozen=True, slots=True)
class CredentialRecord:
    id: str
    vault_id: str
    tenant: str
    name: str
    type: str
    # The credential's type and settings without any secret value: what the API shows.
    auth: dict[str, Any]
    # The secret values, sealed for this credential's id.
    secret: bytes
    metadata: dict[str, str]
    created_at: float
    updated_at: float


def _vault(row: sa.Row[Any]) -> VaultRecord:
    return VaultRecord(**row._asdict())


def _credential(row: sa.Row[Any]) -> CredentialRecord:
    values = row._asdict()
    values["secret"] = bytes(values["secret"])
    return CredentialRecord(**values)


def _matching(stmt: sa.Select[Any], column: sa.ColumnElement[Any], metadata: Mapping[str, str]) -> sa.Select[Any]:
    for key, value in metadata.items():
        stmt = stmt.where(column[key].as_string() == value)
    return stmt


# -- vaults ---------------------------------------------------------------------------------


async def insert_vault(conn: Connection, record: VaultRecord) -> None:
    await conn.execute(sa.insert(vaults).values(**{f: getattr(record, f) for f in VaultRecord.__slots__}))


async def get_vault(conn: Connection, vault_id: str, *, tenant: str) -> VaultRecord | None:
    """The vault, or None when it does not exist or belongs to another tenant."""
    row = (await conn.execute(sa.select(vaults).where(vaults.c.id == vault_id, vaults.c.tenant == tenant))).first()
    return _vault(row) if row is not None else None


async def existing_vaults(conn: Connection, vault_ids: Sequence[str], *, tenant: str) -> set[str]:
    """Which of `vault_ids` are vaults of `tenant`."""
    if not vault_ids:
        return set()
    stmt = sa.select(vaults.c.id).where(vaults.c.tenant == tenant, vaults.c.id.in_(list(vault_ids)))
    return {str(v) for v in (await conn.execute(stmt)).scalars().all()}


async def list_vaults(
    conn: Connection, tenant: str, *, after: str | None, order: Order, limit: int, metadata: Mapping[str, str]
) -> Page[VaultRecord]:
    """A page of the tenant's vaults; the filters are part of the query."""
    stmt = _matching(sa.select(vaults).where(vaults.c.tenant == tenant), vaults.c.metadata, metadata)
    after_key = None
    if after is not None:
        anchor = await get_vault(conn, after, tenant=tenant)
        if anchor is None:
            raise InvalidRequestError(f"unknown vault id in `after`: {after}", param="after")
        after_key = (anchor.created_at, anchor.id)
    page = await fetch_page(conn, stmt, (vaults.c.created_at, vaults.c.id), after=after_key, order=order, limit=limit)
    return Page([_vault(r) for r in page.data], page.has_more)


async def update_vault(conn: Connection, vault_id: str, **values: Any) -> VaultRecord:
    row = (await conn.execute(sa.update(vaults).where(vaults.c.id == vault_id).values(**values).returning(vaults))).one()
    return _vault(row)


async def delete_vault(conn: Connection, vault_id: str) -> None:
    """Delete the vault and, by cascade, its credentials."""
    await conn.execute(sa.delete(credentials).where(credentials.c.vault_id == vault_id))
    await conn.execute(sa.delete(vaults).where(vaults.c.id == vault_id))


# -- credentials ----------------------------------------------------------------------------


async def insert_credential(conn: Connection, record: CredentialRecord) -> None:
    """Store a new credential; a name already used in its vault is a 409."""
    taken = sa.select(credentials.c.id).where(credentials.c.vault_id == record.vault_id, credentials.c.name == record.name)
    if (await conn.execute(taken)).first() is not None:
        raise ConflictError(f"vault {record.vault_id} already has a credential named {record.name!r}", code="credential_name_taken",
                            param="name")
    try:
        await conn.execute(sa.insert(credentials).values(**{f: getattr(record, f) for f in CredentialRecord.__slots__}))
    except sa.exc.IntegrityError as exc:  # the same name inserted by a racing request
        raise ConflictError(f"vault {record.vault_id} already has a credential named {record.name!r}",
                            code="credential_name_taken", param="name") from exc


async def get_credential(conn: Connection, vault_id: str, credential_id: str, *, tenant: str) -> CredentialRecord | None:
    """The credential of that vault, or None (unknown, in another vault, or another tenant's)."""
    stmt = sa.select(credentials).where(
        credentials.c.id == credential_id, credentials.c.vault_id == vault_id, credentials.c.tenant == tenant
    )
    row = (await conn.execute(stmt)).first()
    return _credential(row) if row is not None else None


async def list_credentials(
    conn: Connection, vault: VaultRecord, *, after: str | None, order: Order, limit: int, metadata: Mapping[str, str]
) -> Page[CredentialRecord]:
    stmt = _matching(sa.select(credentials).where(credentials.c.vault_id == vault.id), credentials.c.metadata, metadata)
    after_key = None
    if after is not None:
        anchor = await get_credential(conn, vault.id, after, tenant=vault.tenant)
        if anchor is None:
            raise InvalidRequestError(f"unknown credential id in `after`: {after}", param="after")
        after_key = (anchor.created_at, anchor.id)
    key = (credentials.c.created_at, credentials.c.id)
    page = await fetch_page(conn, stmt, key, after=after_key, order=order, limit=limit)
    return Page([_credential(r) for r in page.data], page.has_more)


async def update_credential(conn: Connection, credential_id: str, **values: Any) -> CredentialRecord:
    stmt = sa.update(credentials).where(credentials.c.id == credential_id).values(**values).returning(credentials)
    return _credential((await conn.execute(stmt)).one())


async def delete_credential(conn: Connection, credential_id: str) -> None:
    await conn.execute(sa.delete(credentials).where(credentials.c.id == credential_id))


async def credentials_of_vaults(conn: Connection, vault_ids: Sequence[str], *, tenant: str) -> list[CredentialRecord]:
    """Every credential of these vaults of `tenant` (vaults since deleted have none)."""
    if not vault_ids:
        return []
    stmt = (
        sa.select(credentials)
        .where(credentials.c.tenant == tenant, credentials.c.vault_id.in_(list(vault_ids)))
        .order_by(credentials.c.created_at, credentials.c.id)
    )
    return [_credential(r) for r in (await conn.execute(stmt)).all()]
