"""Reading requests: JSON bodies (size-limited, validated) and list parameters."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from cairn.errors import InvalidRequestError, PayloadTooLargeError
from cairn.store.pages import Order, Page

__all__ = ["ListParams", "list_params", "page_body", "read_body", "read_model"]

M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLargeError(f"request body is {declared} bytes; the limit is {max_bytes}")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLargeError(f"request body exceeds the limit of {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _describe(exc: ValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    location = ".".join(str(part) for part in first["loc"] if not str(part).startswith("function-after"))
    message = first["msg"].removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else ""
    return (f"{location}: {message}{more}" if location else f"{message}{more}"), location or None


def read_model(raw: bytes, model: type[M]) -> M:
    """Parse and validate a JSON body; every failure is a 400 naming the offending field."""
    if not raw.strip():
        raise InvalidRequestError("request body is empty; expected a JSON object")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidRequestError("request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = _describe(exc)
        raise InvalidRequestError(message, param=param) from exc


class ListParams(BaseModel):
    after: str | None
    limit: int
    order: Order


def list_params(request: Request, *, default_order: Order = "desc") -> ListParams:
    query = request.query_params
    limit_raw = query.get("limit", "20")
    try:
        limit = int(limit_raw)
    except ValueError:
        raise InvalidRequestError(f"limit must be an integer, got {limit_raw!r}", param="limit") from None
    if not 1 <= limit <= 100:
        raise InvalidRequestError("limit must be between 1 and 100", param="limit")
    order = query.get("order", default_order)
    if order not in ("asc", "desc"):
        raise InvalidRequestError("order must be 'asc' or 'desc'", param="order")
    after = query.get("after") or None
    return ListParams(after=after, limit=limit, order=order)  # type: ignore[arg-type]


def page_body(page: Page[Any], rendered: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "object": "list",
        "data": rendered,
        "first_id": rendered[0]["id"] if rendered else None,
        "last_id": rendered[-1]["id"] if rendered else None,
        "has_more": page.has_more,
    }
