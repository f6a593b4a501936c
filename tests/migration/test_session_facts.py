"""Revision 0003 moves what `sessions.extra` held into its own columns and table, and back."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import sqlalchemy as sa

from cairn.states import EnvironmentStatus, SessionStatus
from cairn.store.db import Database
from cairn.store.migrate import downgrade, upgrade
from cairn.store.sessions import get_session

pytestmark = pytest.mark.anyio

_ACTION = {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}", "turn_id": "turn_w"}


def _session(session_id: str, status: str, environment_type: str, extra: dict[str, Any]) -> dict[str, Any]:
    now = time.time()
    return {
        "id": session_id, "tenant": "t1", "status": status, "agent": {"model": "scripted:x"},
        "environment": {"type": environment_type}, "environment_id": "env_1", "metadata": {}, "extra": extra,
        "outputs_manifest": {}, "created_at": now, "last_active_at": now,
    }


def _turn(turn_id: str, session_id: str, ordinal: int, status: str) -> dict[str, Any]:
    return {"id": turn_id, "session_id": session_id, "ordinal": ordinal, "status": status, "input": [],
            "created_at": time.time()}


async def _insert_at_0002(db: Database) -> None:
    meta = sa.MetaData()
    async with db.read() as conn:
        await conn.run_sync(lambda sync: meta.reflect(sync, only=["sessions", "turns"]))
    settings = {"prompt_cache_options": {"ttl": "30m"}, "review": "auto_review", "spend_control": {"limit": 5}}
    async with db.write() as conn:
        await conn.execute(sa.insert(meta.tables["sessions"]), [
            _session("sess_hosted", "idle", "openai_hosted",
                     {"env": {"TOKEN": "x"}, "environment_status": "suspended", **settings}),
            _session("sess_none", "idle", "none", {"env": {}, "required_actions": [{**_ACTION, "turn_id": "turn_old"}]}),
            _session("sess_waiting", "requires_action", "openai_hosted", {"env": {}, "required_actions": [_ACTION]}),
        ])
        await conn.execute(sa.insert(meta.tables["turns"]), [
            _turn("turn_old", "sess_none", 0, "cancelled"),
            _turn("turn_w", "sess_waiting", 0, "waiting"),
        ])


async def test_upgrade_moves_extra_into_columns_and_required_actions(db: Database) -> None:
    await downgrade(db, "0002")
    await _insert_at_0002(db)
    await upgrade(db)
    async with db.read() as conn:
        hosted = await get_session(conn, "sess_hosted")
        none = await get_session(conn, "sess_none")
        waiting = await get_session(conn, "sess_waiting")
    assert hosted is not None and none is not None and waiting is not None
    assert (hosted.env, hosted.environment_status) == ({"TOKEN": "x"}, EnvironmentStatus.SUSPENDED)
    assert (hosted.prompt_cache_options, hosted.review, hosted.spend_control) == ({"ttl": "30m"}, "auto_review", {"limit": 5})
    # A session without an environment has no environment status; stale actions are not kept.
    assert (none.environment_status, none.required_actions, none.prompt_cache_options) == (None, (), None)
    assert waiting.status == SessionStatus.REQUIRES_ACTION and waiting.environment_status == EnvironmentStatus.READY
    [action] = waiting.required_actions
    assert (action.turn_id, action.call_id, action.kind, action.payload) == (
        "turn_w", "call_1", "function_call", {"name": "lookup", "arguments": "{}"}
    )

    await downgrade(db, "0002")
    async with db.read() as conn:
        rows = dict((await conn.execute(sa.text("SELECT id, extra FROM sessions"))).all())
    extras = {k: json.loads(v) if isinstance(v, str) else v for k, v in rows.items()}
    assert extras["sess_hosted"] == {"env": {"TOKEN": "x"}, "environment_status": "suspended", "prompt_cache_options": {"ttl": "30m"},
                                     "review": "auto_review", "spend_control": {"limit": 5}}
    assert extras["sess_waiting"] == {"env": {}, "required_actions": [_ACTION]}
    assert extras["sess_none"] == {"env": {}}
