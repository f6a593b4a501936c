"""Builds a command's environment from a fixed allowlist plus the session's `env`.

Nothing is copied from the server's own environment (design invariant 8: host secrets never
leak in); the few variables every shell tool expects are fixed values, and the session's
`env` is layered on top.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from cairn.errors import InvalidRequestError

__all__ = ["DEFAULT_PATH", "ENV_ISOLATION", "command_env"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def command_env(
    *, home: str, user: str, session_env: Mapping[str, str], tmpdir: str = "/tmp"
) -> dict[str, str]:
    """Return the complete environment for one command."""
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": home,
        "USER": user,
        "LOGNAME": user,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "TMPDIR": tmpdir,
    }
    for name, value in session_env.items():
        if not _NAME.fullmatch(name) or "\0" in value:
            raise InvalidRequestError(
                f"invalid environment variable {name!r}: names are [A-Za-z_][A-Za-z0-9_]* "
                "and values contain no NUL",
                param="env",
            )
        env[name] = value
    return env


# How every backend describes the environment it gives commands (for `isolation`).
ENV_ISOLATION = "fixed allowlist plus the session's env; nothing from the server"
