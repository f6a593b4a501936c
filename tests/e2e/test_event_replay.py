"""Event streams that never lose an event (issue 5), through `cairn.Client` against real servers.

Each test runs a long turn (the `long_turn` script: about 2,000 command-output chunks and
5,000 text deltas), cuts the client's connection at random points, restarts or splits the
server, and checks that what the client reassembled is the stored log exactly: every
event once, in order. The stored log is read straight from the database.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from cairn import Client
from cairn.client import Backoff
from cairn.testing.server import CairnServer
from tests.e2e.conftest import database_url_for, make_server, remove_server
from tests.e2e.streams import TERMINAL, read_turn

LONG = "scripted:long_turn"
HOSTED = {"type": "openai_hosted"}
# Quick to retry, patient enough to outlast a server restart.
BACKOFF = Backoff(initial_s=0.02, max_s=0.5, max_attempts=60)


class CuttingProxy:
    """A loopback TCP proxy that cuts each connection after a random number of bytes from the server.

    Cuts land anywhere, mid-event included; half are a FIN, half a reset. Most connections
    carry up to 60 kB; one in five carries up to 600 kB, so that the largest events (a
    command's whole output in its `item.done`, about 190 kB) get through eventually.
    """

    def __init__(self, upstream_port: int, rng: random.Random) -> None:
        self.upstream_port = upstream_port
        self.rng = rng
        self.cuts = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = False
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _accept(self) -> None:
        while not self._closed:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                large = self.rng.random() < 0.2
                budget = self.rng.randint(200_000, 600_000) if large else self.rng.randint(1_000, 60_000)
                reset = self.rng.random() < 0.5
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                downstream.close()
                continue
            threading.Thread(target=self._pump, args=(downstream, upstream, None, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, downstream, budget, reset), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, budget: int | None, reset: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if budget is not None and len(data) >= budget:
                    sink.sendall(data[:budget])
                    with self._lock:
                        self.cuts += 1
                    if reset:
                        sink.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    break
                if budget is not None:
                    budget -= len(data)
                sink.sendall(data)
        except OSError:
            pass  # the other direction closed the pair
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already shut
                s.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()


def stored_log(database_url: str, session_id: str) -> list[str]:
    """The session's events as stored, read from the database itself."""
    engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT seq, data FROM events WHERE session_id = :s ORDER BY seq"), {"s": session_id}
            ).all()
    finally:
        engine.dispose()
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1)), "the stored log has a gap"
    return [str(r[1]) for r in rows]


def sqlite_url(server: CairnServer) -> str:
    return f"sqlite:///{server.data_dir / 'cairn.db'}"


def assert_same_log(received: list[str], stored: list[str]) -> None:
    assert len(received) == len(stored), (len(received), len(stored))
    assert received == stored
    assert len({json.loads(r)["event_id"] for r in received}) == len(received)


def counts(raws: list[str]) -> dict[str, int]:
    types = [json.loads(r)["type"] for r in raws]
    return {t: types.count(t) for t in set(types)}


@pytest.fixture
def rng() -> random.Random:
    seed = int(os.environ.get("CAIRN_TEST_SEED") or secrets.randbits(32))
    print(f"CAIRN_TEST_SEED={seed}")
    return random.Random(seed)


@pytest.fixture
def proxy(server: CairnServer, rng: random.Random) -> Iterator[CuttingProxy]:
    instance = CuttingProxy(server.port, rng)
    yield instance
    instance.close()


def test_stream_cut_at_random_points_reassembles_to_the_stored_log(server: CairnServer, proxy: CuttingProxy) -> None:
    with Client(server.base_url, server.admin_key) as direct, Client(proxy.base_url, server.admin_key, backoff=BACKOFF) as cut:
        session = direct.sessions.create(agent={"model": LONG}, environment=HOSTED, input="go")
        with cut.events.stream(session.id, starting_after=0) as stream:
            received = [event.raw for event in read_turn(stream)]
            reconnects = stream.reconnects
    stored = stored_log(sqlite_url(server), session.id)
    assert_same_log(received, stored)
    seen = counts(received)
    assert seen["agent.output.command_execution_output.delta"] >= 1000
    assert seen["agent.session.turn.output_text.delta"] >= 5000
    assert seen["agent.session.turn.completed"] == 1
    assert reconnects >= 10 and proxy.cuts >= reconnects, (reconnects, proxy.cuts)


def test_live_stream_and_replay_after_the_fact_agree(server: CairnServer, proxy: CuttingProxy) -> None:
    """A live-only subscription (no `starting_after`) resumes from the header's position."""
    with Client(server.base_url, server.admin_key) as direct, Client(proxy.base_url, server.admin_key, backoff=BACKOFF) as cut:
        session = direct.sessions.create(agent={"model": LONG}, environment=HOSTED)
        with cut.events.stream(session.id) as stream:
            start = stream.connect()
            assert start is not None and start > 0
            direct.beta.agents.sessions.events.create(
                session.id, events=[{"type": "agent.session.input.message", "input": [{"role": "user", "content": [{"type": "input_text", "text": "go"}]}]}],
            )
            received = [event.raw for event in read_turn(stream)]
    assert_same_log(received, stored_log(sqlite_url(server), session.id)[start:])


