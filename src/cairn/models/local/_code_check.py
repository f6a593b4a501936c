"""Checks the files the local model saves with a file-writing tool, before they are written.

A `.py` file it saves is compiled first (`python_syntax_error`; compiling only parses and
builds bytecode, it never runs the code), so the provider can show it the error before
the file is written. A file holding nothing but shell commands was meant to be run, not
saved (`is_shell_commands`): commands belong to the tool that runs them. Both were measured
in development (issue 6, docs/local-model.md). Neither looks at what the file is for.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cairn.models.base import ToolSpec
from cairn.models.local._tool_roles import writes_files

__all__ = [
    "PythonSyntaxProblem",
    "is_shell_commands",
    "is_python_file",
    "python_syntax_error",
    "written_file",
]

_log = logging.getLogger(__name__)

_PYTHON_SUFFIXES = (".py", ".pyw")


@dataclass(frozen=True, slots=True)
class PythonSyntaxProblem:
    """Why a source does not compile: the message, the line number and that line's text."""

    message: str
    line_number: int | None
    line: str

    def describe(self) -> str:
        where = f" on line {self.line_number}" if self.line_number else ""
        shown = f"\n    {self.line.strip()}" if self.line.strip() else ""
        return f"SyntaxError{where}: {self.message}{shown}"


def written_file(tool: ToolSpec | None, arguments: Mapping[str, Any]) -> tuple[str, str] | None:
    """`(path, content)` when this call saves a file with a tool that writes files.

    A tool writes files when it takes a `path` and a `content` (`writes_files`).
    """
    if tool is None or not writes_files(tool):
        return None
    path, content = arguments.get("path"), arguments.get("content")
    if not isinstance(path, str) or not isinstance(content, str):
        return None
    return path, content


def is_python_file(path: str) -> bool:
    return path.strip().lower().endswith(_PYTHON_SUFFIXES)


# Commands the model was seen writing into files instead of running them (mkdir lines saved
# as a file at the path of the directory they make, a cp line as the content of the copy).
_SHELL_WORDS = frozenset(
    {"cd", "chmod", "cp", "echo", "ln", "ls", "mkdir", "mv", "pip", "pip3", "python", "python3", "rm", "sh", "touch"}
)
_SCRIPT_SUFFIXES = (".sh", ".bash", ".zsh")


def is_shell_commands(path: str, content: str) -> bool:
    """Whether `content` is a list of shell commands being saved into a file that is no script.

    True only when every non-blank line starts with a common command and the file is not a
    shell script (no script suffix, no `#!` line): such a file was meant to be run.
    """
    if path.strip().lower().endswith(_SCRIPT_SUFFIXES) or content.lstrip().startswith("#!"):
        return False
    lines = [line.split() for line in content.splitlines() if line.strip()]
    return bool(lines) and all(words[0] in _SHELL_WORDS for words in lines)


def python_syntax_error(source: str, filename: str = "<file>") -> PythonSyntaxProblem | None:
    """The reason `source` does not compile as Python, or None when it compiles.

    A source too deeply nested for the compiler is reported as fine: it is a limit of this
    check, not evidence of a mistake, and running the file will tell the model the truth.
    """
    try:
        compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as exc:
        lines = source.splitlines()
        number = exc.lineno
        line = lines[number - 1] if number is not None and 0 < number <= len(lines) else (exc.text or "")
        return PythonSyntaxProblem(exc.msg, number, line)
    except ValueError as exc:  # e.g. "source code string cannot contain null bytes"
        return PythonSyntaxProblem(str(exc), None, "")
    except (RecursionError, MemoryError) as exc:
        _log.warning("local model: could not check %s for syntax errors (%s); treating it as valid", filename, exc)
        return None
    return None
