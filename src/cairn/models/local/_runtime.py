"""Loads a GGUF model into llama.cpp once per process and runs one generation at a time on it.

Loading takes about 2 GB of RAM and a second or more, so a loaded model is kept for the
life of the process and shared by every session that names it; this registry is the one
piece of process-wide state in the local provider, and it exists for exactly that reason.
A llama.cpp context holds one KV cache and is not thread-safe, so each `LoadedModel`
serializes generations with a lock: concurrent sessions take turns rather than corrupt
each other's state. Taking turns also keeps the KV-cache prefix reuse effective.

Everything here is synchronous and blocks (loading, token evaluation). `_provider` calls it
only through worker threads, one token at a time, so the event loop never waits on it.
"""

from __future__ import annotations

import codecs
import importlib.util
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.errors import ModelError
from cairn.models.local._reply import FENCED_BODY, FENCED_BODY_GBNF
from cairn.models.local._sampling import install_checked_sampling

__all__ = [
    "Generation",
    "GenerationSettings",
    "LoadedModel",
    "find_loaded_model",
    "is_llama_cpp_installed",
    "load_model",
    "reply_gbnf",
]

_log = logging.getLogger(__name__)

_CONTEXT_TOKENS = 8192
_END_MARKERS = ("<|im_end|>", "<|endoftext|>")

_registry_lock = threading.Lock()
_registry: dict[Path, LoadedModel] = {}


def is_llama_cpp_installed() -> bool:
    """Whether the `local` extra's inference library is installed.

    Looks the package up without importing it: importing loads llama.cpp's shared
    library, which is slow enough to matter on the event loop.
    """
    return importlib.util.find_spec("llama_cpp") is not None


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """Sampling for one reply. Low temperature: tool calls should be the likely ones."""

    max_tokens: int = 1024
    temperature: float = 0.2
    top_p: float = 0.9
    top_k: int = 40
    seed: int = 0


def _thread_count() -> int:
    # All cores this process may use: generation is compute-bound and runs one at a time.
    return max(1, len(os.sched_getaffinity(0)))


class Generation:
    """One reply being generated: pull text pieces with `next_piece`, then `close`.

    Holds its model's lock from creation until `close` (idempotent), so nothing else can
    touch the shared KV cache while this reply is in flight.
    """

    def __init__(
        self,
        tokens: Iterator[int],
        detokenize: Callable[[int], bytes],
        end_tokens: frozenset[int],
        *,
        prompt_tokens: int,
        max_tokens: int,
        release: Callable[[], None],
    ) -> None:
        self._tokens = tokens
        self._detokenize = detokenize
        self._end_tokens = end_tokens
        self._max_tokens = max_tokens
        self._release = release
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._is_open = True
        self.prompt_tokens = prompt_tokens
        self.output_tokens = 0
        self.is_truncated = False

    def next_piece(self) -> str | None:
        """The next piece of text, or None once the reply is complete."""
        while self._is_open:
            if self.output_tokens >= self._max_tokens:
                self.is_truncated = True
                return self._finish()
            token = next(self._tokens, None)
            if token is None or token in self._end_tokens:
                return self._finish()
            self.output_tokens += 1
            # Byte-level BPE splits multi-byte characters across tokens; the incremental
            # decoder holds partial bytes back until the character is complete.
            text = self._decoder.decode(self._detokenize(token))
            if text:
                return text
        return None

    def _finish(self) -> str | None:
        tail = self._decoder.decode(b"", final=True)
        self.close()
        return tail or None

    def close(self) -> None:
        if not self._is_open:
            return
        self._is_open = False
        close = getattr(self._tokens, "close", None)
        try:
            if close is not None:
                close()
        finally:
            self._release()


