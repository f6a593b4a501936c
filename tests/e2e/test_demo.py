"""`cairn demo`, the README's main job, end to end on the scripted model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cairn.demo import LOCAL_MODEL, choose_model
from cairn.models.local import is_local_model_installed


def test_the_demo_runs_both_turns_and_saves_the_artifact(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    result = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "demo", "--model", "scripted:tutorial", "--output-dir", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("── turn completed ──") == 2
    # The sample project's tree in turn 1; turn 2's run stops two levels down.
    turn_1, turn_2 = result.stdout.split("── turn completed ──")[:2]
    assert "$ python3 tree.py\n" in turn_1 and "storage" in turn_1 and "files.py" in turn_1
    assert "$ python3 tree.py --max-depth 2" in turn_2 and "notes" in turn_2 and "storage" not in turn_2
    assert "it works (checked with --max-depth 1 and 2)" in result.stdout
    assert "to use a real model: export OPENAI_API_KEY" in result.stdout
    saved = tmp_path / "out" / "tree.py"
    assert "max_depth" in saved.read_text()


def test_the_model_is_chosen_from_what_is_configured() -> None:
    assert choose_model("scripted:x", {})[0] == "scripted:x"
    model, hints = choose_model(None, {"OPENAI_API_KEY": "sk", "CAIRN_DEMO_MODEL": "gpt-x"})
    assert model == "openai:gpt-x" and not any("OPENAI_API_KEY" in h for h in hints)
    fallback, hints = choose_model(None, {})
    assert fallback == (LOCAL_MODEL if is_local_model_installed() else "scripted:tutorial")
    assert any("OPENAI_API_KEY" in h for h in hints)
