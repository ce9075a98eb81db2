"""The soak's tiny engines (bench/soak.py): one random checkpoint of each family
(``python -m edgeomni.export.tiny FAMILY``'s makers) built small for the CPU, kept in a folder
that later runs reuse.

    python bench/soak_engines.py DIR [FAMILY ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

# family -> (edge-build's --max-batch-size, --max-input-len, --max-kv-cache-capacity): rows
# few enough that the servers' limits (429) come at a rate two cores can send; prompts long
# enough for each family's media (1 s of audio, a 64x48 image)
BUILDS = {
    "qwen3": (2, 64, 128),
    "qwen3_omni_moe": (2, 128, 256),
    "qwen3_tts": (2, 64, 128),
    "qwen3_asr": (2, 128, 256),
    "qwen3_vl": (2, 256, 384),
}
FAMILIES = tuple(BUILDS)


def engine_dir(root: Path, family: str) -> Path:
    return root / family / "eng"


def ensure_engines(root: Path, families: tuple[str, ...] = FAMILIES) -> dict[str, Path]:
    """family -> its built engine dir under ``root``; a family whose build is missing (no
    graph file) is made and built now, one already there is reused."""
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.tiny import MAKERS

    out = {}
    for family in families:
        eng = engine_dir(root, family)
        if not (eng / "multistage_config.json").is_file():
            ckpt = root / family / "ckpt"
            if not (ckpt / "config.json").is_file():
                MAKERS[family](ckpt, seed=0)
            batch, inputs, kv = BUILDS[family]
            graph = build(ckpt, eng, BuildArgs(max_batch_size=batch, max_input_len=inputs,
                                               max_kv_cache_capacity=kv))  # fmt: skip
            if graph is None:
                raise RuntimeError(f"edge-build of the tiny {family} made no graph")
        out[family] = eng
    return out


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    names = tuple(sys.argv[2:]) or FAMILIES
    for fam, path in ensure_engines(Path(sys.argv[1]), names).items():
        print(fam, path)
