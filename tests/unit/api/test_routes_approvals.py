"""`/v1/approvals` and the approval input event over HTTP, in-process: the shapes, the roles,
the error envelope, and that a refused request changes nothing stored."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.api.in_process import Api
from tests.unit.engine.approvals.approval_harness import approval_of, approvals, pinned_session, release_agents, write
from tests.unit.engine.harness import EngineHarness

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api(engine: EngineHarness) -> Api:
    engine.gated = True
    await engine.restart(agents=release_agents())
    return Api(engine)


async def _held(api: Api, *paths: str) -> tuple[str, list[Any]]:
    engine = api.engine
    engine.script([{"calls": [write(p) for p in paths]}, {"say": "done"}])
    session_id = await pinned_session(engine)
    await engine.run_job()
    return session_id, await approvals(engine, session_id)


async def test_list_and_retrieve_show_what_was_asked_and_never_the_run_state(api: Api) -> None:
    session_id, held = await _held(api, "a.txt", "b.txt")
    listed = (await api.call("GET", "/approvals", params={"status": "pending", "session_id": session_id, "limit": "1"})).json()
    assert listed["object"] == "list" and listed["has_more"] is True and len(listed["data"]) == 1
    rest = (await api.call("GET", "/approvals", params={"session_id": session_id, "after": listed["last_id"]}, role="reader")).json()
    assert {a["id"] for a in listed["data"] + rest["data"]} == {a.id for a in held} and rest["has_more"] is False
    assert (await api.call("GET", "/approvals", params={"tool_name": "shell"})).json()["data"] == []
    shown = (await api.call("GET", f"/approvals/{held[0].id}")).json()
    assert shown["object"] == "approval" and shown["status"] == "pending" and shown["review"] == {"path": held[0].review["path"]}
    assert shown["arguments_digest"] == held[0].arguments_digest and shown["agent_version"] == "release-agent/v1"
    assert "run_state" not in shown and shown["decided_by"] is None and shown["expires_at"] > shown["created_at"] - 1
    # Stored sealed, opened for showing (docs/security.md).
    assert shown["state"] == "sealed" and shown["summary"] == "write_file(path='a.txt')"
    assert all(a["state"] == "sealed" and a["review"] is not None for a in listed["data"] + rest["data"])
    for bad in ({"status": "maybe"}, {"colour": "red"}, {"limit": "0"}):
        response = await api.call("GET", "/approvals", params=bad)
        assert response.status_code == 400 and response.json()["error"]["param"]


async def test_unknown_and_foreign_ids_are_404(api: Api) -> None:
    _, [approval] = await _held(api, "a.txt")
    for path in ("/approvals/apr_nope", f"/approvals/{approval.id}"):
        tenant = "t2" if path.endswith(approval.id) else "t1"
        assert (await api.call("GET", path, tenant=tenant)).status_code == 404
        response = await api.call("POST", f"{path}/approve", tenant=tenant, json={"arguments_digest": approval.arguments_digest})
        assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
    assert await approval_of(api.engine, approval.turn_id, approval.call_id) == approval


async def test_a_decision_over_rest_follows_the_rules_and_a_refused_one_stores_nothing(api: Api) -> None:
    _, [approval] = await _held(api, "a.txt")
    path = f"/approvals/{approval.id}"
    refused = [
        ("POST", f"{path}/approve", "approver", {"json": {}}, 400),
        ("POST", f"{path}/approve", "approver", {"json": {"arguments_digest": "xyz"}}, 400),
        ("POST", f"{path}/approve", "approver", {"json": {"arguments_digest": approval.arguments_digest, "extra": 1}}, 400),
        ("POST", f"{path}/approve", "approver", {"content": b"arguments_digest", "headers": {"content-type": "text/plain"}}, 415),
        ("POST", f"{path}/reject", "approver", {"json": {"message": 5}}, 400),
        ("POST", f"{path}/approve", "approver", {"json": {"arguments_digest": "0" * 64}}, 409),
        ("POST", f"{path}/approve", "member", {"json": {"arguments_digest": approval.arguments_digest}}, 403),
        ("POST", f"{path}/reject", "reader", {"json": {"message": "no"}}, 403),
        ("POST", f"{path}/revoke", "reader", {"json": {}}, 403),
    ]
    for method, url, role, kwargs, status in refused:
        response = await api.call(method, url, role=role, **kwargs)
        assert response.status_code == status, (url, role, kwargs, response.text)
        assert set(response.json()["error"]) == {"message", "type", "code", "param"}
    assert await approval_of(api.engine, approval.turn_id, approval.call_id) == approval
    assert not await api.engine.has_job()

    approved = await api.call("POST", f"{path}/approve", json={"arguments_digest": approval.arguments_digest})
    assert approved.status_code == 200 and approved.json()["status"] == "approved"
    assert approved.json()["decided_by"] == {"key_id": api.key_ids["t1:approver"], "tenant": "t1", "role": "approver"}
    again = await api.call("POST", f"{path}/reject", json={"message": "too late"})
    assert again.status_code == 409 and again.json()["error"]["code"] == "approval_decided"
    revoked = await api.call("POST", f"{path}/revoke", role="admin", json={"reason": "change freeze"})
    assert revoked.status_code == 200 and (revoked.json()["status"], revoked.json()["message"]) == ("revoked", "change freeze")
    assert revoked.json()["decided_by"]["role"] == "approver"  # who approved stays on record


async def test_an_approver_key_decides_through_the_events_endpoint_but_sends_no_message(api: Api) -> None:
    session_id, [approval] = await _held(api, "a.txt")
    events = f"/agents/sessions/{session_id}/events"
    decision = {"type": "agent.session.input.mcp_approval_request_result", "request_id": approval.id,
                "response": {"type": "mcp_tool_call", "decision": "deny"}}
    message = {"type": "agent.session.input.message", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
    assert (await api.call("POST", events, json={"events": [message]})).status_code == 403
    malformed = {**decision, "response": {"type": "mcp_tool_call", "decision": "maybe"}}
    assert (await api.call("POST", events, json={"events": [malformed]})).status_code == 400
    unknown = {**decision, "request_id": "apr_nope"}
    assert (await api.call("POST", events, json={"events": [unknown]})).status_code == 404
    busy = await api.call("POST", events, role="member", json={"events": [message]})
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "awaiting_approval"
    assert await approval_of(api.engine, approval.turn_id, approval.call_id) == approval
    assert (await api.call("POST", events, json={"events": [decision]})).status_code == 202
    assert (await approval_of(api.engine, approval.turn_id, approval.call_id)).status == "rejected"
    assert (await api.call("POST", events, json={"events": [decision]})).status_code == 409
