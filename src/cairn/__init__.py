"""Cairn: a self-hosted, durable runtime for LLM agents that work in sandboxed workspaces."""

__version__ = "0.1.0"
