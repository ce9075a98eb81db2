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
    return Reference(python, out_dir, *args).manifest()


class Reference:
    """make_reference.py started in the reference venv (one thread, no hub); ``manifest()``
    waits for it. Two of them run side by side, each on one core."""

    def __init__(self, python: Path, out_dir: Path, *args: str) -> None:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
        }
        env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
        script = HERE / "make_reference.py"
        self.python, self.out_dir = python, out_dir
        self.cmd = [str(python), str(script), str(out_dir), *args]
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )

    def stop(self) -> None:
        """Kill it if it still runs (a run waited for has ended: nothing to do)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()

    def manifest(self) -> dict[str, Any]:
        try:
            stdout, stderr = self.proc.communicate(timeout=600)
        finally:
            self.stop()
        if self.proc.returncode != 0:
            pytest.fail(
                f"{' '.join(self.cmd)} failed ({self.proc.returncode}):\n{stdout[-3000:]}"
                f"{stderr[-6000:]}",
                pytrace=False,
            )
        manifest = json.loads((self.out_dir / "manifest.json").read_text())
        manifest["python"] = str(self.python)
        manifest["out_dir"] = str(self.out_dir)
        return manifest
