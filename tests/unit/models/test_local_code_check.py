"""The check and the one repair applied to Python files the local model writes."""

from __future__ import annotations

import json

from cairn.models._local_code_check import (
    ignored_arguments,
    is_shell_commands,
    python_syntax_error,
    repair_python_escapes,
    written_python_file,
)
from cairn.models.base import ToolSpec

WRITER = ToolSpec(
    "write_file",
    "Save a file.",
    {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}},
    "workspace",
)
RUNNER = ToolSpec("shell", "Run.", {"type": "object", "properties": {"command": {"type": "string"}}}, "workspace")


def _as_the_model_writes_it(json_content: str) -> str:
    """Decode file content the way the provider does: the model's JSON string, read leniently."""
    decoded = json.JSONDecoder(strict=False).decode('"' + json_content + '"')
    assert isinstance(decoded, str)
    return decoded


def test_a_json_line_break_inside_a_string_literal_is_put_back_as_the_escape() -> None:
    # The model's JSON, with `\n` both between lines and (wrongly) inside the literals.
    content = _as_the_model_writes_it(r"""import sys\n\ndef show(parts):\n    print(\"a\nb\")\n    return '\n'.join(parts)\n""")
    assert python_syntax_error(content) is not None
    repaired = repair_python_escapes(content, "tree.py")
    assert repaired == 'import sys\n\ndef show(parts):\n    print("a\\nb")\n    return \'\\n\'.join(parts)\n'
    namespace: dict[str, object] = {}
    exec(compile(repaired, "tree.py", "exec"), namespace)
    show = namespace["show"]
    assert callable(show) and show(["x", "y"]) == "x\ny"


def test_source_that_compiles_is_never_changed() -> None:
    assert repair_python_escapes('print("a\\nb")\n') is None
    # A line break inside triple quotes is legal, and so is a backslash continuation.
    assert repair_python_escapes('DOC = """one\ntwo"""\nS = "a\\\nb"\n') is None


def test_other_syntax_errors_are_not_repaired() -> None:
    content = 'def f(:\n    return "a"\n'
    problem = python_syntax_error(content)
    assert problem is not None and not problem.is_unterminated_string
    assert repair_python_escapes(content) is None


def test_a_repair_that_still_does_not_compile_is_not_used() -> None:
    # Unterminated for another reason (a missing quote) and broken elsewhere as well.
    content = 'print("a)\nx = (\n'
    assert python_syntax_error(content) is not None
    assert repair_python_escapes(content) is None


def test_quotes_in_comments_and_triple_quoted_strings_do_not_confuse_the_scan() -> None:
    content = '# it\'s a "tree"\n"""Don\'t\nstop"""\nprint("x\ny")\n'
    assert repair_python_escapes(content) == '# it\'s a "tree"\n"""Don\'t\nstop"""\nprint("x\\ny")\n'


def test_the_syntax_problem_names_the_line() -> None:
    problem = python_syntax_error('x = 1\nprint("a\nb")\n')
    assert problem is not None and problem.is_unterminated_string
    assert problem.line_number == 2
    assert problem.describe().startswith("SyntaxError on line 2: unterminated string literal")
    assert 'print("a' in problem.describe()
    assert python_syntax_error("x = 1\n") is None


def test_only_python_files_saved_by_a_file_writing_tool_are_checked() -> None:
    assert written_python_file(WRITER, {"path": "/workspace/tree.py", "content": "x"}) == ("/workspace/tree.py", "x")
    assert written_python_file(WRITER, {"path": "notes.txt", "content": "x"}) is None
    assert written_python_file(RUNNER, {"command": "python3 tree.py"}) is None
    assert written_python_file(None, {"path": "a.py", "content": "x"}) is None
    assert written_python_file(WRITER, {"path": "a.py", "content": 3}) is None


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
