"""The agent loop and everything a turn does: tools, workspaces, events, lifecycle transitions."""
