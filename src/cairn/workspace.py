"""Where a session's workspace appears to the agent; shared by the sandbox, snapshots and engine."""

WORKSPACE_MOUNT = "/workspace"
