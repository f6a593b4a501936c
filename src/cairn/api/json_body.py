"""Reading JSON request bodies: content type, one size limit, one nesting limit, valid text.

Each check runs before anything is decoded further, so a hostile body costs at most one
pass over its bytes: the size while it streams in, the nesting depth with a scan that skips
string contents (so `json.loads` never recurses into a deep document and raises
`RecursionError`), then the decoded strings' validity (`cairn.api.text`), then the pydantic
model in strict mode. Every failure is a 4xx in the error envelope naming the field.
"""

from __future__ import annotations

import json
import re
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from cairn.api.text import check_text_tree
from cairn.errors import InvalidRequestError, PayloadTooLargeError, UnsupportedMediaTypeError

__all__ = ["MAX_JSON_DEPTH", "read_body", "read_model"]

M = TypeVar("M", bound=BaseModel)

# Deep enough for any JSON schema of a tool's parameters; far below the decoder's recursion.
MAX_JSON_DEPTH = 64

# A JSON string (skipped whole, escapes included) or a bracket; the unrolled string pattern
# keeps the regex engine linear on long strings such as base64 file data.
_STRING_OR_BRACKET = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_OPENERS = (ord("["), ord("{"))
_QUOTE = ord('"')
_DIGITS = re.compile(r"[0-9]+")


def _check_content_type(request: Request) -> None:
    header = request.headers.get("content-type")
    if header is None:
        raise UnsupportedMediaTypeError("this endpoint takes a JSON body: send 'Content-Type: application/json'")
    media_type, *params = (part.strip() for part in header.split(";"))
    if media_type.lower() != "application/json":
        raise UnsupportedMediaTypeError(f"Content-Type {media_type!r} is not supported: send 'application/json'")
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() != "charset" or value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise UnsupportedMediaTypeError(f"Content-Type parameter {param!r} is not supported: JSON bodies are UTF-8")


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The body of a JSON request, refused with 415 for another content type and 413 past `max_bytes`."""
    _check_content_type(request)
    declared = request.headers.get("content-length")
    if declared is not None and _DIGITS.fullmatch(declared) and (len(declared) > 18 or int(declared) > max_bytes):
        raise PayloadTooLargeError(f"request body is {declared} bytes; the limit is {max_bytes}")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLargeError(f"request body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _check_depth(raw: bytes) -> None:
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return  # too few brackets to nest that deep, whatever the strings hold
    depth = 0
    for match in _STRING_OR_BRACKET.finditer(raw):
        first = raw[match.start()]
        if first == _QUOTE:
            continue
        if first in _OPENERS:
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise InvalidRequestError(f"request body is nested more than {MAX_JSON_DEPTH} levels deep")
        else:
            depth -= 1


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _describe(exc: ValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    location = ".".join(str(part) for part in first["loc"] if not str(part).startswith("function-after"))
    message = first["msg"].removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
    return (f"{location}: {message}{more}" if location else f"{message}{more}"), location or None


def _decode_json(raw: bytes) -> dict[str, Any]:
    """A JSON object from a body, or a 400 saying what is wrong with it."""
    if not raw.strip():
        raise InvalidRequestError("request body is empty; expected a JSON object")
    _check_depth(raw)
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except ValueError as exc:  # also JSONDecodeError, UnicodeDecodeError, int digit limits
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRequestError("request body must be a JSON object")
    check_text_tree(data)
    return data


def read_model(raw: bytes, model: type[M]) -> M:
    """Parse and validate a JSON body; every failure is a 400 naming the offending field."""
    try:
        return model.model_validate(_decode_json(raw))
    except ValidationError as exc:
        message, param = _describe(exc)
        raise InvalidRequestError(message, param=param) from exc
