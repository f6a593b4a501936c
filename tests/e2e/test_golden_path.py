"""The spec §7 tutorial, unchanged but for `base_url`, against a real `cairn serve` on both
databases: turn 1 writes and runs tree.py, turn 2 adds --max-depth and publishes it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from cairn.testing.server import CairnServer
from tests.e2e.conftest import DATABASES, database_url_for, make_server, remove_server


@pytest.fixture(params=DATABASES, scope="module")
def golden_server(request: pytest.FixtureRequest, scripts_dir: Path) -> Iterator[CairnServer]:
    instance = make_server(scripts_dir, database_url=database_url_for(request, request.param, "golden")).start()
    yield instance
    remove_server(instance)


def _text(events: list[object], kind: str) -> list[object]:
    return [e for e in events if getattr(e, "type", None) == kind]


def test_tutorial_flow(golden_server: CairnServer, tmp_path: Path) -> None:
    with golden_server.client() as client:
        _tutorial_flow(client, tmp_path)


def _tutorial_flow(client: openai.OpenAI, tmp_path: Path) -> None:
    sessions = client.beta.agents.sessions

    # 1. streaming create: the stream ends by itself after the turn's terminal event and idle
    events = []
    with sessions.create(
        agent={"model": "scripted:tree", "instructions": "You write small Python tools."},
        environment={"type": "openai_hosted"},
        input="Write tree.py that prints a directory tree, then run it.",
        stream=True,
    ) as stream:
        for event in stream:
            events.append(event)
    types = [e.type for e in events]
    assert types[0] == "agent.session.created"
    assert types[-2:] == ["agent.session.turn.completed", "agent.session.idle"]
    session_id = events[0].session.id
    turn1 = next(e for e in events if e.type == "agent.session.turn.created")
    assert turn1.turn.subagent_id is None and turn1.turn_id == turn1.turn.id
    assert all(e.event_id for e in events) and len({e.event_id for e in events}) == len(events)
    output = "".join(e.delta for e in events if e.type == "agent.output.command_execution_output.delta")
    assert "├── docs" in output and "main.py" in output

    # 2. the session is idle once the create stream has ended
    retrieved = sessions.retrieve(session_id)
    assert retrieved.status == "idle"
    sandbox = retrieved.environment.to_dict()["sandbox"]
    assert sandbox["isolated"] is True and sandbox["backend"] == "bwrap", "the session says what isolates it"

    # 3. a live event stream, then a follow-up message in the same session
    seen = []
    with sessions.events.stream(session_id) as live:
        sessions.events.create(
            session_id,
            events=[{"type": "agent.session.input.message", "input": [{"role": "user", "content": [
                {"type": "input_text", "text": "Add --max-depth and copy it to /workspace/outputs/tree.py"}]}]}],
        )
        for event in live:
            seen.append(event)
            if event.type == "agent.session.idle":
                break
    live_types = [e.type for e in seen]
    assert live_types[-2:] == ["agent.session.turn.completed", "agent.session.idle"], live_types
    assert "agent.session.created" not in live_types
    turn2 = next(e for e in seen if e.type == "agent.session.turn.completed")
    assert turn2.turn.session_id == session_id and turn2.turn.status == "completed"

    # 4. items: messages and command executions with exit codes and real output
    items = list(sessions.items.list(session_id, order="asc", limit=100))
    kinds = [i.type for i in items]
    assert kinds.count("message") == 5  # two user messages, one commentary, two final answers
    commands = [i for i in items if i.type == "command_execution"]
    assert len(commands) == 3 and all(c.exit_code == 0 and c.status == "completed" for c in commands)
    assert "└── src" in commands[1].output and "main.py" not in commands[1].output
    assert commands[2].output.strip() == "copied"
    assert items[0].role == "user" and items[-1].role == "assistant"

    # 5. the artifact of turn 2 downloads and runs
    artifacts = list(sessions.artifacts.list(session_id))
    assert [(a.path, a.turn_id) for a in artifacts] == [("/workspace/outputs/tree.py", turn2.turn_id)]
    target = tmp_path / "tree.py"
    with sessions.artifacts.with_streaming_response.content(artifacts[0].id, session_id=session_id) as response:
        response.stream_to_file(target)
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "f.txt").write_text("x")
    run = subprocess.run([sys.executable, str(target), str(tmp_path / "d"), "--max-depth", "1"], capture_output=True, text=True)
    assert run.returncode == 0 and "sub" in run.stdout and "f.txt" not in run.stdout

    # turns list and per-turn items (ConversationCursorPage with last_id)
    turns = list(sessions.turns.list(session_id, order="asc"))
    assert [t.status for t in turns] == ["completed", "completed"]
    turn_items = list(sessions.turns.items.list(turn2.turn_id, session_id=session_id, order="asc", limit=2))
    assert len(turn_items) == len([i for i in items if i.turn_id == turn2.turn_id])

    # 6. cancel on an idle session is a no-op; 7. delete ends the session
    sessions.events.create(session_id, events=[{"type": "agent.session.input.cancel"}])
    assert sessions.retrieve(session_id).status == "idle"
    deleted = sessions.delete(session_id)
    assert deleted.deleted and deleted.id == session_id
    with pytest.raises(openai.NotFoundError):
        sessions.retrieve(session_id)
