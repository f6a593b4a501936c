"""Request bodies of the Agents API (spec §2.1, §3.3-3.5, §5) as strict pydantic models.

Unknown keys are errors (a silently dropped field is a bug the caller never sees), types
are strict (`"true"` is not a boolean, `"5"` not a number), names and ids refuse control
characters, and features of the spec that Cairn does not provide are refused with a message
that names them, rather than accepted and ignored. Text validity (no lone surrogates) and
nesting depth are checked before these models see a body (`cairn.api.json_body`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from cairn.api.text import describe_control
from cairn.errors import InvalidRequestError
from cairn.sandbox.egress import NetworkPolicy

__all__ = [
    "ApproveBody",
    "CreateSessionBody",
    "EventsBody",
    "InputMessage",
    "Metadata",
    "Name",
    "NulFree",
    "RejectBody",
    "RevokeBody",
    "StrictBody",
    "UpdateSessionBody",
    "check_metadata",
]

_ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


def _no_control(value: str) -> str:
    problem = describe_control(value)
    if problem is not None:
        raise ValueError(f"must not contain a {problem}")
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL (U+0000)")
    return value


# A name or id: models, metadata keys, variable names, paths, ids of turns and calls.
Name = Annotated[str, AfterValidator(_no_control)]
# Text handed to the OS or to a database text column, which cannot hold NUL.
NulFree = Annotated[str, AfterValidator(_no_nul)]


class StrictBody(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class InputText(StrictBody):
    type: Literal["input_text"]
    text: str


class InputImage(StrictBody):
    type: Literal["input_image"]
    image_url: str = Field(min_length=1)


InputContent = Annotated[InputText | InputImage, Field(discriminator="type")]


class InputMessage(StrictBody):
    role: Literal["user"]
    content: list[InputContent] = Field(min_length=1)
    type: Literal["message"] | None = None


class FunctionTool(StrictBody):
    type: Literal["function"]
    name: _ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None
    async_: bool | None = Field(default=None, alias="async")


def _refuse_unsupported_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    checked = []
    for index, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise ValueError(f"tools[{index}]: tool type {kind!r} is not supported by Cairn (use function tools)")
        checked.append(FunctionTool.model_validate(tool).model_dump(exclude_none=True, by_alias=True))
    return checked


class Reasoning(StrictBody):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["concise", "detailed", "auto"] | None = None


class TextConfig(StrictBody):
    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type") not in ("text", "json_schema"):
            raise ValueError("text.format.type must be 'text' or 'json_schema'")
        if value is not None and value.get("type") == "json_schema" and not isinstance(value.get("schema"), dict):
            raise ValueError("text.format of type json_schema needs a `schema` object")
        return value


class MultiAgent(StrictBody):
    enabled: bool
    max_concurrent_subagents: int | None = None

    @field_validator("enabled")
    @classmethod
    def _off(cls, value: bool) -> bool:
        if value:
            raise ValueError("multi-agent sessions (subagents) are not supported by Cairn yet")
        return value


class AgentConfig(StrictBody):
    # Required unless the session names a registered agent (`agent_id`), whose model it overrides.
    model: Name | None = Field(default=None, min_length=1, max_length=256)
    instructions: str | None = None
    multi_agent: MultiAgent | None = None
    reasoning: Reasoning | None = None
    service_tier: Literal["auto", "default", "flex", "priority", "fast", "ultrafast"] | None = None
    text: TextConfig | None = None
    tools: list[dict[str, Any]] | None = None
    compaction: dict[str, Any] | None = None
    experimental: dict[str, Any] | None = None

    _tools = field_validator("tools")(_refuse_unsupported_tools)


class Network(StrictBody):
    access: Literal["enabled", "disabled", "restricted"] = "disabled"
    allowed_domains: list[str] | None = None
    blocked_domains: list[str] | None = None

    @model_validator(mode="after")
    def _valid_policy(self) -> Network:
        """The domain lists parse, and fit the access (the egress proxy's rules: `NetworkPolicy`)."""
        if self.access == "disabled" and (self.allowed_domains or self.blocked_domains):
            raise ValueError("domain lists need network access 'restricted' (or 'enabled' for blocked_domains)")
        try:
            NetworkPolicy.from_environment(self.model_dump())
        except InvalidRequestError as exc:
            raise ValueError(f"{exc.param}: {exc.message}") from exc
        return self


class InlineFile(StrictBody):
    type: Literal["inline"]
    data: str
    # The workspace checks each component's length (`workspace_relative`); this bounds the whole.
    path: Name = Field(min_length=1, max_length=4096)


class HostedEnvironment(StrictBody):
    type: Literal["openai_hosted"]
    env: dict[Name, NulFree] | None = None
    network: Network | None = None
    files: list[InlineFile] | None = None
    container_size: Literal["small", "medium", "large"] | None = None
    environment_id: str | None = None
    environment_template_id: str | None = None
    capability_directories: list[Any] | None = None
    desktop: dict[str, Any] | None = None
    packages: dict[str, Any] | None = None
    plugins: list[Any] | None = None
    setup_commands: list[Any] | None = None
    skills: list[Any] | None = None

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> HostedEnvironment:
        for name in (
            "environment_id",
            "environment_template_id",
            "capability_directories",
            "desktop",
            "packages",
            "plugins",
            "setup_commands",
            "skills",
        ):
            if getattr(self, name):
                raise ValueError(f"environment.{name} is not supported by Cairn yet")
        for key in self.env or {}:
            if not key or "=" in key:
                raise ValueError(f"environment.env: bad variable name {key!r}")
        return self


class NoEnvironment(StrictBody):
    type: Literal["none"]


class SelfHostedEnvironment(StrictBody):
    type: Literal["self_hosted"]
    workspace_directory: Name
    capability_directories: list[Name] | None = None

    @model_validator(mode="after")
    def _refuse(self) -> SelfHostedEnvironment:
        raise ValueError("self_hosted environments are not supported: Cairn hosts the sandbox (use openai_hosted)")


Environment = Annotated[HostedEnvironment | NoEnvironment | SelfHostedEnvironment, Field(discriminator="type")]


Metadata = dict[Name, NulFree]


def check_metadata(value: Metadata | None) -> Metadata | None:
    if value is None:
        return None
    if len(value) > 16:
        raise ValueError("metadata holds at most 16 pairs")
    for key, item in value.items():
        if len(key) > 64 or len(item) > 512:
            raise ValueError("metadata keys are at most 64 characters and values at most 512")
    return value


class StreamOptions(StrictBody):
    include_obfuscation: bool | None = None


class PromptCacheOptions(StrictBody):
    ttl: Literal["30m", "12h"]


class SpendControl(StrictBody):
    limit: int | None = None


class CreateSessionBody(StrictBody):
    environment: Environment
    agent: AgentConfig | None = None
    # A registered agent (`cairn serve --agents`): its newest version, pinned; `agent` overrides its fields.
    agent_id: Name | None = Field(default=None, min_length=1, max_length=64)
    input: str | list[InputMessage] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    metadata: Metadata | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    review: Literal["none", "auto_review"] | None = None
    spend_control: SpendControl | None = None
    # The tenant's vaults whose credentials the session's turns get (docs/security.md).
    vault_ids: list[Annotated[Name, StringConstraints(min_length=1, max_length=64)]] | None = Field(default=None, max_length=10)

    _metadata = field_validator("metadata")(check_metadata)

    @field_validator("vault_ids")
    @classmethod
    def _distinct(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("names a vault twice")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> CreateSessionBody:
        if self.agent_id is None and (self.agent is None or self.agent.model is None):
            raise ValueError("`agent` with a `model` is required (or `agent_id`, the id of a registered agent)")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is allowed only with stream: true")
        if self.environment.type == "none" and not self.input:
            raise ValueError("input is required when environment.type is 'none'")
        if self.stream and not self.input:
            raise ValueError("input is required with stream: true")
        return self

    def input_messages(self) -> list[dict[str, Any]]:
        """`input` normalised to a list of messages (a string is one user text message)."""
        if self.input is None or self.input == "":
            return []
        if isinstance(self.input, str):
            return [{"role": "user", "content": [{"type": "input_text", "text": self.input}]}]
        return [m.model_dump(exclude_none=True) for m in self.input]


class UpdateAgent(StrictBody):
    model: Name | None = Field(default=None, min_length=1, max_length=256)
    reasoning: Reasoning | None = None
    service_tier: Literal["auto", "default", "flex", "priority", "fast", "ultrafast"] | None = None
    tools: list[dict[str, Any]] | None = None

    _tools = field_validator("tools")(_refuse_unsupported_tools)


class UpdateSessionBody(StrictBody):
    agent: UpdateAgent | None = None
    metadata: Metadata | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    review: Literal["none", "auto_review"] | None = None
    spend_control: SpendControl | None = None

    _metadata = field_validator("metadata")(check_metadata)


class MessageEvent(StrictBody):
    type: Literal["agent.session.input.message"]
    input: list[InputMessage] = Field(min_length=1)


class CancelEvent(StrictBody):
    type: Literal["agent.session.input.cancel"]


class ToolResultEvent(StrictBody):
    type: Literal["agent.session.input.tool_result"]
    turn_id: Name = Field(min_length=1, max_length=64)
    call_id: Name = Field(min_length=1, max_length=128)
    success: bool
    output: str | list[InputContent] | None = None
    error: str | None = None


class McpApprovalResponse(StrictBody):
    type: Literal["mcp_tool_call"]
    decision: Literal["approve", "deny", "cancel"]


class McpApprovalResultEvent(StrictBody):
    """A decision on an `mcp_approval_request` (spec §5): `cancel` dismisses the request, and
    the call does not run; the turn goes on."""

    type: Literal["agent.session.input.mcp_approval_request_result"]
    request_id: Name = Field(min_length=1, max_length=64)
    response: McpApprovalResponse


InputEvent = Annotated[MessageEvent | CancelEvent | ToolResultEvent | McpApprovalResultEvent, Field(discriminator="type")]


class EventsBody(StrictBody):
    events: list[InputEvent] = Field(min_length=1, max_length=64)


# Bodies of `/v1/approvals/{id}/…` (docs/approvals.md).


class ApproveBody(StrictBody):
    # The digest the approver was shown: approving binds to exactly that call.
    arguments_digest: str = Field(pattern=r"^[0-9a-f]{64}$")


class RejectBody(StrictBody):
    # What the model is told, as the call's result.
    message: NulFree | None = Field(default=None, max_length=4096)


class RevokeBody(StrictBody):
    reason: NulFree | None = Field(default=None, max_length=4096)


# Body of `POST /v1/ledger/{operation_key}/resolve` (docs/ledger.md): exactly one of them.


class ResolveBody(StrictBody):
    # It happened: the call's result (what the tool would have returned).
    succeeded: NulFree | None = None
    # It did not happen, or failed: the call's error, as the model is told.
    failed: NulFree | None = Field(default=None, max_length=4096)

    @model_validator(mode="after")
    def _one_outcome(self) -> ResolveBody:
        if (self.succeeded is None) == (self.failed is None):
            raise ValueError("give exactly one of succeeded (the result) and failed (the error message)")
        return self
