"""Read a Qwen3 config.json into the decoder's dimensions, refusing what we cannot export."""

from __future__ import annotations

from typing import Any

from edgeomni.export.common.checkpoint import CheckpointError
from edgeomni.export.common.decoder import DecoderConfig

_REQUIRED = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


def rope_theta(cfg: dict[str, Any]) -> float:
    """transformers 5 keeps rope settings in rope_parameters; older configs at the top level."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    if rope_type not in (None, "default"):
        raise CheckpointError(f"rope type {rope_type!r} is not supported yet (only default RoPE)")
    return float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def decoder_config(cfg: dict[str, Any], where: str = "config.json") -> DecoderConfig:
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise CheckpointError(f"{where}: missing {', '.join(missing)}")
    if cfg.get("use_sliding_window"):
        raise CheckpointError(f"{where}: sliding-window layers are not supported yet")
    heads = int(cfg["num_attention_heads"])
    return DecoderConfig(
        hidden_size=int(cfg["hidden_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        intermediate_size=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta(cfg),
        qk_norm=True,
        attention_bias=bool(cfg.get("attention_bias", False)),
    )
