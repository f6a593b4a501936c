"""Translates OpenAI-compatible failures into `ModelError`s carrying turn error codes.

This is the one boundary where `openai` exceptions, failed-response events and early stream
ends become Cairn errors (style: foreign exceptions are translated at the boundary). Each
`ModelError` gets a turn error `code` from spec §3.6 and a `retryable` hint; the engine
decides what to do with the hint. The client library has already spent its own
`max_retries` on connection errors, 408, 409, 429 and 5xx before anything arrives here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import openai

from cairn.errors import ModelError

__all__ = [
    "incomplete_response_error",
    "model_error_from_openai",
    "model_error_from_provider_code",
    "stream_ended_early_error",
]

# Provider error codes are more specific than HTTP statuses (a 400 can be a context overflow, a
# 429 an exhausted quota that no retry will cure), so they are consulted first.
_BY_PROVIDER_CODE: Mapping[str, tuple[str, bool]] = {
    "context_length_exceeded": ("context_length_exceeded", False),
    "insufficient_quota": ("usage_limit_exceeded", False),
    "rate_limit_exceeded": ("rate_limit_exceeded", True),
    "invalid_api_key": ("authentication_error", False),
    "model_not_found": ("resource_not_found", False),
    "server_error": ("server_error", True),
    "invalid_prompt": ("invalid_request", False),
    "misalignment_policy_violation": ("misalignment_policy_violation", False),
}

_BY_STATUS: Mapping[int, tuple[str, bool]] = {
    400: ("invalid_request", False),
    401: ("authentication_error", False),
    # A key without access to the model is an authentication problem from the operator's
    # point of view: the fix is the same (another key), and no retry helps.
    403: ("authentication_error", False),
    404: ("resource_not_found", False),
    408: ("request_timeout", True),
    409: ("server_error", True),
    422: ("invalid_request", False),
    429: ("rate_limit_exceeded", True),
    503: ("server_overloaded", True),
}

# Keys are the Responses API's `incomplete_details.reason`; Chat Completions' finish reasons
# `length` and `content_filter` are translated to these by the caller.
_BY_INCOMPLETE_REASON: Mapping[str, tuple[str, bool]] = {
    "max_output_tokens": ("max_output_tokens", False),
    "content_filter": ("invalid_request", False),
}

# OpenAI-compatible servers (vLLM, llama.cpp, Ollama) report a context overflow as a plain 400
# without OpenAI's error code; their messages mention the context length or window instead.
_CONTEXT_OVERFLOW_MESSAGE = re.compile(r"context[ _](length|window)|maximum context", re.IGNORECASE)


def model_error_from_openai(err: openai.OpenAIError) -> ModelError:
    """Map an exception raised by the `openai` client to a `ModelError`."""
    # APITimeoutError subclasses APIConnectionError, so the order of these checks matters.
    if isinstance(err, openai.APITimeoutError):
        return ModelError(f"model request timed out: {err}", code="request_timeout", retryable=True)
    if isinstance(err, openai.APIConnectionError):
        return ModelError(f"could not reach the model endpoint: {err}", code="connection_failed", retryable=True)
    if isinstance(err, openai.APIStatusError):
        code, retryable = _classify(err.code, err.message, err.status_code)
        return _model_error(
            err.message,
            code,
            retryable,
            err.param,
            status=err.status_code,
            provider_code=err.code,
            request_id=err.request_id,
        )
    if isinstance(err, openai.APIError):
        # An error object inside an open stream: no status, only the provider's code.
        code, retryable = _classify(err.code, err.message, None)
        return _model_error(err.message, code, retryable, err.param, provider_code=err.code)
    return ModelError(f"model client failed: {err}", code="server_error", retryable=False)


def model_error_from_provider_code(code: str | None, message: str, *, param: str | None = None) -> ModelError:
    """Map an error reported inside a stream (`error`, `response.failed`) to a `ModelError`."""
    turn_code, retryable = _classify(code, message, None)
    return _model_error(message, turn_code, retryable, param, provider_code=code)


def stream_ended_early_error(expected: str) -> ModelError:
    """The endpoint closed the stream before its terminal event; asking again may succeed."""
    return ModelError(f"model stream ended before {expected}", code="server_error", retryable=True)


def _classify(provider_code: str | None, message: str, status: int | None) -> tuple[str, bool]:
    if provider_code is not None and provider_code in _BY_PROVIDER_CODE:
        return _BY_PROVIDER_CODE[provider_code]
    if status is None and provider_code is not None and provider_code.isdigit():
        # vLLM puts the HTTP status in the `code` of an error sent inside the stream.
        status = int(provider_code)
    if status in (None, 400) and _CONTEXT_OVERFLOW_MESSAGE.search(message):
        return ("context_length_exceeded", False)
    if status is None:
        # A failure reported mid-stream with an unknown code is the provider's fault.
        return ("server_error", True)
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status >= 500:
        return ("server_error", True)
    return ("invalid_request", False)


def _model_error(
    message: str,
    code: str,
    retryable: bool,
    param: str | None,
    **context: Any,
) -> ModelError:
    return ModelError(
        message,
        code=code,
        param=param,
        retryable=retryable,
        context={key: value for key, value in context.items() if value is not None},
    )


def incomplete_response_error(reason: str | None) -> ModelError:
    """The model stopped before finishing; a half-finished step is never handed to the engine.

    Hitting the output limit or the provider's content filter happens again on a retry, so
    only an unexplained stop is retryable.
    """
    code, retryable = _BY_INCOMPLETE_REASON.get(reason or "", ("server_error", True))
    return ModelError(
        f"model response incomplete: {reason or 'no reason given'}",
        code=code,
        retryable=retryable,
        context={"incomplete_reason": reason} if reason else None,
    )