class LoadedModel:
    """One llama.cpp model and context, lent to one generation at a time."""

    def __init__(self, llama: Any, load_seconds: float) -> None:
        self._llama = llama
        self._lock = threading.Lock()
        self._grammars: dict[str, Any] = {}
        self.load_seconds = load_seconds
        end_tokens = {int(llama.token_eos())}
        for marker in _END_MARKERS:
            tokens = self._tokenize(marker)
            if len(tokens) == 1:
                end_tokens.add(tokens[0])
        self._end_tokens = frozenset(end_tokens)

    def _tokenize(self, text: str) -> list[int]:
        # special=True: the ChatML markers in the prompt are single control tokens.
        return [int(t) for t in self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)]

    def _detokenize(self, token: int) -> bytes:
        return bytes(self._llama.detokenize([token]))

    def _grammar(self, schema_json: str) -> Any:
        """Compile a reply schema to a llama.cpp grammar, once per distinct schema."""
        from llama_cpp.llama_grammar import LlamaGrammar  # type: ignore[import-not-found,unused-ignore]

        grammar = self._grammars.get(schema_json)
        if grammar is None:
            try:
                gbnf = reply_gbnf(json.loads(schema_json))
            except (ValueError, KeyError, TypeError) as exc:
                raise ModelError(
                    f"The local model cannot constrain its replies to these tools' schemas: {exc}",
                    code="invalid_request",
                    retryable=False,
                ) from exc
            grammar = LlamaGrammar.from_string(gbnf, verbose=False)
            self._grammars[schema_json] = grammar
        return grammar

    def open(self, prompt: str, schema_json: str, settings: GenerationSettings) -> Generation:
        """Start a reply constrained to `schema_json`; blocks until the model is free."""
        self._lock.acquire()
        try:
            tokens = self._tokenize(prompt)
            budget = int(self._llama.n_ctx()) - settings.max_tokens
            if len(tokens) > budget:
                raise ModelError(
                    f"The conversation is {len(tokens)} tokens; the local model's context "
                    f"leaves room for {budget} before its reply.",
                    code="context_length_exceeded",
                    retryable=False,
                )
            self._llama.set_seed(settings.seed)
            stream: Iterator[int] = self._llama.generate(
                tokens,
                temp=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k,
                min_p=0.0,
                # Code repeats tokens legitimately; the grammar and the repeat guard
                # handle the loops a penalty would be for.
                repeat_penalty=1.0,
                grammar=self._grammar(schema_json),
            )
        except BaseException:
            self._lock.release()
            raise
        return Generation(
            stream,
            self._detokenize,
            self._end_tokens,
            prompt_tokens=len(tokens),
            max_tokens=settings.max_tokens,
            release=self._lock.release,
        )


def reply_gbnf(schema: Mapping[str, Any]) -> str:
    """The grammar for a reply schema (`_reply.reply_schema`): one JSON object of one
    of its branches, followed by a code block when the branch is marked `FENCED_BODY`."""
    from llama_cpp.llama_grammar import SchemaConverter  # type: ignore[import-not-found,unused-ignore]

    new_converter: Any = SchemaConverter
    converter = new_converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    branches = list(schema["oneOf"])
    plain = [branch for branch in branches if FENCED_BODY not in branch]
    fenced = [{k: v for k, v in branch.items() if k != FENCED_BODY} for branch in branches if FENCED_BODY in branch]
    alternatives = []
    if plain:
        alternatives.append(str(converter.visit(converter.resolve_refs({"oneOf": plain}, "reply"), "reply")))
    if fenced:
        call = str(converter.visit(converter.resolve_refs({"oneOf": fenced}, "fenced"), "fenced-call"))
        alternatives.append(f"{call} fenced-body")
    return f"{converter.format_grammar()!s}\nroot ::= {' | '.join(alternatives)}\n{FENCED_BODY_GBNF}"


def find_loaded_model(path: Path) -> LoadedModel | None:
    """The model at `path` if this process has already loaded (and so verified) it."""
    with _registry_lock:
        return _registry.get(path)


def load_model(path: Path) -> LoadedModel:
    """The process's loaded copy of the model at `path`, loading it on first use."""
    with _registry_lock:
        loaded = _registry.get(path)
        if loaded is not None:
            return loaded
        try:
            from llama_cpp import Llama  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            raise ModelError(
                "The local model needs llama-cpp-python; install it with: pip install 'cairn[local]'",
                retryable=False,
            ) from exc
        started = time.monotonic()
        try:
            llama = Llama(
                model_path=str(path),
                n_ctx=_CONTEXT_TOKENS,
                n_threads=_thread_count(),
                n_threads_batch=_thread_count(),
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp could not load {path}: {exc}", retryable=False) from exc
        install_checked_sampling(llama)
        loaded = LoadedModel(llama, time.monotonic() - started)
        _log.info("loaded local model %s in %.1f s", path.name, loaded.load_seconds)
        _registry[path] = loaded
        return loaded
