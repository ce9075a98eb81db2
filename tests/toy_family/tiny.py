"""The toy family's tiny checkpoint: config.json and one weight, the shift."""

from __future__ import annotations

import json
from pathlib import Path

from toy_family import MODEL_TYPE


def make(out_dir: Path, *, seed: int = 0, shift: int = 1) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps({"model_type": MODEL_TYPE, "seed": seed}))
    save_file({"shift": np.array([float(shift)], np.float32)}, str(out_dir / "model.safetensors"))
    return out_dir
