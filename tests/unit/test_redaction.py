"""Redaction: known values and their plain encodings replaced in text, JSON and streams split
anywhere; ordinary text left alone."""

from __future__ import annotations

import base64
import json
import logging
import pickle
import re
from urllib.parse import quote, quote_plus

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cairn.redaction import REDACTED, KnownValues, Redactor, SessionRedactors, redacted_log_records

TOKEN = "ghp_Zx81/+kQ0aT9 wlm=4"
OTHER = "s3cr3t-deploy-key"


@pytest.fixture
def redactor() -> Redactor:
    return Redactor([TOKEN, OTHER])


def encodings(value: str) -> dict[str, str]:
    raw = value.encode()
    return {
        "plain": value,
        "base64": base64.b64encode(raw).decode(),
        "base64 unpadded": base64.b64encode(raw).decode().rstrip("="),
        "base64 url-safe": base64.urlsafe_b64encode(raw).decode(),
        "base64 of the value and a newline": base64.b64encode(raw + b"\n").decode(),
        "percent-encoded": quote(value, safe=""),
        "percent-encoded, lower case": re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), quote(value, safe="")),
        "form-encoded": quote_plus(value),
        "hex": raw.hex(),
        "HEX": raw.hex().upper(),
        "JSON escaped": json.dumps(value)[1:-1],
    }


@pytest.mark.parametrize("form", list(encodings(TOKEN)))
def test_every_plain_encoding_of_a_value_is_replaced(redactor: Redactor, form: str) -> None:
    encoded = encodings(TOKEN)[form]
    redacted = redactor.text(f"before {encoded} after")
    assert encoded not in redacted and REDACTED in redacted
    assert redacted.startswith("before ") and redacted.endswith(" after")


@pytest.mark.parametrize("offset", [0, 1, 2])
def test_a_value_inside_a_longer_base64_text_is_found_at_every_alignment(redactor: Redactor, offset: int) -> None:
    document = json.dumps({"pad": "x" * offset, "auth": OTHER, "more": "y" * 40}).encode()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        encoded = encode(document).decode()
        redacted = redactor.text(encoded)
        assert REDACTED in redacted
        leftovers = redacted.split(REDACTED)
        # What stays is the document around the value, and at most two characters at each end.
        assert sum(map(len, leftovers)) <= len(encoded) - len(OTHER) * 4 // 3 + 4


def test_ordinary_text_and_short_lookalikes_are_left_alone(redactor: Redactor) -> None:
    text = "ghp_Zx81 is not the token, nor is s3cr3t-deploy; base64 aGVsbG8gd29ybGQ= is hello world"
    assert redactor.text(text) == text
    assert not redactor.finds(text)


def test_json_values_are_redacted_in_strings_and_keys_and_nothing_else(redactor: Redactor) -> None:
    value = {"output": f"token={TOKEN}", TOKEN: [1, 2.5, None, True, {"deep": f"x{OTHER}x"}], "n": 3}
    redacted = redactor.value(value)
    assert redacted == {"output": f"token={REDACTED}", REDACTED: [1, 2.5, None, True, {"deep": f"x{REDACTED}x"}], "n": 3}
    assert redactor.finds(value) and not redactor.finds(redacted)
    assert TOKEN not in json.dumps(redacted) and OTHER not in json.dumps(redacted)


def test_without_values_nothing_changes_and_the_repr_shows_no_value() -> None:
    empty = Redactor()
    assert empty.is_empty and empty.text(TOKEN) == TOKEN and empty.value({"a": TOKEN}) == {"a": TOKEN}
    stream = empty.stream()
    assert stream.feed(TOKEN) == TOKEN and stream.flush() == ""
    assert TOKEN not in repr(Redactor([TOKEN]))


def test_a_value_too_short_to_tell_apart_from_text_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 8"):
        Redactor(["1234567"])


def test_a_value_split_across_stream_chunks_never_comes_out(redactor: Redactor) -> None:
    stream = redactor.stream()
    out = [stream.feed(chunk) for chunk in ("echo: ghp_Zx", "81/+kQ0aT9 w", "lm=4\nand s3", "cr3t-deploy-key done\n")]
    out.append(stream.flush())
    joined = "".join(out)
    assert joined == f"echo: {REDACTED}\nand {REDACTED} done\n"
    assert all(TOKEN[:6] not in piece for piece in out[:2])  # the start of the value was held back


@settings(max_examples=200, deadline=None)
@given(
    secret=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x24F), min_size=8, max_size=40),
    before=st.text(max_size=30),
    after=st.text(max_size=30),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_a_stream_cut_anywhere_gives_what_redacting_the_whole_text_gives(secret: str, before: str, after: str, cuts: list[int]) -> None:
    redactor = Redactor([secret])
    text = before + secret + after + base64.b64encode(secret.encode()).decode()
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    stream = redactor.stream()
    streamed = "".join(stream.feed(c) for c in chunks) + stream.flush()
    assert streamed == redactor.text(text)
    assert secret not in streamed


# -- what a process holds, and its log lines ----------------------------------------------


def test_known_values_grow_refuse_short_values_and_are_never_serialized() -> None:
    known = KnownValues([TOKEN])
    generation = known.generation
    assert TOKEN in known and known.redactor.text(f"x {OTHER}") == f"x {OTHER}"
    known.add(OTHER)
    assert known.generation > generation and known.redactor.text(f"{TOKEN} {OTHER}") == f"{REDACTED} {REDACTED}"
    with pytest.raises(ValueError, match="at least 8"):
        known.add("short")
    assert len(known) == 2 and TOKEN not in repr(known)
    with pytest.raises(TypeError, match="never serialized"):
        pickle.dumps(known)


def test_session_redactors_hold_values_only_while_an_execution_runs() -> None:
    redactors = SessionRedactors()
    assert redactors.for_session("s1").is_empty and redactors.everywhere().is_empty
    with redactors.holding("s1", KnownValues([TOKEN])) as known, redactors.holding("s2", KnownValues([OTHER])):
        assert redactors.for_session("s1").text(f"{TOKEN} {OTHER}") == f"{REDACTED} {OTHER}"
        assert redactors.everywhere().text(f"{TOKEN} {OTHER}") == f"{REDACTED} {REDACTED}"
        known.add("registered-later-1")
        assert redactors.everywhere().text("registered-later-1") == REDACTED
    assert redactors.for_session("s1").is_empty and redactors.everywhere().is_empty


def test_every_log_line_and_traceback_is_redacted_whatever_the_logger(caplog: pytest.LogCaptureFixture) -> None:
    redactors = SessionRedactors()
    logger = logging.getLogger("some.library")
    with redacted_log_records(redactors), redactors.holding("s1", KnownValues([TOKEN])), caplog.at_level(logging.INFO):
        logger.info("token %s in args", TOKEN)
        logger.info(f"token {base64.b64encode(TOKEN.encode()).decode()} in the message")
        try:
            raise RuntimeError(f"refused {TOKEN}")
        except RuntimeError:
            logger.exception("failed")
    assert [r.getMessage() for r in caplog.records][:2] == [f"token {REDACTED} in args", f"token {REDACTED} in the message"]
    assert f"RuntimeError: refused {REDACTED}" in caplog.text and TOKEN not in caplog.text
    logger.info("after %s", TOKEN)  # the factory is gone with the block
    assert logging.getLogRecordFactory() is logging.LogRecord
