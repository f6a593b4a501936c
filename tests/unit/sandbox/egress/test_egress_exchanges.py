"""Responses of an intercepted connection, framed and redacted, byte for byte: every secret
of the session becomes its placeholder in heads, bodies and trailers, whatever the framing,
and a response that does not parse ends the relay without passing anything of it on.

What the relay sends is read back with h11 (an HTTP/1.1 parser of its own), as the
sandbox's client would read it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cairn.sandbox.egress import WireSecret, _http
from cairn.sandbox.egress._exchanges import Exchanges, relay_requests, relay_responses
from cairn.sandbox.egress._http import HELD_PER_SESSION, Flow, HeldBytes, HttpError, RequestHead, ResponseHead
from cairn.sandbox.egress.substitution import Substituter
from tests.http_responses import read_responses

API = WireSecret("c1", "API_KEY", "cairn_ph_api_0123456789abcdef", "sk-the-real-api-secret-42", ("api.test",))
OTHER = WireSecret("c2", "OTHER", "cairn_ph_other_fedcba9876543210", "other-secret-value", ("other.test",))
SECRET, PLACEHOLDER = API.value.encode(), API.placeholder.encode()


@dataclass
class Relayed:
    sent: bytes
    redacted: int
    encodings: list[str]
    error: HttpError | None


def respond(pieces: list[bytes], methods: list[str], held: HeldBytes | None = None) -> Relayed:
    """Relay the upstream's bytes, arriving in `pieces`, as the responses to `methods`
    (holding bodies within `held`, the session's budget)."""

    async def go() -> Relayed:
        reader = asyncio.StreamReader(limit=1024 * 1024)
        sent: list[bytes] = []
        encodings: list[str] = []

        async def send(data: bytes) -> None:
            sent.append(data)

        async def arrive() -> None:
            for piece in pieces:
                reader.feed_data(piece)
                await asyncio.sleep(0)  # each piece is read on its own, as from a socket
            reader.feed_eof()

        exchanges = Exchanges()
        for method in methods:
            exchanges.sent(RequestHead(method, "/", "HTTP/1.1", []))
        redactor = Substituter.for_responses([API, OTHER])
        feeding = asyncio.create_task(arrive())
        error = None
        try:
            flow = Flow(reader, send, redactor, "response", 502, held or HeldBytes(HELD_PER_SESSION))
            await relay_responses(flow, exchanges, encodings.append)
        except HttpError as exc:
            error = exc
        await feeding
        return Relayed(b"".join(sent), redactor.replaced, encodings, error)

    return asyncio.run(go())


def split_everywhere(data: bytes, size: int = 3) -> list[bytes]:
    return [data[start : start + size] for start in range(0, len(data), size)]


def test_a_sized_response_is_redacted_and_re_measured_even_split_across_reads() -> None:
    body = b'{"headers": {"Authorization": "Bearer ' + SECRET + b'"}, "other": "' + OTHER.value.encode() + b'"}'
    raw = (b"HTTP/1.1 200 OK\r\nX-Echo: " + SECRET + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    relayed = respond(split_everywhere(raw), ["GET"])
    assert SECRET not in relayed.sent and OTHER.value.encode() not in relayed.sent
    [(status, headers, got, _)] = read_responses(relayed.sent, ["GET"])
    assert status == 200 and headers["x-echo"] == API.placeholder
    assert got == body.replace(SECRET, PLACEHOLDER).replace(OTHER.value.encode(), OTHER.placeholder.encode())
    assert headers["content-length"] == str(len(got))
    assert relayed.redacted == 3


def test_a_chunked_response_is_re_chunked_with_its_trailers_redacted() -> None:
    body = b"token=" + SECRET + b"&again=" + SECRET
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in split_everywhere(body, 5))
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\nX-Sig: " + SECRET + b"\r\n\r\n"
    relayed = respond(split_everywhere(raw, 7), ["POST"])
    assert SECRET not in relayed.sent
    [(_, headers, got, trailers)] = read_responses(relayed.sent, ["POST"])
    assert got == body.replace(SECRET, PLACEHOLDER) and trailers == {"x-sig": API.placeholder}
    assert headers["transfer-encoding"] == "chunked"


def test_a_chunk_announced_huge_streams_instead_of_being_held() -> None:
    # 1 GiB announced, 300 KB sent, then the end: what arrived went on as it came (a
    # sender cannot make the proxy hold what it announces), and the cut ends the relay.
    data = b"z" * 300_000 + SECRET
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40000000\r\n" + data
    relayed = respond(split_everywhere(raw, 64 * 1024), ["GET"])
    assert relayed.error is not None and "ended inside a body" in str(relayed.error)
    assert relayed.sent.count(b"z") == 300_000 and SECRET not in relayed.sent


def test_a_sized_body_beyond_the_buffer_limit_streams_as_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_http, "BUFFERED_BODY_MAX", 64)
    body = b"x" * 100 + SECRET + b"y" * 100
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body + b"HTTP/1.1 204 No Content\r\n\r\n"
    relayed = respond(split_everywhere(raw, 50), ["GET", "GET"])
    [(_, headers, got, _), (status, _, empty, _)] = read_responses(relayed.sent, ["GET", "GET"])
    assert "content-length" not in headers and headers["transfer-encoding"] == "chunked"
    assert got == body.replace(SECRET, PLACEHOLDER) and (status, empty) == (204, b"")


