"""Renders a session's `agent.text.format` in the dialect of each OpenAI API.

The session stores the format as spec §3 writes it: `{"type": "text"}`, `{"type":
"json_object"}` or `{"type": "json_schema", "schema": {...}}` with optional `name` and
`strict`. The Responses API wants the schema flat under `text.format`; Chat Completions wants it
nested under `response_format.json_schema`. Plain text is the default of both APIs, so it is
not sent at all, which also keeps servers that lack `response_format` working.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from openai import Omit, omit
from openai.types.chat.completion_create_params import ResponseFormat
from openai.types.responses import ResponseTextConfigParam

from cairn.errors import ModelError

__all__ = ["chat_response_format", "responses_text_config"]

# OpenAI requires a name for a JSON schema format; the session format may leave it out.
_DEFAULT_SCHEMA_NAME = "output"


@dataclass(frozen=True, slots=True)
class _JsonSchema:
    name: str
    schema: dict[str, object]
    # The official client sends strict schemas (spec §6.3), so strict is the default here too.
    is_strict: bool


def responses_text_config(text_format: Mapping[str, Any] | None) -> ResponseTextConfigParam | Omit:
    """The `text` parameter of `responses.create`."""
    parsed = _parse(text_format)
    if parsed is None:
        return omit
    if parsed == "json_object":
        return {"format": {"type": "json_object"}}
    return {
        "format": {"type": "json_schema", "name": parsed.name, "schema": parsed.schema, "strict": parsed.is_strict}
    }


def chat_response_format(text_format: Mapping[str, Any] | None) -> ResponseFormat | Omit:
    """The `response_format` parameter of `chat.completions.create`."""
    parsed = _parse(text_format)
    if parsed is None:
        return omit
    if parsed == "json_object":
        return {"type": "json_object"}
    return {
        "type": "json_schema",
        "json_schema": {"name": parsed.name, "schema": parsed.schema, "strict": parsed.is_strict},
    }


def _parse(text_format: Mapping[str, Any] | None) -> _JsonSchema | Literal["json_object"] | None:
    kind = None if text_format is None else text_format.get("type")
    if text_format is None or kind == "text":
        return None
    if kind == "json_object":
        return "json_object"
    schema = text_format.get("schema")
    if kind != "json_schema" or not isinstance(schema, Mapping):
        raise ModelError(
            f"unsupported agent.text.format {dict(text_format)!r}: expected type text, json_object "
            "or json_schema with a schema object",
            code="invalid_request",
            param="agent.text.format",
            retryable=False,
        )
    return _JsonSchema(
        name=str(text_format.get("name", _DEFAULT_SCHEMA_NAME)),
        schema=dict(schema),
        is_strict=bool(text_format.get("strict", True)),
    )
