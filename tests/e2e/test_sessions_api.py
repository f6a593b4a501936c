"""Session update, listing with filters and pagination, and artifact deletion through the client."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.streams import read_turn


def _session(client: openai.OpenAI, **kwargs: object) -> str:
    return client.beta.agents.sessions.create(
        agent={"model": "scripted:echo"}, environment={"type": "openai_hosted"}, **kwargs  # type: ignore[arg-type]
    ).id


def test_update_replaces_metadata_and_agent_settings(client: openai.OpenAI) -> None:
    sessions = client.beta.agents.sessions
    session_id = _session(client, metadata={"team": "a", "x": "1"})
    updated = sessions.update(session_id, metadata={"team": "b"}, agent={"model": "scripted:slow"})
    assert updated.metadata == {"team": "b"} and updated.agent.model == "scripted:slow"
    assert sessions.retrieve(session_id).agent.model == "scripted:slow"
    tool = {"type": "function", "name": "lookup", "description": "d", "parameters": {"type": "object", "properties": {}}}
    assert len(sessions.update(session_id, agent={"tools": [tool]}).agent.tools) == 1
    cleared = sessions.update(session_id, metadata=None, agent={"tools": None})
    assert cleared.metadata == {} and cleared.agent.tools == []
    untouched = sessions.update(session_id)
    assert untouched.agent.model == "scripted:slow"
    with pytest.raises(openai.BadRequestError):
        sessions.update(session_id, agent={"model": "scripted:no-such-script"})
    assert sessions.retrieve(session_id).agent.model == "scripted:slow"


def test_list_filters_by_metadata_and_paginates(client: openai.OpenAI) -> None:
    sessions = client.beta.agents.sessions
    tag = "page-test"
    created = [_session(client, metadata={"suite": tag, "n": str(i)}) for i in range(5)]
    first = sessions.list(limit=2, order="asc", extra_query={"metadata[suite]": tag})
    assert [s.id for s in first.data] == created[:2] and first.has_more
    everything = [s.id for s in sessions.list(limit=2, order="asc", extra_query={"metadata[suite]": tag})]
    assert everything == created
    newest_first = [s.id for s in sessions.list(order="desc", extra_query={"metadata[suite]": tag, "metadata[n]": "3"})]
    assert newest_first == [created[3]]


def test_list_filters_by_agent_before_it_paginates(client: openai.OpenAI) -> None:
    """Each session carries its own agent: the filter finds the newest of several on the first
    page of one, with nothing after it."""
    sessions = client.beta.agents.sessions
    tag = "agent-filter-test"
    created = [_session(client, metadata={"suite": tag}) for _ in range(3)]
    agent_id = sessions.retrieve(created[-1]).agent.id
    page = sessions.list(limit=1, order="asc", agent_id=agent_id, extra_query={"metadata[suite]": tag})
    assert ([s.id for s in page.data], page.has_more) == ([created[-1]], False)
    assert [s.id for s in sessions.list(limit=1, order="desc", agent_id="agent_unknown")] == []


def test_an_artifact_can_be_deleted_and_is_gone(client: openai.OpenAI) -> None:
    sessions = client.beta.agents.sessions
    with sessions.create(agent={"model": "scripted:tree"}, environment={"type": "openai_hosted"}, input="one", stream=True) as stream:
        session_id = read_turn(stream)[0].session.id
    with sessions.stream(session_id, input="two") as turn:
        turn.get_final_result()
    artifact = next(iter(sessions.artifacts.list(session_id)))
    assert sessions.artifacts.retrieve(artifact.id, session_id=session_id).path == "/workspace/outputs/tree.py"
    assert sessions.artifacts.delete(artifact.id, session_id=session_id).deleted
    assert list(sessions.artifacts.list(session_id)) == []
    with pytest.raises(openai.NotFoundError):
        sessions.artifacts.content(artifact.id, session_id=session_id)
