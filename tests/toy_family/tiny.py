"""The toy family's tiny checkpoint: config.json and one weight, the shift; with ``guide``
also a tiny random Qwen3-style decoder (its ``guide`` config section and ``guide.*`` weights)
for the guided-sampling stage, whose vocabulary is the 256 bytes and a start token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toy_family import MODEL_TYPE

# the guide decoder's dimensions (export/common/decoder.py's DecoderConfig, Hugging Face's names)
GUIDE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 64, "vocab_size": 257,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0}  # fmt: skip


def make(out_dir: Path, *, seed: int = 0, shift: int = 1, guide: bool = False,
         guide_in_graph: bool = False) -> Path:  # fmt: skip
    """``guide_in_graph``: its engine combines guided row pairs itself (decoder.WithGuidance)."""
    import numpy as np
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"model_type": MODEL_TYPE, "seed": seed}
    weights = {"shift": np.array([float(shift)], np.float32)}
    if guide:
        config["guide"] = {**GUIDE, "in_graph": guide_in_graph}
        weights.update(guide_weights(np.random.default_rng(seed)))
    (out_dir / "config.json").write_text(json.dumps(config))
    save_file(weights, str(out_dir / "model.safetensors"))
    return out_dir


def guide_weights(rng: Any) -> dict[str, Any]:
    """Random weights under Hugging Face's Qwen3 names, prefixed ``guide.``; large enough that
    the logits spread over several units (no near ties for the draws to depend on)."""
    import numpy as np

    g = GUIDE
    h, d, i = g["hidden_size"], g["head_dim"], g["intermediate_size"]
    q, kv, v = g["num_attention_heads"] * d, g["num_key_value_heads"] * d, g["vocab_size"]

    def w(*shape: int, scale: float = 0.3) -> Any:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n: int) -> Any:
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    out = {"model.embed_tokens.weight": w(v, h, scale=1.0), "model.norm.weight": norm(h),
           "lm_head.weight": w(v, h, scale=0.6)}  # fmt: skip
    for n in range(g["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out.update({
            p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h),
            p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, q),
            p + "self_attn.q_norm.weight": norm(d), p + "self_attn.k_norm.weight": norm(d),
            p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h),
            p + "mlp.down_proj.weight": w(h, i),
        })  # fmt: skip
    return {"guide." + k: val for k, val in out.items()}
