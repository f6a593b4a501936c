"""Checks Python files the local model writes, and undoes its one systematic escaping slip.

The model writes a file as a JSON string. Inside that string, a Python string literal
such as `"a\\nb"` needs its backslash doubled (`\\\\n` in JSON); the 1.5B model usually
writes JSON `\\n` instead, which decodes to a real line break in the middle of the literal.
The file is then a `SyntaxError` ("unterminated string literal"), and asked to fix it, the
model writes the same text again (measured on the tree.py tutorial: issue 6, docs/local-model.md).

What the model meant is unambiguous: the two characters backslash and `n`. So when, and
only when, a `.py` file's content does not compile *because* a string literal is
unterminated, `repair_python_escapes` puts those two characters back for every line
break that sits inside a single-quoted string literal, and the repair is used only if
the result compiles. Anything else is left to the model: `python_syntax_error` describes
the error so the provider can show it before the file is written.

Compiling never runs the code: `compile()` only parses and builds bytecode.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cairn.models.base import ToolSpec

__all__ = [
    "PythonSyntaxProblem",
    "ignored_arguments",
    "is_shell_commands",
    "python_syntax_error",
    "repair_python_escapes",
    "written_file",
    "written_python_file",
]

_log = logging.getLogger(__name__)

_PYTHON_SUFFIXES = (".py", ".pyw")
# CPython >= 3.10 says "unterminated string literal" / "unterminated f-string literal";
# older versions said "EOL while scanning string literal".
_UNTERMINATED = re.compile(r"unterminated (?:[a-z]+-)?string literal|EOL while scanning string literal")


@dataclass(frozen=True, slots=True)
class PythonSyntaxProblem:
    """Why a source does not compile: the message, the line number and that line's text."""

    message: str
    line_number: int | None
    line: str

    @property
    def is_unterminated_string(self) -> bool:
        return bool(_UNTERMINATED.search(self.message))

    def describe(self) -> str:
        where = f" on line {self.line_number}" if self.line_number else ""
        shown = f"\n    {self.line.strip()}" if self.line.strip() else ""
        return f"SyntaxError{where}: {self.message}{shown}"


def written_file(tool: ToolSpec | None, arguments: Mapping[str, Any]) -> tuple[str, str] | None:
    """`(path, content)` when this call saves a file with a tool that writes files.

    A tool writes files when it takes a `path` and a `content` (no tool name is assumed).
    """
    if tool is None:
        return None
    properties = (tool.parameters.get("properties") or {}).keys()
    if not {"path", "content"} <= set(properties):
        return None
    path, content = arguments.get("path"), arguments.get("content")
    if not isinstance(path, str) or not isinstance(content, str):
        return None
    return path, content


def written_python_file(tool: ToolSpec | None, arguments: Mapping[str, Any]) -> tuple[str, str] | None:
    """`(path, content)` when this call saves a Python file (a path ending in `.py`)."""
    written = written_file(tool, arguments)
    if written is None or not written[0].strip().lower().endswith(_PYTHON_SUFFIXES):
        return None
    return written


# Commands the model was seen writing into files instead of running them (mkdir lines as
# the "content" of /workspace/demo, a cp line as the content of the copy it was asked for).
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


def _escape_line_breaks_in_literals(source: str) -> str | None:
    """`source` with every line break inside a one-line string literal written as an escape.

    A small tokenizer for exactly this purpose: it knows comments, triple
    quotes (where line breaks are legal and kept) and backslash escapes (a backslash right
    before a line break is a legal continuation and is kept). Returns None when there was
    nothing to change.
    """
    out: list[str] = []
    changed = False
    i, n = 0, len(source)
    while i < n:
        ch = source[i]
        if ch == "#":
            end = source.find("\n", i)
            end = n if end < 0 else end
            out.append(source[i:end])
            i = end
            continue
        if ch not in "'\"":
            out.append(ch)
            i += 1
            continue
        triple = source[i : i + 3] == ch * 3
        quote = ch * 3 if triple else ch
        out.append(quote)
        i += len(quote)
        while i < n:
            c = source[i]
            if c == "\\" and i + 1 < n:
                out.append(source[i : i + 2])
                i += 2
                continue
            if source.startswith(quote, i):
                out.append(quote)
                i += len(quote)
                break
            if not triple and c in "\r\n":
                # What the model meant: the escape it wrote in JSON, not a line break.
                out.append("\\n" if c == "\n" else "\\r")
                changed = True
            else:
                out.append(c)
            i += 1
    return "".join(out) if changed else None


def repair_python_escapes(source: str, filename: str = "<file>") -> str | None:
    """The source the model meant, if its only slip was JSON escapes in string literals.

    Returns None (use the source as written) unless all of these hold: the source does not
    compile, the compiler's complaint is an unterminated string literal, and the source
    with the line breaks inside one-line string literals escaped compiles.
    """
    problem = python_syntax_error(source, filename)
    if problem is None or not problem.is_unterminated_string:
        return None
    repaired = _escape_line_breaks_in_literals(source)
    if repaired is None or python_syntax_error(repaired, filename) is not None:
        return None
    return repaired



# How a Python program reads its command line; a file with none of these ignores it.
_READS_ARGUMENTS = re.compile(r"\b(?:sys\.argv|argv|argparse|getopt|optparse|click|typer|docopt|fire)\b")
_PYTHON_COMMAND = re.compile(r"(?:.*/)?python(?:3(?:\.\d+)?)?")
_SHELL_OPERATORS = frozenset({"&&", "||", ";", "|", "&", ">", ">>", "<", "2>", "2>&1", "(", ")"})


def _python_runs(command: str, depth: int = 0) -> list[tuple[str, list[str]]]:
    """`(script, arguments)` for each `python3 script.py args…` in a shell command line.

    A `sh -c '…'` wrapper (seen: the model wraps commands in one) is looked into once.
    """
    try:
        words = shlex.split(command, posix=True)
    except ValueError:
        return []
    runs = []
    for index, word in enumerate(words):
        if word == "-c" and depth == 0 and index > 0 and words[index - 1].endswith("sh") and index + 1 < len(words):
            runs += _python_runs(words[index + 1], depth + 1)
        if _PYTHON_COMMAND.fullmatch(word) and index + 1 < len(words) and words[index + 1].endswith(_PYTHON_SUFFIXES):
            arguments = []
            for argument in words[index + 2 :]:
                if argument in _SHELL_OPERATORS:
                    break
                arguments.append(argument)
            runs.append((words[index + 1], arguments))
    return runs


def ignored_arguments(command: str, source_of: Callable[[str], str | None]) -> list[tuple[str, list[str]]]:
    """The Python scripts `command` runs with arguments although their source never reads any.

    `source_of(path)` is what the conversation last saved at that path (None if unknown).
    Measured: asked to add an option, the model added a parameter and called the function
    with a fixed value; the run exited 0 and the option silently did nothing.
    """
    ignored = []
    for script, arguments in _python_runs(command):
        source = source_of(script)
        if arguments and source is not None and not _READS_ARGUMENTS.search(source):
            ignored.append((script, arguments))
    return ignored
