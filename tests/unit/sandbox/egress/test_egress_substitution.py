"""Placeholders replaced in a stream cut anywhere, and HTTP request bodies re-framed."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cairn.sandbox.egress import WireSecret
from cairn.sandbox.egress._exchanges import Exchanges, relay_requests
from cairn.sandbox.egress._http import BUFFERED_BODY_MAX, HELD_PER_SESSION, Flow, HeldBytes, HttpError
from cairn.sandbox.egress.substitution import Substituter

ALLOWED = WireSecret("c1", "API_KEY", "cairn_ph_allowed_0123456789abcdef", "the-real-secret", ("api.test",))
OTHER = WireSecret("c2", "OTHER", "cairn_ph_other_fedcba9876543210", "other-secret", ("other.test",))


@given(
    parts=st.lists(st.sampled_from([b"x", b"cairn_ph_", ALLOWED.placeholder.encode(), OTHER.placeholder.encode(), b"\r\n"]),
                   max_size=30),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=10),
)
def test_a_stream_cut_anywhere_is_substituted_as_a_whole(parts: list[bytes], cuts: list[int]) -> None:
    data = b"".join(parts)
    substituter = Substituter.for_requests([ALLOWED], [OTHER])
    out, start = [], 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        out.append(substituter.feed(data[start:cut]))
        start = max(start, cut)
    out.append(substituter.feed(data[start:]))
    out.append(substituter.flush())
    expected = data.replace(ALLOWED.placeholder.encode(), ALLOWED.value.encode())
    assert b"".join(out) == expected
    assert substituter.replaced == data.count(ALLOWED.placeholder.encode())
    assert substituter.unchanged == data.count(OTHER.placeholder.encode())


OVERLAPPING = {b"abcab": b"<1>", b"abcabcx": b"<2>", b"bca": b"<3>", b"x": b"<4>"}


@given(
    data=st.lists(st.sampled_from([b"a", b"b", b"c", b"x", b"abc", b"abcab", b"abcabcx"]), max_size=40).map(b"".join),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=12),
)
def test_keys_that_overlap_or_begin_one_another_stream_as_they_replace_whole(data: bytes, cuts: list[int]) -> None:
    assert Substituter(OVERLAPPING).replace_all(b"abcabcxabcabca") == b"<2><1>ca"  # leftmost, then longest
    whole = Substituter(OVERLAPPING).replace_all(data)
    streaming = Substituter(OVERLAPPING)
    out, start = [], 0
    for cut in sorted(c % (len(data) + 1) for c in cuts):
        out.append(streaming.feed(data[start:cut]))
        start = max(start, cut)
    out += (streaming.feed(data[start:]), streaming.flush())
    assert b"".join(out) == whole


def test_a_piece_with_nothing_to_replace_goes_on_uncopied() -> None:
    substituter = Substituter.for_responses([ALLOWED])
    piece = b"z" * 100_000
    assert substituter.feed(piece) is piece  # and nothing is held back: no end of it begins a secret
    held = b"z" * 10 + ALLOWED.value.encode()[:5]
    assert substituter.feed(held) == b"z" * 10 and substituter.flush() == ALLOWED.value.encode()[:5]


def relay(raw: bytes) -> bytes:
    async def go() -> bytes:
        reader = asyncio.StreamReader(limit=64 * 1024)
        reader.feed_data(raw)
        reader.feed_eof()
        sent: list[bytes] = []

        async def send(data: bytes) -> None:
            sent.append(data)

        flow = Flow(reader, send, Substituter.for_requests([ALLOWED], [OTHER]), "request", 400, HeldBytes(HELD_PER_SESSION))
        await relay_requests(flow, Exchanges())
        return b"".join(sent)

    return asyncio.run(go())


def test_a_sized_body_is_re_measured() -> None:
    body = f"token={ALLOWED.placeholder}".encode()
    out = relay(b"POST /x HTTP/1.1\r\nHost: api.test\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                + b"GET /y HTTP/1.1\r\nAuthorization: Bearer " + ALLOWED.placeholder.encode() + b"\r\n\r\n")
    head, rest = out.split(b"\r\n\r\n", 1)
    assert b"Content-Length: %d" % len(b"token=the-real-secret") in head
    assert rest.startswith(b"token=the-real-secret")
    # The proxy asks for an uncompressed response, whatever the client accepts.
    assert rest.endswith(b"Authorization: Bearer the-real-secret\r\nAccept-Encoding: identity\r\n\r\n")


def test_a_chunked_body_is_re_chunked() -> None:
    placeholder = ALLOWED.placeholder.encode()
    body = b"a=" + placeholder
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in (body[:10], body[10:]))
    out = relay(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nAccept-Encoding: gzip, br\r\nTE: gzip\r\n\r\n"
                + chunks + b"0\r\n\r\n")
    head, rest = out.split(b"\r\n\r\n", 1)
    assert b"Transfer-Encoding: chunked" in head and b"gzip" not in head and b"Accept-Encoding: identity" in head
    decoded, remaining = b"", rest
    while True:
        size_line, remaining = remaining.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            break
        decoded, remaining = decoded + remaining[:size], remaining[size + 2:]
    assert decoded == b"a=the-real-secret"


def test_a_large_body_streams_as_chunked() -> None:
    body = b"z" * (BUFFERED_BODY_MAX + 10) + ALLOWED.placeholder.encode()
    out = relay(b"PUT / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    head, _ = out.split(b"\r\n\r\n", 1)
    assert b"Transfer-Encoding: chunked" in head and b"Content-Length" not in head
    assert out.endswith(b"the-real-secret\r\n0\r\n\r\n")


def test_a_body_behind_100_continue_streams_as_chunked() -> None:
    body = b"k=" + ALLOWED.placeholder.encode()
    out = relay(b"PUT / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    head, rest = out.split(b"\r\n\r\n", 1)
    assert b"Transfer-Encoding: chunked" in head and b"Content-Length" not in head
    assert rest == b"%x\r\nk=the-real-secret\r\n0\r\n\r\n" % len(b"k=the-real-secret")


@pytest.mark.parametrize(
    "raw",
    [
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
    ],
)
def test_ambiguous_or_malformed_requests_are_refused(raw: bytes) -> None:
    with pytest.raises(HttpError):
        relay(raw)
