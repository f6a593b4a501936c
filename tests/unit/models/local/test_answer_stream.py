"""Incremental decoding of the final answer's text out of the reply JSON."""

from __future__ import annotations

import json

import pytest

from cairn.models.local._answer_stream import AnswerStream


def _answer(text: str, *, compact: bool = False) -> str:
    separators = (",", ":") if compact else (", ", ": ")
    return json.dumps({"name": "final_answer", "arguments": {"text": text}}, separators=separators)


def _feed_all(raw: str, size: int) -> tuple[AnswerStream, list[str]]:
    stream = AnswerStream()
    pieces = [stream.feed(raw[i : i + size]) for i in range(0, len(raw), size)]
    return stream, [p for p in pieces if p]


TEXTS = [
    "Done.",
    'He said "hi" \\ and left.\n\tTabbed',
    "Unicode: é ü 中文 and an emoji 😀 via json escapes",
    "",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_pieces_concatenate_to_the_decoded_text(text: str, size: int) -> None:
    # json.dumps escapes non-ASCII as \uXXXX (surrogate pairs for the emoji): the hardest case.
    stream, pieces = _feed_all(_answer(text), size)
    assert stream.is_answer
    assert "".join(pieces) == text


def test_raw_unicode_characters_pass_through() -> None:
    raw = '{"name": "final_answer", "arguments": {"text": "├── a.py 😀"}}'
    _, pieces = _feed_all(raw, 1)
    assert "".join(pieces) == "├── a.py 😀"


def test_text_streams_before_the_reply_is_complete() -> None:
    stream = AnswerStream()
    assert stream.feed('{"name": "final_answer", "arguments": {"text": "') == ""
    assert stream.feed("Hel") == "Hel"
    assert stream.feed("lo\\") == "lo"  # the escape waits for its second character
    assert stream.feed("nworld") == "\nworld"
    assert stream.feed('"}}') == ""
    assert stream.feed("trailing") == ""


def test_compact_and_spaced_json_both_stream() -> None:
    _, pieces = _feed_all(_answer("ok", compact=True), 1)
    assert "".join(pieces) == "ok"
    _, pieces = _feed_all('{ "name" : "final_answer" ,\n "arguments" : { "text" : "ok" } }', 1)
    assert "".join(pieces) == "ok"


@pytest.mark.parametrize("size", [1, 4])
def test_the_thought_before_the_answer_is_skipped(size: int) -> None:
    thought = 'It printed "ok" {"name": "final_answer"} so it is done \\'
    raw = json.dumps({"thought": thought, "name": "final_answer", "arguments": {"text": "All done."}})
    stream, pieces = _feed_all(raw, size)
    assert stream.is_answer
    assert "".join(pieces) == "All done."


def test_a_tool_call_after_a_thought_streams_nothing() -> None:
    raw = json.dumps({"thought": "run it", "name": "exec_command", "arguments": {"cmd": "ls"}})
    stream, pieces = _feed_all(raw, 1)
    assert pieces == []
    assert not stream.is_answer


def test_a_reply_that_is_not_an_object_streams_nothing() -> None:
    stream, pieces = _feed_all('Sure! {"name": "final_answer", "arguments": {"text": "x"}}', 1)
    assert pieces == []
    assert not stream.is_answer


def test_a_tool_call_streams_nothing() -> None:
    raw = json.dumps({"name": "exec_command", "arguments": {"cmd": 'echo "final_answer"'}})
    stream, pieces = _feed_all(raw, 1)
    assert pieces == []
    assert not stream.is_answer


def test_a_tool_whose_name_starts_like_the_answer_streams_nothing() -> None:
    raw = json.dumps({"name": "final_answer_draft", "arguments": {"text": "x"}})
    stream, pieces = _feed_all(raw, 1)
    assert pieces == []
    assert not stream.is_answer


def test_keys_in_another_order_stream_nothing() -> None:
    raw = '{"arguments": {"text": "x"}, "name": "final_answer"}'
    stream, pieces = _feed_all(raw, 1)
    assert pieces == []
    assert not stream.is_answer


def test_a_lone_high_surrogate_becomes_a_replacement_character() -> None:
    raw = '{"name": "final_answer", "arguments": {"text": "a\\ud83db"}}'
    _, pieces = _feed_all(raw, 1)
    assert "".join(pieces) == "a\ufffdb"
