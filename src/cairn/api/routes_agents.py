"""`/v1/agents`: the operator's registered agents, as saved agents of the Agents API (spec
§2.3, §3.2).

An agent's id is its name (`release-agent`); it shows its newest version (whose model,
instructions and tools a new session gets) and every loaded version with its revision. They
are the deployment's code, loaded from `--agents MODULE:ATTR`, so every tenant sees the same
ones, and they cannot be created, changed or deleted over HTTP.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cairn.api.context import request_context
from cairn.api.params import known_params, list_params, page_body
from cairn.errors import InvalidRequestError, NotFoundError
from cairn.operator import LoadedAgent
from cairn.store.pages import Page

__all__ = ["render_agent", "routes"]


def render_agent(versions: list[LoadedAgent]) -> dict[str, Any]:
    """A saved `Agent` (spec §3.2) from the versions of one name, oldest first; Cairn adds the
    newest `version` and `revision`, and `versions`."""
    newest = versions[-1]
    return {
        "id": newest.name,
        "object": "agent",
        "created_at": int(min(v.loaded_at for v in versions)),
        "updated_at": int(max(v.loaded_at for v in versions)),
        "name": newest.name,
        "instructions": newest.agent.instructions,
        "metadata": {},
        "model": newest.agent.model,
        "multi_agent": {"enabled": False, "max_concurrent_subagents": None},
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "auto",
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tools": newest.function_tools(),
        "version": newest.version,
        "revision": newest.revision,
        "versions": [v.describe() for v in versions],
    }


async def list_agents(request: Request) -> Response:
    ctx = await request_context(request)
    params = list_params(request)
    known_params(request)
    agents = ctx.runtime.agents
    names = agents.names() if params.order == "asc" else agents.names()[::-1]
    if params.after is not None:
        if params.after not in names:
            raise InvalidRequestError(f"unknown agent id in `after`: {params.after}", param="after")
        names = names[names.index(params.after) + 1 :]
    page = Page(names[: params.limit], has_more=len(names) > params.limit)
    return JSONResponse(page_body(page, [render_agent(agents.versions(name)) for name in page.data]))


async def retrieve_agent(request: Request) -> Response:
    ctx = await request_context(request)
    agent_id = request.path_params["agent_id"]
    versions = ctx.runtime.agents.versions(agent_id)
    if not versions:
        raise NotFoundError(f"No agent found with id '{agent_id}'.", param="agent_id")
    return JSONResponse(render_agent(versions))


# After the session routes: `/v1/agents/sessions` is not an agent's id.
routes = [
    Route("/v1/agents", list_agents, methods=["GET"]),
    Route("/v1/agents/{agent_id}", retrieve_agent, methods=["GET"]),
]
