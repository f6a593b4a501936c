"""Settings: read once (by the CLI or a test), frozen, and passed down explicitly."""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from cairn.errors import InvalidRequestError

__all__ = ["EgressSettings", "Settings", "check_seconds"]


def check_seconds(value: float, name: str) -> float:
    """A duration setting: finite and not negative, or a typed error naming the setting."""
    if not (math.isfinite(value) and value >= 0):
        raise InvalidRequestError(f"{name} must be a number of seconds, 0 or more (got {value})", param=name)
    return value


def _host_name(value: str) -> str:
    return value.strip().rstrip(".").lower()


_EGRESS_MAX_CONNECTIONS = 64
_EGRESS_INTERCEPT_PORTS = (443, 8443)


@dataclass(frozen=True, slots=True)
class EgressSettings:
    """The sandbox egress proxy's settings (docs/security.md, "Egress"); from CAIRN_EGRESS_*:

    - `CAIRN_EGRESS_ALLOW_PRIVATE`: comma-separated host names (or `*.suffix` patterns) the
      proxy may connect to even though they resolve to private, loopback or host addresses (a
      company registry, a test server); the session's policy still applies to them.
    - `CAIRN_EGRESS_MAX_CONNECTIONS`: open connections per session (default 64); one more is
      refused with 429.
    - `CAIRN_EGRESS_BANDWIDTH_BYTES_S`: bytes per second per session, both directions
      together (default: unlimited).
    - `CAIRN_EGRESS_INTERCEPT_PORTS`: the ports on which HTTPS to a host with credentials is
      intercepted to substitute them (default `443,8443`).
    - `CAIRN_EGRESS_HOSTS` (tests): `name=address,...`, answers the proxy's name resolution
      with these addresses instead of DNS for the names given.
    - `CAIRN_EGRESS_UPSTREAM_CA` (tests): a PEM file of extra CAs the proxy trusts when it
      re-encrypts an intercepted connection to the real host.
    """

    allow_private: frozenset[str] = frozenset()
    max_connections: int = _EGRESS_MAX_CONNECTIONS
    bandwidth_bytes_s: int | None = None
    intercept_ports: tuple[int, ...] = _EGRESS_INTERCEPT_PORTS
    hosts: Mapping[str, str] = field(default_factory=dict)
    upstream_ca: Path | None = None

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise InvalidRequestError("CAIRN_EGRESS_MAX_CONNECTIONS must be 1 or more", param="CAIRN_EGRESS_MAX_CONNECTIONS")
        if self.bandwidth_bytes_s is not None and self.bandwidth_bytes_s < 1024:
            raise InvalidRequestError(
                "CAIRN_EGRESS_BANDWIDTH_BYTES_S must be 1024 or more", param="CAIRN_EGRESS_BANDWIDTH_BYTES_S"
            )
        for name, address in self.hosts.items():
            try:
                ipaddress.ip_address(address)
            except ValueError as exc:
                raise InvalidRequestError(
                    f"CAIRN_EGRESS_HOSTS: {name}={address} is not an IP address", param="CAIRN_EGRESS_HOSTS"
                ) from exc

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> EgressSettings:
        def names(value: str) -> list[str]:
            return [_host_name(part) for part in value.split(",") if part.strip()]

        hosts: dict[str, str] = {}
        for entry in environ.get("CAIRN_EGRESS_HOSTS", "").split(","):
            if not entry.strip():
                continue
            name, sep, address = entry.partition("=")
            if not sep:
                raise InvalidRequestError(f"CAIRN_EGRESS_HOSTS: {entry!r} is not name=address", param="CAIRN_EGRESS_HOSTS")
            hosts[_host_name(name)] = address.strip()
        ports = environ.get("CAIRN_EGRESS_INTERCEPT_PORTS")
        try:
            bandwidth = environ.get("CAIRN_EGRESS_BANDWIDTH_BYTES_S")
            return cls(
                allow_private=frozenset(names(environ.get("CAIRN_EGRESS_ALLOW_PRIVATE", ""))),
                max_connections=int(environ.get("CAIRN_EGRESS_MAX_CONNECTIONS", _EGRESS_MAX_CONNECTIONS)),
                bandwidth_bytes_s=int(bandwidth) if bandwidth else None,
                intercept_ports=tuple(int(port) for port in ports.split(",")) if ports else _EGRESS_INTERCEPT_PORTS,
                hosts=hosts,
                upstream_ca=Path(environ["CAIRN_EGRESS_UPSTREAM_CA"]) if environ.get("CAIRN_EGRESS_UPSTREAM_CA") else None,
            )
        except ValueError as exc:
            raise InvalidRequestError(f"an egress setting is not a number: {exc}", param="CAIRN_EGRESS") from exc


