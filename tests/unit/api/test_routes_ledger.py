"""`/v1/ledger` over HTTP, in-process: entries listed and shown per tenant, resolving open to
`admin` and `approver` only, one outcome per body, a settled entry not resolved again, and a
resolution that continues the waiting turn."""

from __future__ import annotations

import pytest

from tests.unit.api.in_process import Api
from tests.unit.engine.harness import EngineHarness
from tests.unit.engine.ledger.ledger_harness import Deployer, crash_worker, entry, open_ledger, start_deploy

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api(engine: EngineHarness) -> Api:
    return Api(engine)


async def _uncertain(api: Api) -> tuple[str, str]:
    """A session whose turn waits for a person to resolve its deploy; its operation key."""
    engine = api.engine
    deployer = Deployer()
    await open_ledger(engine, deployer)
    session_id = await start_deploy(engine, "deploy_unprobed")
    await crash_worker(engine, deployer)
    await open_ledger(engine, deployer)
    await engine.run_job()
    return session_id, (await entry(engine)).operation_key


async def test_entries_are_listed_and_shown_to_their_tenant_only(api: Api) -> None:
    _, key = await _uncertain(api)
    listed = (await api.call("GET", "/ledger", role="reader", params={"status": "uncertain"})).json()
    assert listed["object"] == "list" and [e["operation_key"] for e in listed["data"]] == [key]
    shown = (await api.call("GET", f"/ledger/{key}", role="member")).json()
    assert shown["object"] == "ledger_entry" and shown["status"] == "uncertain" and shown["tool_name"] == "deploy_unprobed"
    assert shown["reason"] and shown["attempts"] == 1 and "holder_token" not in shown
    assert (await api.call("GET", "/ledger", params={"status": "maybe"})).status_code == 400
    assert (await api.call("GET", "/ledger", params={"tool": "x"})).status_code == 400
    assert (await api.call("GET", f"/ledger/{key}", tenant="t2")).status_code == 404
    assert (await api.call("GET", "/ledger", tenant="t2")).json()["data"] == []


async def test_resolving_needs_a_resolver_role_one_outcome_and_an_uncertain_entry(api: Api) -> None:
    session_id, key = await _uncertain(api)
    path = f"/ledger/{key}/resolve"
    assert (await api.call("POST", path, role="member", json={"succeeded": "ok"})).status_code == 403
    assert (await api.call("POST", path, role="reader", json={"failed": "no"})).status_code == 403
    assert (await api.call("POST", path, tenant="t2", json={"failed": "no"})).status_code == 404
    for body in ({}, {"succeeded": "a", "failed": "b"}, {"succeeded": 3}, {"outcome": "ok"}):
        assert (await api.call("POST", path, json=body)).status_code == 400, body
    assert (await entry(api.engine)).status == "uncertain"

    resolved = await api.call("POST", path, role="admin", json={"succeeded": "deployed by hand"})
    assert resolved.status_code == 200
    assert (resolved.json()["status"], resolved.json()["result"]) == ("succeeded", {"output": "deployed by hand"})
    again = await api.call("POST", path, json={"failed": "no"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "ledger_entry_not_uncertain"

    await api.engine.run_job()  # the resolution queued the turn: it finishes with that result
    output = next(i for i in await api.engine.items(session_id) if i.type == "function_call_output")
    assert output.data["output"] == "deployed by hand"
    assert (await api.engine.session(session_id)).status == "idle"
