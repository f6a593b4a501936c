"""Identifiers: typed, prefixed, random; the prefix tells a reader what an id names."""

from __future__ import annotations

import secrets
from typing import NewType

__all__ = [
    "ApprovalId",
    "ArtifactId",
    "CredentialId",
    "EnvironmentId",
    "ItemId",
    "SessionId",
    "TurnId",
    "VaultId",
    "new_approval_id",
    "new_artifact_id",
    "new_call_id",
    "new_credential_id",
    "new_environment_id",
    "new_item_id",
    "new_session_id",
    "new_turn_id",
    "new_vault_id",
]

SessionId = NewType("SessionId", str)
TurnId = NewType("TurnId", str)
ItemId = NewType("ItemId", str)
ArtifactId = NewType("ArtifactId", str)
EnvironmentId = NewType("EnvironmentId", str)
ApprovalId = NewType("ApprovalId", str)
VaultId = NewType("VaultId", str)
CredentialId = NewType("CredentialId", str)


def _token() -> str:
    return secrets.token_hex(12)


def new_session_id() -> SessionId:
    return SessionId(f"sess_{_token()}")


def new_turn_id() -> TurnId:
    return TurnId(f"turn_{_token()}")


def new_item_id() -> ItemId:
    return ItemId(f"item_{_token()}")


def new_artifact_id() -> ArtifactId:
    return ArtifactId(f"art_{_token()}")


def new_environment_id() -> EnvironmentId:
    return EnvironmentId(f"env_{_token()}")


def new_approval_id() -> ApprovalId:
    return ApprovalId(f"apr_{_token()}")


def new_call_id() -> str:
    return f"call_{_token()}"


def new_vault_id() -> VaultId:
    return VaultId(f"vault_{_token()}")


def new_credential_id() -> CredentialId:
    return CredentialId(f"cred_{_token()}")