@dataclass(frozen=True, slots=True)
class Settings:
    data_dir: Path = Path(".cairn")
    database_url: str | None = None
    scripts_dir: Path | None = None
    host: str = "127.0.0.1"
    port: int = 8321
    # Sandbox backend name for `cairn.sandbox.select_backend`; None picks the best isolating one.
    sandbox: str | None = None
    workers: int = 4
    lease_s: float = 30.0
    # A job that fails is retried after job_retry_delay_s, doubling each time, and given up
    # on (parked, its turn failed) after job_max_attempts attempts.
    job_max_attempts: int = 5
    job_retry_delay_s: float = 1.0
    # On SIGTERM a worker claims nothing more and gives running turns this long to reach the
    # end of their step and hand their job back; then (or at a second SIGTERM) it stops.
    drain_grace_s: float = 30.0
    poll_interval_s: float = 0.25
    keepalive_s: float = 15.0
    max_body_bytes: int = 8 * 1024 * 1024
    command_timeout_s: float = 600.0
    # Idle sessions have their workspace persisted and released after this long.
    idle_stop_s: float = 600.0
    # Snapshot store: "local" (under the data dir), "s3" (CAIRN_S3_BUCKET, …) or "none".
    snapshot_store: str = "local"
    s3_bucket: str | None = None
    s3_prefix: str = ""
    s3_endpoint_url: str | None = None
    # Retention: snapshots kept per session, and how often garbage is collected.
    snapshot_keep_last: int = 10
    snapshot_gc_interval_s: float = 3600.0
    # Artifact blobs no artifact references: how often the server sweeps them (0 = never; run
    # `cairn blobs gc` instead) and how long since it was last stored a blob is always kept.
    blob_gc_interval_s: float = 3600.0
    blob_gc_grace_s: float = 3600.0
    # How long a held call waits for a decision unless its tool says otherwise, and how often
    # workers expire the approvals whose time ran out.
    approval_ttl_s: float = 86400.0
    approval_expiry_check_s: float = 5.0
    # The secret that keys approval digests (hex); default: `approval.key` in the data dir,
    # made on first use. Every worker of one database must have the same (docs/approvals.md).
    approval_key: str | None = None
    # The idempotency ledger (docs/ledger.md): executions of one side-effecting call at most
    # (a tool's `max_attempts` overrides it), the first retry's delay (doubling each time), the
    # largest result kept in the entry itself (a larger one goes to the blob store), how long
    # a settled entry is kept once its turn is over, and how often workers sweep older ones.
    ledger_max_attempts: int = 3
    ledger_retry_delay_s: float = 1.0
    ledger_result_inline_bytes: int = 64 * 1024
    ledger_retention_s: float = 7 * 86400.0
    ledger_sweep_interval_s: float = 3600.0
    # The master keys of envelope encryption (`cairn.durable.keyring`): `VERSION:HEX[,…]` or one
    # key in hex; default: `master.key` in the data dir, made on first start. Every process of
    # one database must have the same (docs/security.md).
    master_key: str | None = None
    # How long an approval's sealed run state is kept (docs/security.md, "Lifetimes"): a
    # pending approval at most this long (its expiry is capped to it), then by the status it
    # ended in, counted from when it got there: rejected (also revoked or invalidated),
    # completed (approved and started), expired. Workers sweep every interval.
    run_state_ttl_pending_s: float = 30 * 86400.0
    run_state_ttl_rejected_s: float = 7 * 86400.0
    run_state_ttl_completed_s: float = 7 * 86400.0
    run_state_ttl_expired_s: float = 86400.0
    sealed_sweep_interval_s: float = 600.0
    # OpenAI-compatible endpoint for `openai:` and plain model names.
    openai_base_url: str | None = None
    openai_api_key: str | None = None
    openai_api: str = "responses"
    # The operator's agents: MODULE:ATTR of a `cairn.AgentRegistry` (`--agents`), or None.
    agents: str | None = None
    # The sandbox egress proxy (CAIRN_EGRESS_*; docs/security.md, "Egress").
    egress: EgressSettings = field(default_factory=EgressSettings)
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_seconds(self.blob_gc_interval_s, "CAIRN_BLOB_GC_INTERVAL_S")
        check_seconds(self.blob_gc_grace_s, "CAIRN_BLOB_GC_GRACE_S")
        check_seconds(self.job_retry_delay_s, "CAIRN_JOB_RETRY_DELAY_S")
        check_seconds(self.drain_grace_s, "CAIRN_DRAIN_GRACE_S")
        check_seconds(self.approval_ttl_s, "CAIRN_APPROVAL_TTL_S")
        check_seconds(self.approval_expiry_check_s, "CAIRN_APPROVAL_EXPIRY_CHECK_S")
        check_seconds(self.ledger_retry_delay_s, "CAIRN_LEDGER_RETRY_DELAY_S")
        check_seconds(self.ledger_retention_s, "CAIRN_LEDGER_RETENTION_S")
        check_seconds(self.ledger_sweep_interval_s, "CAIRN_LEDGER_SWEEP_INTERVAL_S")
        for name, ttl_s in self.run_state_ttls().items():
            check_seconds(ttl_s, f"CAIRN_RUN_STATE_TTL_{name.upper()}_S")
        check_seconds(self.sealed_sweep_interval_s, "CAIRN_SEALED_SWEEP_INTERVAL_S")
        if self.ledger_max_attempts < 1:
            raise InvalidRequestError("CAIRN_LEDGER_MAX_ATTEMPTS must be 1 or more", param="CAIRN_LEDGER_MAX_ATTEMPTS")
        if self.ledger_result_inline_bytes < 0:
            raise InvalidRequestError("CAIRN_LEDGER_RESULT_INLINE_BYTES must be 0 or more", param="CAIRN_LEDGER_RESULT_INLINE_BYTES")
        if self.job_max_attempts < 1:
            raise InvalidRequestError("CAIRN_JOB_MAX_ATTEMPTS must be 1 or more", param="CAIRN_JOB_MAX_ATTEMPTS")

    def run_state_ttls(self) -> dict[str, float]:
        """The run state's time to live by the approval status it is counted from."""
        return {
            "pending": self.run_state_ttl_pending_s,
            "rejected": self.run_state_ttl_rejected_s,
            "completed": self.run_state_ttl_completed_s,
            "expired": self.run_state_ttl_expired_s,
        }

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'cairn.db').resolve()}"

    @property
    def workspaces_dir(self) -> Path:
        return self.data_dir / "workspaces"

    @property
    def blobs_dir(self) -> Path:
        return self.data_dir / "blobs"

    @property
    def snapshots_dir(self) -> Path:
        return self.data_dir / "snapshots"

    @property
    def admin_key_path(self) -> Path:
        return self.data_dir / "admin.key"

    @property
    def approval_key_path(self) -> Path:
        return self.data_dir / "approval.key"

    @property
    def master_key_path(self) -> Path:
        return self.data_dir / "master.key"

    def with_env(self, environ: Mapping[str, str] = os.environ) -> Settings:
        """Fill what the command line left unset from CAIRN_* and OPENAI_* variables."""
        try:
            return replace(
                self,
                database_url=self.database_url or environ.get("CAIRN_DATABASE_URL"),
                sandbox=self.sandbox or environ.get("CAIRN_SANDBOX"),
                lease_s=float(environ.get("CAIRN_LEASE_S", self.lease_s)),
                job_max_attempts=int(environ.get("CAIRN_JOB_MAX_ATTEMPTS", self.job_max_attempts)),
                job_retry_delay_s=float(environ.get("CAIRN_JOB_RETRY_DELAY_S", self.job_retry_delay_s)),
                drain_grace_s=float(environ.get("CAIRN_DRAIN_GRACE_S", self.drain_grace_s)),
                workers=int(environ.get("CAIRN_WORKERS", self.workers)),
                openai_base_url=self.openai_base_url or environ.get("OPENAI_BASE_URL"),
                openai_api_key=self.openai_api_key or environ.get("OPENAI_API_KEY"),
                openai_api=environ.get("CAIRN_OPENAI_API", self.openai_api),
                agents=self.agents or environ.get("CAIRN_AGENTS"),
                idle_stop_s=float(environ.get("CAIRN_IDLE_STOP_S", self.idle_stop_s)),
                snapshot_store=environ.get("CAIRN_SNAPSHOT_STORE", self.snapshot_store),
                s3_bucket=self.s3_bucket or environ.get("CAIRN_S3_BUCKET"),
                s3_prefix=environ.get("CAIRN_S3_PREFIX", self.s3_prefix),
                s3_endpoint_url=self.s3_endpoint_url or environ.get("CAIRN_S3_ENDPOINT_URL"),
                snapshot_keep_last=int(environ.get("CAIRN_SNAPSHOT_KEEP_LAST", self.snapshot_keep_last)),
                snapshot_gc_interval_s=float(environ.get("CAIRN_SNAPSHOT_GC_INTERVAL_S", self.snapshot_gc_interval_s)),
                blob_gc_interval_s=float(environ.get("CAIRN_BLOB_GC_INTERVAL_S", self.blob_gc_interval_s)),
                blob_gc_grace_s=float(environ.get("CAIRN_BLOB_GC_GRACE_S", self.blob_gc_grace_s)),
                approval_ttl_s=float(environ.get("CAIRN_APPROVAL_TTL_S", self.approval_ttl_s)),
                approval_expiry_check_s=float(environ.get("CAIRN_APPROVAL_EXPIRY_CHECK_S", self.approval_expiry_check_s)),
                approval_key=self.approval_key or environ.get("CAIRN_APPROVAL_KEY"),
                ledger_max_attempts=int(environ.get("CAIRN_LEDGER_MAX_ATTEMPTS", self.ledger_max_attempts)),
                ledger_retry_delay_s=float(environ.get("CAIRN_LEDGER_RETRY_DELAY_S", self.ledger_retry_delay_s)),
                ledger_result_inline_bytes=int(environ.get("CAIRN_LEDGER_RESULT_INLINE_BYTES", self.ledger_result_inline_bytes)),
                ledger_retention_s=float(environ.get("CAIRN_LEDGER_RETENTION_S", self.ledger_retention_s)),
                ledger_sweep_interval_s=float(environ.get("CAIRN_LEDGER_SWEEP_INTERVAL_S", self.ledger_sweep_interval_s)),
                master_key=self.master_key or environ.get("CAIRN_MASTER_KEY"),
                run_state_ttl_pending_s=float(environ.get("CAIRN_RUN_STATE_TTL_PENDING_S", self.run_state_ttl_pending_s)),
                run_state_ttl_rejected_s=float(environ.get("CAIRN_RUN_STATE_TTL_REJECTED_S", self.run_state_ttl_rejected_s)),
                run_state_ttl_completed_s=float(environ.get("CAIRN_RUN_STATE_TTL_COMPLETED_S", self.run_state_ttl_completed_s)),
                run_state_ttl_expired_s=float(environ.get("CAIRN_RUN_STATE_TTL_EXPIRED_S", self.run_state_ttl_expired_s)),
                sealed_sweep_interval_s=float(environ.get("CAIRN_SEALED_SWEEP_INTERVAL_S", self.sealed_sweep_interval_s)),
                egress=EgressSettings.from_env(environ) if any(k.startswith("CAIRN_EGRESS_") for k in environ) else self.egress,
            )
        except ValueError as exc:
            raise InvalidRequestError(f"bad CAIRN_* setting: {exc}") from exc
