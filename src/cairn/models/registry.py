"""Resolves a session's model name to a provider: `scripted:NAME`, `local:NAME`, `openai:NAME`
or a plain name (an OpenAI-compatible endpoint).

`check_model_name` runs when a session is created, so a typo or a missing endpoint is a
400 at once rather than a failed turn later. Providers are created per turn and closed
after it; the local model caches its loaded weights itself.
"""

from __future__ import annotations

from cairn.config import Settings
from cairn.errors import InvalidRequestError
from cairn.models.base import Model
from cairn.models.scripted import ScriptedModel, load_script

__all__ = ["check_model_name", "resolve_model"]


def _split(name: str) -> tuple[str, str]:
    provider, sep, rest = name.partition(":")
    if not sep:
        return "openai", name
    return provider, rest


def check_model_name(name: str, settings: Settings) -> None:
    """Refuse a model this server cannot run, without creating it (no clients are opened)."""
    _resolve(name, settings, create=False)


def resolve_model(name: str, settings: Settings) -> Model:
    model = _resolve(name, settings, create=True)
    assert model is not None
    return model


def _resolve(name: str, settings: Settings, *, create: bool) -> Model | None:
    provider, rest = _split(name)
    if not rest:
        raise InvalidRequestError(f"model name {name!r} is empty after its provider prefix", param="agent.model")
    if provider == "scripted":
        script = load_script(settings.scripts_dir, rest)
        return ScriptedModel(script, name=rest) if create else None
    if provider == "openai":
        _require_openai_endpoint(rest, settings)
        return _openai_model(settings) if create else None
    if provider == "local":
        # Creating a local model opens nothing: its weights load on first use.
        return _local_model(rest, settings)
    raise InvalidRequestError(
        f"unknown model provider {provider!r} in {name!r}: use scripted:, local:, openai: or a plain model name",
        param="agent.model",
    )


def _require_openai_endpoint(name: str, settings: Settings) -> None:
    if not settings.openai_api_key:
        raise InvalidRequestError(
            f"model {name!r} needs an OpenAI-compatible endpoint: set OPENAI_API_KEY (and OPENAI_BASE_URL "
            "for a non-OpenAI server), or use a scripted: or local: model",
            param="agent.model",
        )


def _openai_model(settings: Settings) -> Model:
    assert settings.openai_api_key is not None
    from cairn.models.openai import OpenAIModelConfig, create_openai_model

    return create_openai_model(
        OpenAIModelConfig(
            base_url=settings.openai_base_url,
            api_key=settings.openai_api_key,
            api="chat" if settings.openai_api == "chat" else "responses",
            timeout_s=600.0,
            max_retries=2,
        )
    )


def _local_model(name: str, settings: Settings) -> Model:
    from cairn.models.local import create_local_model

    return create_local_model(name, settings.data_dir / "models")
