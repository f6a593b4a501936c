"""The runtime: every long-lived collaborator of the engine, built once by the app factory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cairn.blobs import BlobStore
from cairn.config import Settings
from cairn.durable.sealing import Sealer
from cairn.engine.environment import Environments
from cairn.engine.journal import Journal
from cairn.engine.notifier import Notifier
from cairn.engine.tools.build import ToolPolicies
from cairn.models.base import Model
from cairn.operator import LoadedAgents
from cairn.redaction import SessionRedactors
from cairn.sandbox.base import SandboxBackend
from cairn.sandbox.egress import EgressProxy
from cairn.store.db import Database

__all__ = ["Runtime"]


@dataclass(frozen=True, slots=True)
class Runtime:
    settings: Settings
    db: Database
    notifier: Notifier
    journal: Journal
    sandbox: SandboxBackend
    blobs: BlobStore
    environments: Environments
    resolve_model: Callable[[str], Model]
    # Validates a model name without creating the model (session create and update).
    check_model: Callable[[str], None]
    # Seals and opens what is kept encrypted at rest (credential secrets, run state), with the
    # deployment's master keys.
    sealer: Sealer
    # What the tool pipeline's gate and reserve stages ask; by default every call runs.
    tool_policies: ToolPolicies = field(default_factory=ToolPolicies)
    # The operator's registered agents (`--agents MODULE:ATTR`); none by default.
    agents: LoadedAgents = field(default_factory=LoadedAgents)
    # The proxy sandboxes with network go through; its reports go to the sessions' logs.
    egress: EgressProxy | None = None

    @property
    def redactors(self) -> SessionRedactors:
        """The known secret values of the sessions whose turns run in this process (the journal
        redacts what it writes with them)."""
        return self.journal.redactors
