"""The Agents API over HTTP: the app factory, routes, SSE framing and the error envelope."""
