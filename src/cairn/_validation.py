"""One wording for arguments a tool's schema refuses, whoever defined the tool.

The model reads this text as the call's error and fixes its next call from it, so every
problem is named with the path of the argument it concerns.
"""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["validation_problems"]


def validation_problems(exc: ValidationError) -> str:
    """Every problem of `exc`, as `path: message` joined by "; "."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
