"""Read a Qwen3 config.json into the decoder's dimensions, refusing what we cannot export."""

from __future__ import annotations

from typing import Any

from edgeomni.export.common.checkpoint import CheckpointError
from edgeomni.export.common.config_values import attention_dims, integer, number
from edgeomni.export.common.decoder import DecoderConfig

_REQUIRED = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


def rope_theta(cfg: dict[str, Any], where: str = "") -> float:
    """transformers 5 keeps rope settings in rope_parameters; older configs at the top level."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    if rope_type not in (None, "default"):
        raise CheckpointError(f"rope type {rope_type!r} is not supported yet (only default RoPE)")
    if "rope_theta" in params:
        return number(params, "rope_theta", where + "rope_parameters.", default=10000.0)
    return number(cfg, "rope_theta", where, default=10000.0)


def decoder_config(cfg: dict[str, Any], where: str = "") -> DecoderConfig:
    """The decoder's dimensions, each value checked by name; ``where``: the section's dotted
    path ("text_config." for Qwen3-ASR's llm)."""
    missing = [where + k for k in _REQUIRED if k not in cfg]
    if missing:
        raise CheckpointError(f"config.json: missing {', '.join(missing)}")
    if cfg.get("use_sliding_window"):
        raise CheckpointError(f"config.json: {where}use_sliding_window: sliding-window layers "
                              "are not supported yet")  # fmt: skip
    hidden, heads, kv_heads, head_dim = attention_dims(cfg, where)
    return DecoderConfig(
        hidden_size=hidden,
        num_layers=integer(cfg, "num_hidden_layers", where),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=integer(cfg, "intermediate_size", where),
        vocab_size=integer(cfg, "vocab_size", where),
        rms_norm_eps=number(cfg, "rms_norm_eps", where, default=1e-6),
        rope_theta=rope_theta(cfg, where),
        qk_norm=True,
        attention_bias=bool(cfg.get("attention_bias", False)),
    )
