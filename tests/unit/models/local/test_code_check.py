"""The checks applied to the files the local model writes and the commands it runs."""

from __future__ import annotations

from cairn.models.local._code_check import (
    ignored_arguments,
    is_python_file,
    is_shell_commands,
    python_syntax_error,
    written_file,
)
from cairn.models.base import ToolSpec

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
    assert written_file(WRITER, {"path": "/workspace/tree.py", "content": "x"}) == ("/workspace/tree.py", "x")
    assert written_file(RUNNER, {"command": "python3 tree.py"}) is None
    assert written_file(None, {"path": "a.py", "content": "x"}) is None
    assert written_file(WRITER, {"path": "a.py", "content": 3}) is None
    assert is_python_file("/workspace/tree.py") and not is_python_file("notes.txt")


def test_shell_commands_saved_as_a_file_are_recognized() -> None:
    assert is_shell_commands("/workspace/outputs/tree.py", "cp /workspace/tree.py /workspace/outputs/tree.py")
    assert is_shell_commands("/workspace/demo", "mkdir demo\nmkdir demo/a\n\ncd demo\necho 'x' > f\n")
    assert not is_shell_commands("setup.sh", "mkdir demo\n")  # a shell script is meant to hold them
    assert not is_shell_commands("run", "#!/bin/sh\nmkdir demo\n")
    assert not is_shell_commands("notes.txt", "mkdir is the command that makes folders\nand more")
    assert not is_shell_commands("tree.py", "import os\nprint(os.getcwd())\n")
    assert not is_shell_commands("empty.txt", "")


def test_a_script_run_with_arguments_its_source_never_reads_is_found() -> None:
    sources = {"tree.py": "import os\nshow('.', 2)\n", "cli.py": "import argparse\n", "raw.py": "import sys\nprint(sys.argv)\n"}
    assert ignored_arguments("/bin/sh -c 'python3 /workspace/tree.py --max-depth 2'", lambda p: sources.get(p.removeprefix("/workspace/"))) == [
        ("/workspace/tree.py", ["--max-depth", "2"])
    ]
    assert ignored_arguments("python tree.py -v && cp tree.py out/", sources.get) == [("tree.py", ["-v"])]
    for command in ("python3 cli.py --max-depth 2", "python3 raw.py x", "python3 tree.py", "python3 new.py -x", "ls tree.py -l"):
        assert ignored_arguments(command, sources.get) == [], command
