"""The two directions of a connection whose HTTP the proxy reads: requests with the
session's placeholders substituted, responses with its secrets redacted (an intercepted
HTTPS connection both ways; a plain-HTTP request's response).

Both sides speak HTTP/1.1 (the only protocol the proxy offers either side), so responses
arrive in the order of the requests. Whether a response has a body depends on its
request (none after `HEAD`), so the request relay tells the response relay each request's
method, in order, through the `Exchanges` they share, before the request goes out. A
response is then read by its own framing (`_http.py`): a 1xx other than 101 is a head
only and its request's final response follows; 101 (or a 2xx to `CONNECT`) switches the
connection to another protocol, relayed unframed (still substituted both ways) until it
ends; `HEAD`, 204 and 304 have no body; otherwise chunked, sized or, with neither, the
rest of the connection. A request asking to switch waits for its response before the
request relay reads on: only the response says whether what follows is HTTP.

The proxy asks for uncompressed responses (`Accept-Encoding: identity`; `TE` dropped), so
that their bytes are the text the secrets would appear in; a response encoded anyway is
still scanned as it is on the wire, and reported (`on_encoded`): its decoded content is not.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from cairn.sandbox.egress._http import (
    Flow,
    RequestHead,
    ResponseHead,
    body_framing,
    read_head,
    relay_chunked,
    relay_sized,
    relay_unframed,
)

__all__ = ["Exchanges", "relay_requests", "relay_responses", "unencoded"]

_NO_BODY = frozenset({204, 304})


@dataclass(slots=True)
class _Request:
    method: str
    switched: asyncio.Future[bool] | None  # set if the request asks to switch protocols


@dataclass(slots=True)
class Exchanges:
    """The requests of one connection still waiting for their final response, oldest first."""

    _waiting: deque[_Request] = field(default_factory=deque)

    def sent(self, head: RequestHead) -> asyncio.Future[bool] | None:
        """Note a request about to go out; for one that asks to switch protocols, the future
        that says whether its response did."""
        asks = head.method == "CONNECT" or head.get("upgrade") is not None
        request = _Request(head.method, asyncio.get_running_loop().create_future() if asks else None)
        self._waiting.append(request)
        return request.switched

    def answered(self, head: ResponseHead) -> tuple[str | None, bool]:
        """Pair a final response with the oldest waiting request: that request's method
        (None for a response nobody asked for) and whether the connection switches now."""
        request = self._waiting.popleft() if self._waiting else None
        method = request.method if request is not None else None
        switches = head.status == 101 or (method == "CONNECT" and 200 <= head.status < 300)
        if request is not None and request.switched is not None:
            request.switched.set_result(switches)
        return method, switches


def unencoded(head: RequestHead) -> RequestHead:
    """`head` asking for a response whose bytes are its content (identity), so that the
    secrets in it can be found: no compression, no transfer coding but chunked."""
    return replace(head, headers=head.edited(drop=("accept-encoding", "te"), add=(("Accept-Encoding", "identity"),)))


async def relay_requests(flow: Flow, exchanges: Exchanges) -> None:
    """Relay the client's requests, placeholders substituted, until its stream ends."""
    while (raw := await read_head(flow)) is not None:
        head = unencoded(RequestHead.parse(flow.substituter.replace_all(raw)))
        framing = body_framing(flow, head)
        switched = exchanges.sent(head)
        if framing == "chunked":
            await flow.send(head.render())
            await relay_chunked(flow)
        elif framing:
            # A client that waits for `100 Continue` sends its body only once the head went
            # out: its body streams (chunked) like a large one instead of being held.
            waits = (head.get("expect") or "").lower() == "100-continue"
            await relay_sized(flow, head, framing, hold=not waits)
        else:
            await flow.send(head.render())
        if switched is not None and await switched:
            await relay_unframed(flow)
            return


async def relay_responses(flow: Flow, exchanges: Exchanges, on_encoded: Callable[[str], None]) -> None:
    """Relay the upstream's responses, secrets redacted, until its stream ends (or a
    response delimited by it, or a protocol switch, ends the connection's HTTP)."""
    while (raw := await read_head(flow)) is not None:
        head = ResponseHead.parse(flow.substituter.replace_all(raw))
        if 100 <= head.status < 200 and head.status != 101:
            await flow.send(head.render())  # an interim response: its request's final one follows
            continue
        method, switches = exchanges.answered(head)
        if switches:
            await flow.send(head.render())
            await relay_unframed(flow)
            return
        if method == "HEAD" or head.status in _NO_BODY:
            await flow.send(head.render())
            continue
        coding = (head.get("content-encoding") or "identity").strip().lower()
        if coding != "identity":
            on_encoded(coding)
        framing = body_framing(flow, head)
        if framing == "chunked":
            await flow.send(head.render())
            await relay_chunked(flow)
        elif framing is not None:
            await relay_sized(flow, head, framing, hold=True)
        else:
            await flow.send(head.render())
            await relay_unframed(flow)
            return
