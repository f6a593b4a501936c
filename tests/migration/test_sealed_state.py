"""Revision 0010: an approval stored before sealing keeps its clear state, is shown as `clear`,
and is never continued (run state version 1); a downgrade gives sealed rows an empty clear
state the older Cairn shows and never continues."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cairn.config import Settings
from cairn.durable.keyring import LocalKeyring
from cairn.durable.sealing import Sealer
from cairn.engine.approvals.gate import RUN_STATE_VERSION
from cairn.engine.approvals.sealed import open_state, seal_state, state_view
from cairn.states import ApprovalStatus
from cairn.store.approvals import ApprovalRecord, get_approval, insert_approval
from cairn.store.db import Database
from cairn.store.migrate import downgrade, upgrade

pytestmark = pytest.mark.anyio


def _legacy_row(approval_id: str) -> dict[str, Any]:
    now = time.time()
    return {
        "id": approval_id, "tenant": "t1", "session_id": "sess_1", "turn_id": "turn_1", "call_id": f"call_{approval_id}",
        "tool_name": "deploy", "review": {"release": "r-1"}, "summary": "deploy(release='r-1')", "arguments_digest": "a" * 64,
        "agent_version": "agent/v1", "agent_revision": "rev", "approvers": ["approver"],
        "run_state": {"call_id": f"call_{approval_id}"}, "run_state_version": 1, "status": "pending", "reason": None,
        "message": None, "created_at": now, "expires_at": now + 3600,
    }


async def test_a_row_from_before_sealing_is_shown_in_clear_and_never_continued(db: Database, tmp_path: Path) -> None:
    await downgrade(db, "0009")
    meta = sa.MetaData()
    async with db.read() as conn:
        await conn.run_sync(lambda sync: meta.reflect(sync, only=["approvals"]))
    async with db.write() as conn:
        await conn.execute(sa.insert(meta.tables["approvals"]), [_legacy_row("apr_old")])
    await upgrade(db)
    sealer = Sealer(LocalKeyring.from_settings(Settings(data_dir=tmp_path)))
    async with db.read() as conn:
        legacy = await get_approval(conn, "apr_old")
        assert legacy is not None and legacy.sealed_state is None and legacy.run_state_version != RUN_STATE_VERSION
        opened, state = await state_view(sealer, conn, legacy)
    assert state == "clear" and opened.review == {"release": "r-1"} and opened.run_state == {"call_id": "call_apr_old"}


async def test_a_downgrade_leaves_sealed_rows_an_empty_state_the_older_cairn_never_continues(db: Database, tmp_path: Path) -> None:
    sealer = Sealer(LocalKeyring.from_settings(Settings(data_dir=tmp_path)))
    record = ApprovalRecord(**{**_legacy_row("apr_new"), "status": ApprovalStatus.PENDING, "run_state_version": RUN_STATE_VERSION})
    async with db.write() as conn:
        stored = await insert_approval(conn, await seal_state(sealer, conn, record), ttl_s=60)
        assert (await open_state(sealer, conn, stored)).review == {"release": "r-1"}
    await downgrade(db, "0009")
    async with db.read() as conn:
        row = (await conn.execute(sa.text("SELECT review, summary, run_state, run_state_version FROM approvals"))).one()
    assert (row.summary, row.run_state_version) == ("", RUN_STATE_VERSION)
    await upgrade(db)
