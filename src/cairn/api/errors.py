"""The error envelope of spec §1.5, rendered in exactly one place.

Handlers are registered once by `create_app`: for `CairnError` (by its fields), for
Starlette's `HTTPException` (unknown routes, wrong methods) and a last-resort 500 that
logs the exception and says nothing internal to the caller.
"""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from cairn.errors import CairnError, ConflictError

__all__ = ["EXCEPTION_HANDLERS", "error_response"]

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
          405: "invalid_request_error", 409: "conflict_error", 413: "invalid_request_error", 415: "invalid_request_error"}


def error_response(
    status: int, message: str, *, type_: str | None = None, code: str | None = None, param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": type_ or _TYPES.get(status, "server_error"), "code": code, "param": param}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _cairn_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, CairnError)
    headers: dict[str, str] = {}
    if exc.http_status >= 500:
        log.error("%s %s failed: %s", request.method, request.url.path, exc.message, exc_info=exc)
    if exc.retryable is False:
        # The official client retries 409 and 5xx unless told not to (spec §1.6).
        headers["x-should-retry"] = "false"
    if isinstance(exc, ConflictError) and "retry_after_ms" in exc.context:
        headers["retry-after-ms"] = str(exc.context["retry_after_ms"])
    return error_response(exc.http_status, exc.message, type_=exc.error_type, code=exc.code, param=exc.param, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = {404: f"Unknown path {request.url.path}", 405: f"Method {request.method} is not allowed on {request.url.path}"}
    return error_response(exc.status_code, message.get(exc.status_code, str(exc.detail)), headers=dict(exc.headers or {}))


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("%s %s raised", request.method, request.url.path, exc_info=exc)
    return error_response(500, "The server had an internal error; it has been logged.", code="internal_error")


EXCEPTION_HANDLERS = {CairnError: _cairn_error, HTTPException: _http_error, Exception: _unexpected}
