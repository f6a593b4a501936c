"""The demo's verdict on the script an agent delivers: it must run and limit the depth.

A model can complete both turns and publish a `tree.py` that does not work (seen on the
local model: a script whose first line swallowed `import os`, one with no option parsing),
so `cairn demo` runs the artifact in the sandbox before it reports success.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cairn.demo import SCRIPTS_DIR, check_tree_script

pytestmark = pytest.mark.anyio

WORKING = """\
import os
import sys


def show(root, depth, max_depth, prefix=""):
    if max_depth is not None and depth >= max_depth:
        return
    for name in sorted(os.listdir(root)):
        print(prefix + name)
        path = os.path.join(root, name)
        if os.path.isdir(path):
            show(path, depth + 1, max_depth, prefix + "  ")


args = sys.argv[1:]
limit = None
if "--max-depth" in args:
    at = args.index("--max-depth")
    limit = int(args[at + 1])
    del args[at : at + 2]
show(args[0] if args else ".", 0, limit)
"""


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tree.py"
    path.write_text(text)
    return path


async def test_a_script_that_prints_the_tree_and_limits_its_depth_passes(tmp_path: Path) -> None:
    assert await check_tree_script(_script(tmp_path, WORKING)) == ""


async def test_the_scripted_demos_turn_1_script_has_no_depth_limit_yet(tmp_path: Path) -> None:
    # Turn 1's version prints the tree and ignores the option it does not know yet;
    # tests/e2e/test_demo.py checks that turn 2's patched version passes.
    first = json.loads((SCRIPTS_DIR / "tree.json").read_text())["turns"][0][0]["arguments"]["content"]
    problem = await check_tree_script(_script(tmp_path, first))
    assert problem == "`--max-depth 1` does not limit the depth"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('print("a\nb")\n', "`python3 tree.py demo` exits 1: SyntaxError"),
        ("#!/usr/bin/env python3 import os\nprint(os.listdir('.'))\n", "exits 1: NameError"),
        ("import sys\n", "`python3 tree.py demo` does not show level1, top.txt, level3, deepest.txt"),
        (
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('path')\np.parse_args()\n" + WORKING,
            "`python3 tree.py demo --max-depth 1` exits 2",
        ),
        (WORKING.replace("limit = int(args[at + 1])", "limit = None"), "`--max-depth 1` does not limit the depth"),
        (WORKING.replace('show(args[0] if args else ".", 0, limit)', 'show(".", 0, limit)'), "ignores its path argument"),
    ],
    ids=["syntax-error", "lost-newline", "prints-nothing", "no-option", "ignores-the-limit", "ignores-the-path"],
)
async def test_a_script_that_does_not_do_what_was_asked_fails(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in await check_tree_script(_script(tmp_path, text))
