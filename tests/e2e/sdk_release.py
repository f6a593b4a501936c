"""The OpenAI Agents SDK's side of the ledger comparison (research/sdk.md §1): one approved
`RunState` given to two worker processes at once.

    python sdk_release.py pause STATE EFFECTS    # run until the approval, approve, store the state
    python sdk_release.py resume STATE EFFECTS   # a worker: load the approved state and run it

`deploy_release` appends a line to EFFECTS per real execution, as Cairn's test tools do. The
model is scripted (no network): it calls the tool, then answers.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner, RunState, function_tool
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText


class _Scripted(Model):
    """Calls `deploy_release` while the input has no tool output; answers after."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        answered = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in (input or []))
        output: list[Any]
        if not answered:
            output = [ResponseFunctionToolCall(type="function_call", id="fc_1", call_id="call_1", name="deploy_release",
                                               arguments='{"release": "r-42"}', status="completed")]
        else:
            output = [ResponseOutputMessage(id="msg_1", type="message", role="assistant", status="completed",
                                            content=[ResponseOutputText(type="output_text", text="released", annotations=[])])]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def _agent(effects: Path) -> Agent[Any]:
    @function_tool(needs_approval=True)
    def deploy_release(release: str) -> str:
        """Deploy a release to production."""
        with effects.open("a") as log:
            log.write(f"{release}\n")
        return f"deployed:{release}"

    return Agent(name="release-agent", model=_Scripted(), tools=[deploy_release])


async def _pause(state: Path, effects: Path) -> None:
    agent = _agent(effects)
    paused = await Runner.run(agent, "ship it", run_config=RunConfig(tracing_disabled=True))
    approved = paused.to_state()
    for interruption in approved.get_interruptions():
        approved.approve(interruption)
    state.write_text(json.dumps(approved.to_json()))


async def _resume(state: Path, effects: Path) -> None:
    agent = _agent(effects)
    loaded = await RunState.from_json(agent, json.loads(state.read_text()))
    await Runner.run(agent, loaded, run_config=RunConfig(tracing_disabled=True))


if __name__ == "__main__":
    command, state_path, effects_path = sys.argv[1:4]
    step = _pause if command == "pause" else _resume
    asyncio.run(step(Path(state_path), Path(effects_path)))
