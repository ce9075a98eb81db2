"""A fused engine's call in numpy: runtime/fused_engine.py's launch sequence, each kernel
replaced by its reference (plugins/decoder_cuda.py, plugins/attention.py). It reads the same
weight file and config, so it pins the build's layout and the engine's order of operations where
no GPU is (tests/test_fused_build.py), and is what the GPU tests compare the kernels' calls to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.plugins import attention
from edgeomni.plugins import decoder_cuda as dc
from edgeomni.plugins import decoder_linear_cuda as lc
from edgeomni.runtime import safetensors_np


class FusedReference:
    def __init__(self, folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        self.spec = cfg["fused"]
        self.w = {k: v.astype(np.float64) if v.dtype.kind == "f" else v
                  for k, v in safetensors_np.load(folder / cfg["engine"]).items()}  # fmt: skip
        group = (self.spec.get("int4") or {}).get("group_size")
        for name in [k for k in self.w if k + ".scales" in self.w]:  # int4: the matrix it codes
            codes = self.w[name]
            flat = lc.int4_weights(codes.reshape(-1, codes.shape[-1]),
                                   self.w.pop(name + ".scales"), group)  # fmt: skip
            self.w[name] = flat.reshape(*codes.shape[:-1], -1).astype(np.float64)

    def cache(self, rows: int, capacity: int) -> list[np.ndarray]:
        s = self.spec
        shape = (rows, s["num_kv_heads"], capacity, s["head_dim"])
        return [np.zeros(shape) for _ in range(2 * s["num_layers"])]

    def run(self, embeds: np.ndarray, positions: np.ndarray, past_lens: np.ndarray,
            query_lens: np.ndarray, last: np.ndarray, cache: list[np.ndarray],
            head: int = 0, draw: dict[str, Any] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
        """One call: embeds [B, S, E], positions [B, S] or [3, B, S]; the cache updated in
        place. Returns logits [B, V] and, where configured, last_hidden, topk and (a sampler's
        build, given ``draw``: uniform [B], temperature, top_k, top_p) the draw."""
        s, w = self.spec, self.w
        b, seq = embeds.shape[:2]
        t = b * seq
        eps, d = s["rms_norm_eps"], s["head_dim"]
        x = embeds.reshape(t, -1).astype(np.float64)
        if s["input_size"]:
            h = lc.linear_reference(x, w["input_proj"], bias=w["input_proj_bias"])
        else:
            h = x
        pos = positions.reshape(-1 if positions.ndim == 2 else 3, t)
        pos = pos.reshape(1, t) if positions.ndim == 2 else pos
        out: dict[str, np.ndarray] = {}
        for n in range(s["num_layers"]):
            p = f"layers.{n}."
            qkv = lc.linear_reference(h, w[p + "qkv"], norm_w=w[p + "input_norm"], eps=eps)
            q, k, v = dc.qk_rope_reference(
                qkv, pos, heads=s["num_heads"], kv_heads=s["num_kv_heads"], head_dim=d,
                inv_freq=w["inv_freq"], q_norm=w.get(p + "q_norm"), k_norm=w.get(p + "k_norm"),
                eps=eps, freq_axis=w.get("freq_axis"),
            )  # fmt: skip
            o, cache[2 * n], cache[2 * n + 1] = attention.reference(
                q.reshape(b, seq, -1), k.reshape(b, seq, -1), v.reshape(b, seq, -1),
                cache[2 * n], cache[2 * n + 1], past_lens, query_lens,
                num_heads=s["num_heads"], kv_num_heads=s["num_kv_heads"],
            )  # fmt: skip
            h = lc.linear_reference(o.reshape(t, -1), w[p + "o"], residual=h)
            act = lc.linear_reference(h, w[p + "gate_up"], norm_w=w[p + "post_norm"], eps=eps,
                                      swiglu=True)  # fmt: skip
            h = lc.linear_reference(act, w[p + "down"], residual=h)
        rows = h.reshape(b, seq, -1)[np.arange(b), last]
        lm = w["lm_head"] if s["lm_heads"] == 1 else w["lm_head"][head]
        out["logits"] = lc.linear_reference(rows, lm, norm_w=w["norm"], eps=eps)
        if s["last_hidden_output"]:
            out["last_hidden"] = rows * lc.rms_scale(rows, eps) * w["norm"]
        if s["logits_topk"]:  # a float16 build's top K is of its float16 logits
            logits = out["logits"]
            if s["dtype"] == "float16":
                logits = logits.astype(np.float16).astype(np.float64)
            out["topk_values"], out["topk_indices"] = dc.topk_reference(
                logits, s["logits_topk"], w.get("topk_bias")
            )
        if s.get("sampler") and draw is not None:
            out["sampled_ids"], out["sampled_embeds"] = dc.sample_reference(
                out["topk_values"], out["topk_indices"], draw["uniform"],
                temperature=draw["temperature"], top_k=draw["top_k"], top_p=draw["top_p"],
                tables=w["sampler_tables"], head=head,
            )  # fmt: skip
        return out
