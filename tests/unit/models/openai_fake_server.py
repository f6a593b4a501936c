"""A fake OpenAI-compatible endpoint: real HTTP on 127.0.0.1, scripted answers, genuine SSE.

Tests script replies per model name and the server pops one per request, so tests sharing a
server never see each other's replies. Each request's body and headers are recorded for the
test to inspect. The SSE framing is exactly what OpenAI sends: `event:` + `data:` lines for the
Responses API, bare `data:` lines ending with `data: [DONE]` for Chat Completions.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = ["FakeOpenAIServer", "RecordedRequest", "Reply", "chat_sse", "responses_sse", "serve_in_thread"]


@dataclass(frozen=True)
class Reply:
    """One scripted answer: an SSE body (status 200) or a JSON error body with `status`."""

    frames: Sequence[str] = ()
    status: int = 200
    error_body: Mapping[str, Any] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    # Keep the stream open after the frames until the client goes away (timeout tests).
    is_hanging: bool = False


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]


def responses_sse(*events: Mapping[str, Any]) -> tuple[str, ...]:
    """Frame Responses API events, numbering them as OpenAI does."""
    return tuple(
        f"event: {event['type']}\ndata: {json.dumps({**event, 'sequence_number': number})}\n\n"
        for number, event in enumerate(events)
    )


def chat_sse(*chunks: Mapping[str, Any]) -> tuple[str, ...]:
    """Frame Chat Completions chunks and the closing `[DONE]`."""
    return (*(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks), "data: [DONE]\n\n")


@dataclass
class FakeOpenAIServer:
    _replies: dict[str, deque[Reply]] = field(default_factory=dict)
    _requests: dict[str, list[RecordedRequest]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def script(self, model: str, *replies: Reply) -> None:
        with self._lock:
            self._replies.setdefault(model, deque()).extend(replies)

    def requests(self, model: str) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests.get(model, []))

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/responses", self._answer, methods=["POST"]),
                Route("/v1/chat/completions", self._answer, methods=["POST"]),
            ]
        )

    async def _answer(self, request: Request) -> Response:
        body = await request.json()
        model = str(body.get("model"))
        with self._lock:
            self._requests.setdefault(model, []).append(
                RecordedRequest(request.url.path, dict(request.headers), body)
            )
            replies = self._replies.get(model)
            reply = replies.popleft() if replies else None
        if reply is None:
            return JSONResponse({"error": {"message": f"nothing scripted for {model}"}}, status_code=418)
        if reply.error_body is not None:
            return JSONResponse(reply.error_body, status_code=reply.status, headers=dict(reply.headers))
        return StreamingResponse(_frames(reply), media_type="text/event-stream", headers=dict(reply.headers))


async def _frames(reply: Reply) -> AsyncIterator[str]:
    for frame in reply.frames:
        yield frame
    if reply.is_hanging:
        # Starlette cancels this generator when the client disconnects.
        await anyio.sleep_forever()


@contextmanager
def serve_in_thread(server: FakeOpenAIServer) -> Iterator[str]:
    """Serve `server` on an ephemeral port; yields the base URL (ending in /v1)."""
    # Binding and listening before uvicorn starts means clients can connect at once: the
    # kernel queues them until the server accepts, so nobody waits for a "started" flag.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        server.app(), lifespan="off", ws="none", http="h11", log_level="warning", timeout_graceful_shutdown=5
    )
    uvicorn_server = uvicorn.Server(config)
    thread = threading.Thread(target=uvicorn_server.run, kwargs={"sockets": [sock]}, name="fake-openai")
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        uvicorn_server.should_exit = True
        thread.join()
        sock.close()