def test_bodies_beyond_what_the_session_may_hold_at_once_stream_as_chunked() -> None:
    # Another connection of the session holds 80 of its 100 bytes: a 50-byte body streams
    # (its length unknown until its end); once that connection lets go, it is held again.
    held = HeldBytes(100)
    body = b"a" * 25 + SECRET
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    with held.reserve(80) as granted:
        assert granted
        streamed = read_responses(respond([raw], ["GET"], held).sent, ["GET"])
    again = read_responses(respond([raw], ["GET"], held).sent, ["GET"])
    [(_, headers, got, _)] = streamed
    assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers
    assert got == body.replace(SECRET, PLACEHOLDER)
    [(_, headers, got, _)] = again
    assert headers["content-length"] == str(len(got)) and got == body.replace(SECRET, PLACEHOLDER)


def test_head_204_304_and_interim_responses_have_no_body() -> None:
    # The HEAD's Content-Length announces a body it does not have: the next bytes are the
    # next response, and so after 204 and 304; a 103 comes before its request's answer.
    raw = (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
           b"HTTP/1.1 204 No Content\r\nX-Id: " + SECRET + b"\r\n\r\n"
           b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"
           b"HTTP/1.1 103 Early Hints\r\nLink: </" + SECRET + b">\r\n\r\n"
           b"HTTP/1.1 100 Continue\r\n\r\n"
           b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    methods = ["HEAD", "DELETE", "GET", "POST"]
    relayed = respond([raw], methods)
    assert relayed.error is None and SECRET not in relayed.sent
    answers = [(status, body) for status, _, body, _ in read_responses(relayed.sent, methods)]
    assert answers == [(200, b""), (204, b""), (304, b""), (103, b""), (100, b""), (200, b"ok")]
    assert relayed.sent.endswith(b"Content-Length: 2\r\n\r\nok")


def test_a_response_without_length_is_read_to_the_end_of_the_connection() -> None:
    raw = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + b"leak " + SECRET + b" end"
    relayed = respond(split_everywhere(raw, 4), ["GET"])
    assert relayed.error is None
    assert relayed.sent.startswith(b"HTTP/1.1 200 OK\r\n")  # the proxy's own version
    assert relayed.sent.endswith(b"\r\n\r\nleak " + PLACEHOLDER + b" end")


def test_a_switch_of_protocols_is_relayed_unframed_and_still_redacted() -> None:
    raw = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x05hello" + SECRET
    relayed = respond(split_everywhere(raw, 6), ["GET"])
    assert relayed.sent.endswith(b"\r\n\r\n\x81\x05hello" + PLACEHOLDER)


def test_an_encoded_response_is_reported_and_still_scanned_as_it_is() -> None:
    body = b"\x1f\x8b stored " + SECRET
    raw = b"HTTP/1.1 200 OK\r\nContent-Encoding: x-stored\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    relayed = respond([raw], ["GET"])
    assert relayed.encodings == ["x-stored"]
    assert SECRET not in relayed.sent and relayed.sent.endswith(PLACEHOLDER)


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok",
        b"ICY 200 OK\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Le",
    ],
)
def test_a_malformed_response_ends_the_relay_and_passes_nothing_of_it_on(raw: bytes) -> None:
    first = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    relayed = respond([first + raw], ["GET", "GET"])
    assert relayed.error is not None and relayed.error.status == 502
    assert str(relayed.error).startswith("malformed response: ")
    # The good response went out whole; of the bad one, at most the head of a body that
    # was being re-framed when it broke (a chunked stream that never ends).
    assert relayed.sent.startswith(first)
    assert b"ok" not in relayed.sent[len(first):]


@settings(max_examples=50, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=8),
       chunked=st.booleans())
def test_a_secret_is_caught_wherever_the_reads_cut_it(cuts: list[int], chunked: bool) -> None:
    body = b"a" * 37 + SECRET + b"b" * 11 + SECRET + SECRET + b"c" * 5
    if chunked:
        framed = b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        framed = b"Content-Length: %d\r\n\r\n" % len(body) + body
    raw = b"HTTP/1.1 200 OK\r\n" + framed
    pieces, start = [], 0
    for cut in sorted(set(cut % len(raw) for cut in cuts)):
        pieces.append(raw[start:cut])
        start = cut
    pieces.append(raw[start:])
    relayed = respond([piece for piece in pieces if piece], ["GET"])
    [(_, _, got, _)] = read_responses(relayed.sent, ["GET"])
    assert got == body.replace(SECRET, PLACEHOLDER) and relayed.redacted == 3


@pytest.mark.parametrize("status", [101, 426])
def test_a_request_to_switch_protocols_waits_for_its_answer(status: int) -> None:
    # What follows an Upgrade request is another protocol only if the server switched:
    # relayed unframed (still substituted) after a 101, read as the next request otherwise.
    after = b"GET /next HTTP/1.1\r\nX-Key: " + PLACEHOLDER + b"\r\n\r\n"

    async def go() -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n" + after)
        reader.feed_eof()
        sent: list[bytes] = []
        head_out = asyncio.Event()

        async def send(data: bytes) -> None:
            sent.append(data)
            head_out.set()

        exchanges = Exchanges()
        relaying = asyncio.create_task(
            relay_requests(Flow(reader, send, Substituter.for_requests([API], []), "request", 400, HeldBytes(HELD_PER_SESSION)), exchanges)
        )
        await asyncio.wait_for(head_out.wait(), 5)
        await asyncio.sleep(0)
        assert len(sent) == 1, "the request relay read on before the answer to its Upgrade"
        exchanges.answered(ResponseHead(status, "", []))
        await asyncio.wait_for(relaying, 5)
        return b"".join(sent[1:])

    rest = asyncio.run(go())
    if status == 101:
        assert rest == after.replace(PLACEHOLDER, SECRET)  # as it came: no head was parsed
    else:
        assert rest.startswith(b"GET /next HTTP/1.1\r\nX-Key: " + SECRET) and b"Accept-Encoding: identity" in rest
