"""Whether one right-padded prefill of rows of different lengths, from an empty cache, equals
prefilling each row alone, on an engine whose attention takes no per-row query lengths
(GroupQueryAttention before onnxruntime 1.32). The LLM runner and the talker prefill a cohort so,
in one call, on such engines too. Shared by the CPU test
(test_gpu_lowering_on_cpu.py) and the GPU one (test_gpu.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgeomni.runtime.decoder import DecoderSession, right_pad, text_positions
from edgeomni.runtime.engine import open_engine
from edgeomni.runtime.row_state import RowState

LENGTHS = (5, 13, 9)


def batched_and_rowwise(folder: Path, capacity: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Logits [2, rows, V] (prefill, then one decode step of every row) for the right-padded
    batch and for the rows one at a time, on the same random inputs."""
    cfg = json.loads((folder / "config.json").read_text())
    engine = open_engine(folder, cfg)
    mrope = bool(cfg.get("mrope_section"))
    rng = np.random.default_rng(3)
    h = int(cfg["hidden_size"])
    rows = [rng.standard_normal((n, h)).astype(np.float32) * 0.5 for n in LENGTHS]
    step = rng.standard_normal((len(rows), 1, h)).astype(np.float32) * 0.5
    lens = np.array(LENGTHS, np.int32)
    n = len(rows)
    outputs = {"logits": (int(cfg["vocab_size"]),)}
    extra = {}
    if "deepstack_embeds" in engine.input_names:
        extra["deepstack_embeds"] = np.zeros((int(cfg["deepstack_layers"]), n, max(LENGTHS), h))

    def decode(session: DecoderSession) -> np.ndarray:
        more = {k: v[:, :, :1] for k, v in extra.items()}
        out = session.run(step, text_positions(lens, 1, mrope), lens, np.ones(n, np.int32),
                          np.zeros(n, np.int64), **more)  # fmt: skip
        return np.array(out["logits"], np.float32)

    results = []
    for batched in (True, False):
        kv = RowState.for_engine(cfg, n, engine, capacity)
        session = DecoderSession(engine, kv, n, outputs)
        zeros = np.zeros(n, np.int32)
        if batched:
            embeds = right_pad(rows)
            positions = text_positions(zeros, embeds.shape[1], mrope)
            got = session.run(embeds, positions, zeros, lens, lens - 1, **extra)
            first = np.array(got["logits"], np.float32)
        else:
            first = np.zeros((n, outputs["logits"][0]), np.float32)
            one = np.zeros(1, np.int32)
            for r, x in enumerate(rows):
                alone = DecoderSession(engine, kv, 1, outputs, first_row=r)
                more = {k: v[:, r : r + 1, : len(x)] for k, v in extra.items()}
                positions = text_positions(one, len(x), mrope)
                got = alone.run(x[None], positions, one, lens[r : r + 1], lens[r : r + 1] - 1,
                                **more)  # fmt: skip
                first[r] = np.array(got["logits"], np.float32)[0]
        results.append(np.stack([first, decode(session)]))
    return results[0], results[1]
