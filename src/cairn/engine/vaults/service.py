"""Vaults and their credentials behind the HTTP API (`/v1/vaults`, spec §2.5), per tenant.

A credential's secret values are sealed for the credential (`cairn.durable.sealing`) in the
transaction that stores its row, and never leave this module in the clear except to the
turn that runs with them (`cairn.engine.vaults.injection`). Rotating seals the new values
under a new data key and shreds the old one in the same transaction; deleting a credential
or a vault shreds the data keys of every secret it held, so a copy of a deleted row (in a
backup, or a database file's free pages) can never be opened.

Vaults and credentials have the statuses `active` and `archived` in the spec's list filters;
Cairn has no way to archive either, so every one is `active`.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any

from cairn.durable.crypto import SealScope
from cairn.engine.runtime import Runtime
from cairn.engine.vaults.auth import CredentialAuth, rotated_auth, split_auth
from cairn.errors import NotFoundError
from cairn.ids import new_credential_id, new_vault_id
from cairn.store.db import Connection
from cairn.store.pages import Order, Page
from cairn.store.vaults import (
    CredentialRecord,
    VaultRecord,
    credentials_of_vaults,
    delete_credential,
    delete_vault,
    get_credential,
    get_vault,
    insert_credential,
    insert_vault,
    list_credentials,
    list_vaults,
    update_credential,
    update_vault,
)

__all__ = ["CREDENTIAL_KIND", "VaultService", "credential_scope"]

# The kind of record a credential's sealed secret belongs to.
CREDENTIAL_KIND = "credential"


def credential_scope(credential: CredentialRecord) -> SealScope:
    return SealScope(tenant=credential.tenant, kind=CREDENTIAL_KIND, record_id=credential.id)


def _vault_not_found(vault_id: str) -> NotFoundError:
    return NotFoundError(f"No vault found with id '{vault_id}'.", param="vault_id")


class VaultService:
    def __init__(self, runtime: Runtime) -> None:
        self.db = runtime.db
        self.sealer = runtime.sealer

    # -- vaults -----------------------------------------------------------------------------

    async def create_vault(self, tenant: str, *, name: str | None, metadata: Mapping[str, str]) -> VaultRecord:
        vault = VaultRecord(id=new_vault_id(), tenant=tenant, name=name, metadata=dict(metadata), created_at=time.time())
        async with self.db.write() as conn:
            await insert_vault(conn, vault)
        return vault

    async def get_vault(self, tenant: str, vault_id: str) -> VaultRecord:
        async with self.db.read() as conn:
            return await self._vault(conn, tenant, vault_id)

    async def update_vault(self, tenant: str, vault_id: str, changes: Mapping[str, Any]) -> VaultRecord:
        """`changes` holds the keys the caller sent: `name` (None clears it), `metadata` (replaces)."""
        async with self.db.write() as conn:
            vault = await self._vault(conn, tenant, vault_id)
            if not changes:
                return vault
            return await update_vault(conn, vault.id, **dict(changes))

    async def list_vaults(
        self, tenant: str, *, after: str | None, order: Order, limit: int, metadata: Mapping[str, str], statuses: Collection[str]
    ) -> Page[VaultRecord]:
        async with self.db.read() as conn:
            page = await list_vaults(conn, tenant, after=after, order=order, limit=limit, metadata=metadata)
        return page if "active" in statuses else Page([], False)

    async def delete_vault(self, tenant: str, vault_id: str) -> None:
        """Delete the vault, its credentials, and the data keys of their secrets."""
        async with self.db.write() as conn:
            vault = await self._vault(conn, tenant, vault_id)
            held = await credentials_of_vaults(conn, [vault.id], tenant=tenant)
            await self.sealer.shred(conn, *(c.secret for c in held))
            await delete_vault(conn, vault.id)

    async def _vault(self, conn: Connection, tenant: str, vault_id: str) -> VaultRecord:
        vault = await get_vault(conn, vault_id, tenant=tenant)
        if vault is None:
            raise _vault_not_found(vault_id)
        return vault

    # -- credentials ------------------------------------------------------------------------

    async def create_credential(
        self, tenant: str, vault_id: str, *, name: str, auth: Mapping[str, Any], metadata: Mapping[str, str]
    ) -> CredentialRecord:
        split = split_auth(auth)
        now = time.time()
        async with self.db.write() as conn:
            vault = await self._vault(conn, tenant, vault_id)
            credential_id = new_credential_id()
            scope = SealScope(tenant=tenant, kind=CREDENTIAL_KIND, record_id=credential_id)
            credential = CredentialRecord(
                id=credential_id,
                vault_id=vault.id,
                tenant=tenant,
                name=name,
                type=split.type,
                auth=split.public,
                secret=await self.sealer.seal_json(conn, split.secret, scope),
                metadata=dict(metadata),
                created_at=now,
                updated_at=now,
            )
            await insert_credential(conn, credential)
        return credential

    async def get_credential(self, tenant: str, vault_id: str, credential_id: str) -> CredentialRecord:
        async with self.db.read() as conn:
            return await self._credential(conn, tenant, vault_id, credential_id)

    async def list_credentials(
        self,
        tenant: str,
        vault_id: str,
        *,
        after: str | None,
        order: Order,
        limit: int,
        metadata: Mapping[str, str],
        statuses: Collection[str],
    ) -> Page[CredentialRecord]:
        async with self.db.read() as conn:
            vault = await self._vault(conn, tenant, vault_id)
            page = await list_credentials(conn, vault, after=after, order=order, limit=limit, metadata=metadata)
        return page if "active" in statuses else Page([], False)

    async def update_credential(
        self, tenant: str, vault_id: str, credential_id: str, changes: Mapping[str, Any]
    ) -> CredentialRecord:
        """`changes` holds what the caller sent: `auth` (a rotation: new secret values under a
        new data key, the old key shredded) and `metadata` (replaces)."""
        async with self.db.write() as conn:
            credential = await self._credential(conn, tenant, vault_id, credential_id)
            values: dict[str, Any] = {}
            if "metadata" in changes:
                values["metadata"] = dict(changes["metadata"])
            if "auth" in changes:
                scope = credential_scope(credential)
                stored = CredentialAuth(credential.auth, await self.sealer.open_json(conn, credential.secret, scope))
                rotated = rotated_auth(stored, changes["auth"])
                values.update(auth=rotated.public, secret=await self.sealer.seal_json(conn, rotated.secret, scope))
                await self.sealer.shred(conn, credential.secret)
            if not values:
                return credential
            return await update_credential(conn, credential.id, updated_at=time.time(), **values)

    async def delete_credential(self, tenant: str, vault_id: str, credential_id: str) -> None:
        async with self.db.write() as conn:
            credential = await self._credential(conn, tenant, vault_id, credential_id)
            await self.sealer.shred(conn, credential.secret)
            await delete_credential(conn, credential.id)

    async def _credential(self, conn: Connection, tenant: str, vault_id: str, credential_id: str) -> CredentialRecord:
        vault = await self._vault(conn, tenant, vault_id)
        credential = await get_credential(conn, vault.id, credential_id, tenant=tenant)
        if credential is None:
            raise NotFoundError(f"No credential found with id '{credential_id}' in vault '{vault_id}'.", param="credential_id")
        return credential