def test_run_follows_one_turn_to_completion_across_cuts(server: CairnServer, proxy: CuttingProxy, scripts_dir: Path) -> None:
    final_text = json.loads((scripts_dir / "long_turn.json").read_text())["turns"][0][1]["say"]
    with Client(server.base_url, server.admin_key) as direct, Client(proxy.base_url, server.admin_key, backoff=BACKOFF) as cut:
        session = direct.sessions.create(agent={"model": LONG}, environment=HOSTED)
        run = cut.sessions.run(session.id, input="go", keep_events=True)
        assert run.status == "completed" and run.turn.session_id == session.id
        assert run.output_text == final_text
        stored = stored_log(sqlite_url(server), session.id)
        assert [e.raw for e in run.events] == [
            raw for raw in stored[: run.sequence_number] if json.loads(raw).get("turn_id") == run.turn_id
        ]
        second = cut.sessions.run(session.id, input="again")
        assert (second.status, second.output_text) == ("completed", "A short second turn.")
    assert proxy.cuts >= 5


def test_a_stalled_subscriber_blocks_neither_the_turn_nor_others_and_gets_everything_later(server: CairnServer) -> None:
    with Client(server.base_url, server.admin_key) as client:
        session = client.sessions.create(agent={"model": LONG}, environment=HOSTED)
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", server.port))
        # HTTP/1.0: a close-delimited body, so the raw bytes are the SSE stream itself.
        stalled.sendall(
            f"GET /v1/agents/sessions/{session.id}/events?starting_after=0 HTTP/1.0\r\n"
            f"Authorization: Bearer {server.admin_key}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        try:
            run = client.sessions.run(session.id, input="go")  # while the stalled socket is never read
            assert run.status == "completed"
            stored = stored_log(sqlite_url(server), session.id)
            stalled.settimeout(30)
            buffer = b""
            last = f'"sequence_number":{len(stored)},'.encode()
            # Read until the last stored event has arrived whole (its frame's blank line too).
            while last not in buffer or b"\n\n" not in buffer[buffer.index(last) :]:
                chunk = stalled.recv(1 << 20)
                assert chunk, "the stalled stream was closed"
                buffer += chunk
        finally:
            stalled.close()
    body = buffer.split(b"\r\n\r\n", 1)[1]
    frames = [f[6:].decode() for f in body.split(b"\n\n") if f.startswith(b"data: ")]
    assert frames[: len(stored)] == stored


def _crash_and_restart(instance: CairnServer) -> None:
    instance.kill()
    instance.start()


def test_stream_survives_a_server_crash_and_restart(scripts_dir: Path) -> None:
    instance = make_server(scripts_dir, env={"CAIRN_LEASE_S": "2"}).start()
    try:
        with Client(instance.base_url, instance.admin_key, backoff=BACKOFF) as client:
            session = client.sessions.create(agent={"model": LONG}, environment=HOSTED, input="go")
            received: list[str] = []
            restarter: threading.Thread | None = None
            ended = False
            with client.events.stream(session.id, starting_after=0) as stream:
                for event in stream:
                    received.append(event.raw)
                    if restarter is None and event.type == "agent.output.command_execution_output.delta" and len(received) > 300:
                        # SIGKILL mid-command, then start again on the same port and data.
                        restarter = threading.Thread(target=_crash_and_restart, args=(instance,))
                        restarter.start()
                    ended = ended or event.type in TERMINAL
                    if ended and event.type == "agent.session.idle":
                        break
                else:
                    raise AssertionError(f"the stream ended before the turn's idle, after {len(received)} events")
                reconnects = stream.reconnects
            assert restarter is not None
            restarter.join()
        stored = stored_log(sqlite_url(instance), session.id)
        assert_same_log(received, stored)
        assert reconnects >= 1
        assert counts(received)["agent.session.turn.completed"] == 1
        # The crash hit the running command: recovery closed it and the turn went on.
        assert any("interrupted: Cairn stopped while this call ran" in r for r in received)
    finally:
        remove_server(instance)


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_turn_running_on_another_process(
    database: str, scripts_dir: Path, rng: random.Random, request: pytest.FixtureRequest
) -> None:
    """Two `cairn serve` processes share one database: the client talks to one that runs no
    worker (CAIRN_WORKERS=0), the turn runs on the other, and events cross by the log."""
    url = database_url_for(request, database, "replay")
    api = make_server(scripts_dir, database_url=url, env={"CAIRN_WORKERS": "0"}).start()
    worker = CairnServer(api.data_dir, scripts_dir=scripts_dir, database_url=url).start()
    proxy = CuttingProxy(api.port, rng)
    try:
        with Client(proxy.base_url, api.admin_key, backoff=BACKOFF) as client:
            session = client.sessions.create(agent={"model": LONG}, environment=HOSTED, input="go")
            with client.events.stream(session.id, starting_after=0) as stream:
                received = [event.raw for event in read_turn(stream)]
        database_url = url or sqlite_url(api)
        assert_same_log(received, stored_log(database_url, session.id))
        assert counts(received)["agent.session.turn.completed"] == 1
        assert proxy.cuts >= 5
        assert worker.process is not None and api.process is not None
        engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
        try:
            with engine.connect() as conn:
                owners = conn.execute(sa.text("SELECT lease_owner FROM jobs WHERE session_id = :s"), {"s": session.id}).scalars().all()
        finally:
            engine.dispose()
        assert owners and all(f":{worker.process.pid}:" in str(o) for o in owners), owners
    finally:
        proxy.close()
        worker.stop()
        remove_server(api)
