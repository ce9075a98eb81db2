"""mypy over the seams ([tool.mypy] in pyproject.toml names them: graph_schema/, the scheduler,
the decoder stage, events, buffers): a type error there fails this test with mypy's report, so
the suite fails on one as the README's test command (``.venv/bin/mypy``) does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_seams_type_check() -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (the test extra installs it)")
    # the config's paths are relative to the repository root: run it there, on its own files
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, f"mypy failed:\n{run.stdout}{run.stderr}"
