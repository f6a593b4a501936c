"""The `openai:` model provider: any OpenAI-compatible endpoint through the official client.

One `OpenAIModel` wraps one `AsyncOpenAI` client and speaks either the Responses API or Chat
Completions, as configured; most self-hosted servers speak only the latter. Everything the
provider knows comes from `OpenAIModelConfig`: it reads no environment variables, and it pins
the base URL so the client cannot pick one up from `OPENAI_BASE_URL` either. The API key never
appears in a repr, so a logged config holds no secret (design invariant 6).

Every `openai` exception is translated here, at the boundary, into a `ModelError` with a turn
error code (spec §3.6) and a `retryable` hint; `docs/models.md` lists the mapping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

import openai

from cairn.errors import CairnMisuseError
from cairn.models._openai_calls import RAW_ARGUMENTS_KEY
from cairn.models._openai_chat import stream_chat_step
from cairn.models._openai_errors import model_error_from_openai
from cairn.models._openai_responses import stream_responses_step
from cairn.models.base import Model, ModelEvent, ModelRequest

__all__ = ["RAW_ARGUMENTS_KEY", "OpenAIApi", "OpenAIModel", "OpenAIModelConfig", "create_openai_model"]

OpenAIApi = Literal["responses", "chat"]

OPENAI_BASE_URL = "https://api.openai.com/v1"
_MODEL_PREFIX = "openai:"

_Step = Callable[[openai.AsyncOpenAI, ModelRequest, str], AsyncIterator[ModelEvent]]
_STEPS: dict[str, _Step] = {"responses": stream_responses_step, "chat": stream_chat_step}


@dataclass(frozen=True, slots=True)
class OpenAIModelConfig:
    """How to reach one OpenAI-compatible endpoint.

    `base_url` None means OpenAI itself. `timeout_s` bounds each network wait (connecting, and
    each gap between streamed chunks), not the whole step. `max_retries` is spent by the
    client on connection errors, 408, 409, 429 and 5xx before a `ModelError` is raised.
    """

    base_url: str | None
    api_key: str = field(repr=False)
    api: OpenAIApi = "responses"
    timeout_s: float = 600.0
    max_retries: int = 2

    def __post_init__(self) -> None:
        # Settings may arrive as untyped strings, and a wrong `api` would otherwise only
        # surface at the first turn.
        if self.api not in _STEPS:
            raise CairnMisuseError(f"OpenAIModelConfig.api must be one of {sorted(_STEPS)}, not {self.api!r}")
        if self.timeout_s <= 0 or self.max_retries < 0:
            raise CairnMisuseError("OpenAIModelConfig needs timeout_s > 0 and max_retries >= 0")


class OpenAIModel(Model):
    """A `Model` over one `AsyncOpenAI` client; built by `create_openai_model`.

    Function-call arguments that are not a JSON object reach the engine as
    `{RAW_ARGUMENTS_KEY: <text>}` instead of failing the step (see `_openai_calls`).
    """

    def __init__(self, client: openai.AsyncOpenAI, *, api: OpenAIApi) -> None:
        self._client = client
        self._step = _STEPS[api]

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        model = request.model.removeprefix(_MODEL_PREFIX)
        try:
            async for event in self._step(self._client, request, model):
                yield event
        except openai.OpenAIError as err:
            raise model_error_from_openai(err) from err

    async def aclose(self) -> None:
        await self._client.close()


def create_openai_model(config: OpenAIModelConfig) -> OpenAIModel:
    """Build the provider for `config`; the only place a client is configured."""
    client = openai.AsyncOpenAI(
        api_key=config.api_key,
        base_url=config.base_url if config.base_url is not None else OPENAI_BASE_URL,
        timeout=config.timeout_s,
        max_retries=config.max_retries,
    )
    return OpenAIModel(client, api=config.api)
