"""Reading query parameters: list pagination and whole numbers."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request

from cairn.errors import InvalidRequestError
from cairn.store.pages import Order, Page

__all__ = ["ListParams", "known_params", "list_params", "metadata_filters", "page_body", "parse_count", "status_filter"]

S = TypeVar("S", bound=StrEnum)

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


def known_params(request: Request, *, known: tuple[str, ...] = ()) -> None:
    """Refuse any query parameter other than a list's (after, limit, order) and `known`."""
    for key in request.query_params:
        if key not in ("after", "limit", "order", *known):
            raise InvalidRequestError(f"unknown query parameter {key!r}", param=key)


def status_filter(request: Request, statuses: type[S]) -> S | None:
    """The list's optional `status=` filter, one of `statuses`."""
    status = request.query_params.get("status")
    if status is None:
        return None
    if status not in statuses.__members__.values():
        raise InvalidRequestError(f"status must be one of {', '.join(statuses)}", param="status")
    return statuses(status)


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
