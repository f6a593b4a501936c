"""Vaults and credentials (spec §2.5, §3.9): stored with their secret values sealed, shown
without them, and handed to a turn only in memory, when it runs (docs/security.md)."""

from cairn.engine.vaults.auth import SECRET_FIELDS, CredentialAuth, rotated_auth, split_auth
from cairn.engine.vaults.render import render_credential, render_vault
from cairn.engine.vaults.service import CREDENTIAL_KIND, VaultService, credential_scope

__all__ = [
    "CREDENTIAL_KIND",
    "SECRET_FIELDS",
    "CredentialAuth",
    "VaultService",
    "credential_scope",
    "render_credential",
    "render_vault",
    "rotated_auth",
    "split_auth",
]
