"""Reading query parameters: list pagination and whole numbers."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request

from cairn.errors import InvalidRequestError
from cairn.store.pages import Order, Page

__all__ = ["ListParams", "list_params", "metadata_filters", "page_body", "parse_count"]

# ASCII digits only: `str.isdigit()` and `int()` also take `²`, `①`, `١` or `1_0`.
_COUNT = re.compile(r"[0-9]{1,18}")


def parse_count(raw: str, name: str) -> int:
    """A query parameter that must be a whole number, 0 or more, written in ASCII digits."""
    if not _COUNT.fullmatch(raw):
        raise InvalidRequestError(f"{name} must be a whole number (ASCII digits), got {raw!r}", param=name)
    return int(raw)


class ListParams(BaseModel):
    after: str | None
    limit: int
    order: Order


def list_params(request: Request, *, default_order: Order = "desc") -> ListParams:
    query = request.query_params
    limit = parse_count(query.get("limit", "20"), "limit")
    if not 1 <= limit <= 100:
        raise InvalidRequestError("limit must be between 1 and 100", param="limit")
    order = query.get("order", default_order)
    if order not in ("asc", "desc"):
        raise InvalidRequestError("order must be 'asc' or 'desc'", param="order")
    after = query.get("after") or None
    return ListParams(after=after, limit=limit, order=order)  # type: ignore[arg-type]


def metadata_filters(request: Request, *, known: tuple[str, ...]) -> dict[str, str]:
    """The `metadata[KEY]=VALUE` filters of a list (at most 16, all must match); any other
    parameter than those and `known` is refused."""
    metadata = {}
    for key, value in request.query_params.multi_items():
        if key.startswith("metadata[") and key.endswith("]"):
            metadata[key[len("metadata[") : -1]] = value
        elif key not in ("after", "limit", "order", *known):
            raise InvalidRequestError(f"unknown query parameter {key!r}", param=key)
    if len(metadata) > 16:
        raise InvalidRequestError("at most 16 metadata filters", param="metadata")
    return metadata


def page_body(page: Page[Any], rendered: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "object": "list",
        "data": rendered,
        "first_id": rendered[0]["id"] if rendered else None,
        "last_id": rendered[-1]["id"] if rendered else None,
        "has_more": page.has_more,
    }
