"""The operator agent of the secrets end-to-end tests, loaded with `--agents secrets_agents:registry`.

Its tools use the session's credentials the way careless operator code would: `use_token`
(needs an approval) sends the `deploy-token` bearer, logs it and returns it in its result;
`show_api_key` returns the `api-key` variable's value; `fail_with_token` raises with the token
in its message. What each execution really received is proven without storing it: `use_token`
appends the SHA-256 of the token it got to the file named by `CAIRN_TEST_DEPLOYS`, outside any
data dir. The registry's runtime dependency `deploy_client` holds the password named by
`CAIRN_TEST_DEPS_PASSWORD`, which `use_token` uses and nothing may store. `open_ticket` keeps a
ticket in the run's context (declared), which `use_token` records after the resume; `keep_token`
puts the token there, which a pause must refuse.
"""

from __future__ import annotations

import hashlib
import logging
import os

import cairn

log = logging.getLogger("secrets_agents")


@cairn.tool(needs_approval=True, side_effect=True, approvers=["approver", "admin"])
async def use_token(ctx: cairn.ToolContext, target: str) -> str:
    """Call the deploy API of a target with the deploy token."""
    credential = ctx.credentials["deploy-token"]
    assert isinstance(credential, cairn.StaticBearer)
    client = ctx.deps["deploy_client"]
    ticket = ctx.context.get("ticket", "none")
    with open(os.environ["CAIRN_TEST_DEPLOYS"], "a") as deploys:
        deploys.write(f"{target} {hashlib.sha256(credential.token.encode()).hexdigest()} {client.login()} {ticket}\n")
    log.warning("calling %s with Authorization: Bearer %s", target, credential.token)
    return f"called {target} with Authorization: Bearer {credential.token}"


@cairn.tool
async def open_ticket(ctx: cairn.ToolContext, title: str) -> str:
    """Open a change ticket, kept in the run's context for the deploy."""
    ctx.context["ticket"] = f"T-{len(title)}"
    return f"opened {ctx.context['ticket']}"


@cairn.tool
async def keep_token(ctx: cairn.ToolContext) -> str:
    """Keep the deploy token in the run's context (what the Agents SDK would store in clear)."""
    credential = ctx.credentials["deploy-token"]
    assert isinstance(credential, cairn.StaticBearer)
    ctx.context["ticket"] = credential.token
    return "kept"


@cairn.tool
async def show_api_key(ctx: cairn.ToolContext) -> str:
    """Show the API key the sandbox's variable stands for."""
    credential = ctx.credentials["api-key"]
    assert isinstance(credential, cairn.EnvironmentVariable)
    return f"{credential.env_name} is {credential.value} (the sandbox sees {credential.placeholder})"


@cairn.tool
async def fail_with_token(ctx: cairn.ToolContext) -> str:
    """Fail, quoting the deploy token."""
    credential = ctx.credentials["deploy-token"]
    assert isinstance(credential, cairn.StaticBearer)
    raise RuntimeError(f"the deploy API refused token {credential.token}")


class DeployClient:
    """An operator's client: it holds a password and lives in the worker's deps only."""

    def __init__(self, password: str) -> None:
        self._password = password

    def login(self) -> str:
        return hashlib.sha256(self._password.encode()).hexdigest()[:12]


registry = cairn.AgentRegistry(deps=lambda: {"deploy_client": DeployClient(os.environ["CAIRN_TEST_DEPS_PASSWORD"])})


@registry.agent("secrets-agent/v1")
def secrets_agent_v1(deps: cairn.RuntimeDeps) -> cairn.Agent:
    return cairn.Agent(model="scripted:echo", instructions="You deploy with credentials.",
                       tools=[use_token, show_api_key, fail_with_token, open_ticket, keep_token, "shell"],
                       context={"ticket": str})
