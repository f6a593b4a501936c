"""Grammar-constrained sampling that consults the grammar only when the model strays.

llama-cpp-python puts the grammar first in its sampler chain, so every token is checked
against the whole 151k-token vocabulary before top-k narrows it down; on two cores that
took generation from ~4 to ~1 token/s (measured). llama.cpp's own tools avoid this the
same way done here: sample without the grammar, check only the chosen token against it,
and only if the grammar rejects that token, apply the grammar to the full vocabulary and
sample again. Inside a string (most of a reply) the model's choice is nearly always
allowed, so the full check is rare.

`install_checked_sampling` swaps this sampler into one `Llama` instance by replacing its
`_init_sampler` hook, which `Llama.generate` calls once per generation. That hook is
private to llama-cpp-python, which is why the `local` extra pins its exact version.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

from cairn.errors import ModelError

__all__ = ["install_checked_sampling"]


class _CheckedSampler:
    """Duck-types the `LlamaSampler.sample(ctx, idx)` that `Llama.sample` calls."""

    def __init__(self, llama: Any, grammar: Any, *, top_k: int, top_p: float, min_p: float, temp: float) -> None:
        import llama_cpp  # type: ignore[import-not-found,unused-ignore]
        from llama_cpp import _internals  # type: ignore[import-not-found,unused-ignore]

        self._lib = llama_cpp
        self._n_vocab = int(llama.n_vocab())
        # The choosing chain: no grammar, no penalties (the caller uses none).
        new_chain: Any = _internals.LlamaSampler
        self._chain = new_chain()
        self._chain.add_top_k(top_k)
        self._chain.add_top_p(top_p, 1)
        self._chain.add_min_p(min_p, 1)
        self._chain.add_temp(temp)
        self._chain.add_dist(llama._seed)
        # The grammar lives in a chain of its own, which owns and frees it.
        self._grammar = new_chain()
        grammar_sampler = llama_cpp.llama_sampler_init_grammar(
            llama._model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
        )
        if not grammar_sampler:
            raise ModelError("llama.cpp rejected the reply grammar", code="invalid_request", retryable=False)
        llama_cpp.llama_sampler_chain_add(self._grammar.sampler, grammar_sampler)

    def sample(self, ctx: Any, idx: int) -> int:
        token = int(self._lib.llama_sampler_sample(self._chain.sampler, ctx.ctx, idx))
        if not self._allows(token):
            token = self._sample_allowed(ctx, idx)
        self._lib.llama_sampler_accept(self._grammar.sampler, token)
        return token

    def _allows(self, token: int) -> bool:
        cells: Any = (self._lib.llama_token_data * 1)()
        cells[0].id = token
        cells[0].logit = 0.0
        candidates = self._lib.llama_token_data_array(data=cells, size=1, selected=-1, sorted=False)
        self._lib.llama_sampler_apply(self._grammar.sampler, ctypes.byref(candidates))
        return math.isfinite(cells[0].logit)

    def _sample_allowed(self, ctx: Any, idx: int) -> int:
        """Apply the grammar to the whole vocabulary, then choose among what it allows."""
        import numpy as np  # type: ignore[import-not-found,unused-ignore]

        logits = self._lib.llama_get_logits_ith(ctx.ctx, idx)
        cells: Any = (self._lib.llama_token_data * self._n_vocab)()
        view = np.frombuffer(memoryview(cells), dtype=np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)]))
        view["id"] = np.arange(self._n_vocab, dtype=np.int32)
        view["logit"] = np.ctypeslib.as_array(logits, shape=(self._n_vocab,))
        candidates = self._lib.llama_token_data_array(data=cells, size=self._n_vocab, selected=-1, sorted=False)
        self._lib.llama_sampler_apply(self._grammar.sampler, ctypes.byref(candidates))
        self._lib.llama_sampler_apply(self._chain.sampler, ctypes.byref(candidates))
        token = int(candidates.data[candidates.selected].id)
        self._lib.llama_sampler_accept(self._chain.sampler, token)
        return token


def install_checked_sampling(llama: Any) -> None:
    """Make `llama.generate(..., grammar=g)` sample through `_CheckedSampler`."""
    original = llama._init_sampler

    def init_sampler(*, grammar: Any = None, top_k: int, top_p: float, min_p: float, temp: float, **rest: Any) -> Any:
        if grammar is None:
            return original(top_k=top_k, top_p=top_p, min_p=min_p, temp=temp, **rest)
        return _CheckedSampler(llama, grammar, top_k=top_k, top_p=top_p, min_p=min_p, temp=temp)

    llama._init_sampler = init_sampler
