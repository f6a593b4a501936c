"""The checks applied to the files the local model writes and the commands it runs."""

from __future__ import annotations

from cairn.models.base import ToolSpec
from cairn.models.local._code_check import (
    is_python_file,
    is_shell_commands,
    python_syntax_error,
    written_file,
)

WRITER = ToolSpec(
    "write_file",
    "Save a file.",
    {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
    "workspace",
)
RUNNER = ToolSpec("shell", "Run.", {"type": "object", "properties": {"command": {"type": "string"}}}, "workspace")


def test_the_syntax_problem_names_the_line() -> None:
    problem = python_syntax_error('x = 1\nprint("a\nb")\n')
    assert problem is not None
    assert problem.line_number == 2
    assert problem.describe().startswith("SyntaxError on line 2: unterminated string literal")
    assert 'print("a' in problem.describe()
    assert python_syntax_error("x = 1\n") is None


def test_only_files_saved_by_a_file_writing_tool_are_checked_and_python_by_its_name() -> None:
    assert written_file(WRITER, {"path": "/workspace/main.py", "content": "x"}) == ("/workspace/main.py", "x")
    assert written_file(RUNNER, {"command": "python3 main.py"}) is None
    assert written_file(None, {"path": "a.py", "content": "x"}) is None
    assert written_file(WRITER, {"path": "a.py", "content": 3}) is None
    assert is_python_file("/workspace/main.py") and not is_python_file("notes.txt")


def test_shell_commands_saved_as_a_file_are_recognized() -> None:
    assert is_shell_commands("/workspace/dist/main.py", "cp /workspace/main.py /workspace/dist/main.py")
    assert is_shell_commands("/workspace/data", "mkdir data\nmkdir data/a\n\ncd data\necho 'x' > f\n")
    assert not is_shell_commands("setup.sh", "mkdir data\n")  # a shell script is meant to hold them
    assert not is_shell_commands("run", "#!/bin/sh\nmkdir data\n")
    assert not is_shell_commands("notes.txt", "mkdir is the command that makes folders\nand more")
    assert not is_shell_commands("main.py", "import os\nprint(os.getcwd())\n")
    assert not is_shell_commands("empty.txt", "")
