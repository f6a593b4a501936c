"""The demo's verdict on the script an agent delivers: it must run and limit the depth.

A model can complete both turns and publish a `tree.py` that does not work (seen on the
local model: a script whose first line swallowed `import os`, one with no option parsing,
one that took the limit as a parameter but never read the option, a `cp` command saved as
the script), so `cairn demo` runs the artifact in the sandbox, in the directory it was
saved to as the tutorial's reader does, before it reports success.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cairn.demo import SCRIPTS_DIR, check_tree_script

pytestmark = pytest.mark.anyio

# Counts the top level as depth 1, like `tree -L`.
WORKING = """\
import os
import sys


def show(root, depth, max_depth, prefix=""):
    for name in sorted(os.listdir(root)):
        print(prefix + name)
        path = os.path.join(root, name)
        if os.path.isdir(path) and (max_depth is None or depth < max_depth):
            show(path, depth + 1, max_depth, prefix + "  ")


args = sys.argv[1:]
limit = None
if "--max-depth" in args:
    limit = int(args[args.index("--max-depth") + 1])
show(".", 1, limit)
"""

# Counts the top level as depth 0: `--max-depth 1` also shows the level below it.
WORKING_FROM_ZERO = WORKING.replace("depth < max_depth", "depth <= max_depth")

# Another common shape: argparse and os.walk.
WORKING_WALK = """\
import argparse
import os

parser = argparse.ArgumentParser()
parser.add_argument("--max-depth", type=int)
args = parser.parse_args()
for root, dirs, files in os.walk("."):
    depth = root.count(os.sep)
    if args.max_depth is not None and depth > args.max_depth:
        continue
    print("    " * depth + os.path.basename(root) + "/")
    for name in files:
        print("    " * (depth + 1) + name)
"""


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tree.py"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text", [WORKING, WORKING_FROM_ZERO, WORKING_WALK], ids=["depth-from-one", "depth-from-zero", "os-walk"])
async def test_a_script_that_prints_the_tree_and_limits_its_depth_passes(tmp_path: Path, text: str) -> None:
    assert await check_tree_script(_script(tmp_path, text)) == ""


async def test_the_scripted_demos_turn_1_script_has_no_depth_limit_yet(tmp_path: Path) -> None:
    # Turn 1's version prints the tree and ignores the option it does not know yet;
    # tests/e2e/test_demo.py checks that turn 2's patched version passes.
    first = json.loads((SCRIPTS_DIR / "tutorial.json").read_text())["turns"][0][0]["arguments"]["content"]
    problem = await check_tree_script(_script(tmp_path, first))
    assert problem == "`python3 tree.py --max-depth 1` does not limit the depth: it shows level3, level4, deepest.txt"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('print("a\nb")\n', "`python3 tree.py` exits 1: SyntaxError"),
        ("#!/usr/bin/env python3 import os\nprint(os.listdir('.'))\n", "exits 1: NameError"),
        ("cp /workspace/tree.py /workspace/outputs/tree.py\n", "`python3 tree.py` exits 1: NameError: name 'cp'"),
        ("import sys\n", "`python3 tree.py` does not show top.txt, level1, level2, level3, level4, deepest.txt"),
        (
            "import argparse\np = argparse.ArgumentParser()\np.add_argument('path')\np.parse_args()\n" + WORKING,
            "`python3 tree.py` exits 2",
        ),
        (
            "import argparse\np = argparse.ArgumentParser()\np.parse_args()\n" + WORKING,
            "`python3 tree.py --max-depth 1` exits 2",
        ),
        (WORKING.replace("limit = int(", "limit = None and int("), "`python3 tree.py --max-depth 1` does not limit the depth"),
        (WORKING.replace("limit = int(args[args.index(\"--max-depth\") + 1])", "limit = 2"), "show the same levels"),
        (WORKING.replace('show(".", 1, limit)', 'show("/workspace", 1, limit)'), "`python3 tree.py --max-depth 1` does not show top.txt"),
        (WORKING.replace('show(".", 1, limit)', 'show("..", 1, limit)'), "`python3 tree.py --max-depth 1` does not show top.txt"),
        (WORKING.replace("print(prefix + name)", "print(prefix + name) if not os.path.isdir(os.path.join(root, name)) else None"),
         "`python3 tree.py` does not show level1, level2, level3, level4"),
    ],
    ids=[
        "syntax-error", "lost-newline", "a-command-saved-as-the-script", "prints-nothing", "requires-a-path",
        "no-option", "ignores-the-limit", "a-fixed-limit", "lists-a-fixed-directory", "lists-the-parent",
        "files-only",
    ],
)
async def test_a_script_that_does_not_do_what_was_asked_fails(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in await check_tree_script(_script(tmp_path, text))
