"""Running make_reference.py in the reference venv from the project's tests (project venv side)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent


def run_reference(python: Path, out_dir: Path, *args: str) -> dict[str, Any]:
    """Run make_reference.py in the reference venv (one thread, no hub) and return its manifest."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    script = HERE / "make_reference.py"
    cmd = [str(python), str(script), str(out_dir), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-6000:]}",
            pytrace=False,
        )
    manifest = json.loads((out_dir / "manifest.json").read_text())
    manifest["python"] = str(python)
    manifest["out_dir"] = str(out_dir)
    return manifest
