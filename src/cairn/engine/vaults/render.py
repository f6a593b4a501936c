"""Vaults and credentials as the API shows them (spec §3.9): settings, never a secret value.

A credential's row keeps its secret values only sealed, apart from `auth`, so rendering one
cannot show them; it shows what `auth` holds: the type and the settings of spec §3.9.
"""

from __future__ import annotations

from typing import Any

from cairn.store.vaults import CredentialRecord, VaultRecord

__all__ = ["render_credential", "render_vault"]


def render_vault(vault: VaultRecord) -> dict[str, Any]:
    return {"id": vault.id, "object": "vault", "name": vault.name, "metadata": vault.metadata,
            "created_at": int(vault.created_at)}


def render_credential(credential: CredentialRecord) -> dict[str, Any]:
    return {
        "id": credential.id,
        "object": "vault.credential",
        "vault_id": credential.vault_id,
        "name": credential.name,
        "metadata": credential.metadata,
        "created_at": int(credential.created_at),
        "updated_at": int(credential.updated_at),
        "auth": credential.auth,
    }
