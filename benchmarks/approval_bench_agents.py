"""The operator agent of `benchmarks/approvals.py`, loaded with `--agents approval_bench_agents:registry`.

`deploy` needs approval and writes the time it starts (epoch seconds) to `CAIRN_BENCH_STARTS`.
"""

from __future__ import annotations

import os
import time

import cairn


@cairn.tool(needs_approval=True, side_effect=True)
def deploy(release: str) -> str:
    """Deploy a release."""
    with open(os.environ["CAIRN_BENCH_STARTS"], "a") as starts:
        starts.write(f"{time.time()}\n")
    return f"deployed:{release}"


registry = cairn.AgentRegistry()


@registry.agent("bench-agent/v1")
def bench_agent(deps: cairn.RuntimeDeps) -> cairn.Agent:
    return cairn.Agent(model="scripted:deploy", instructions="You deploy.", tools=[deploy])
