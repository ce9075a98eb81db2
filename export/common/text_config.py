"""A text_config section of a multimodal Qwen3 checkpoint as decoder dimensions.

Qwen3-Omni's thinker, talker and code predictor and Qwen3-VL's LLM keep their decoder in a
``text_config`` section of the same shape. transformers 5 writes the rope settings into
``rope_parameters``; checkpoints saved by transformers 4 (the released ones) keep them in
``rope_scaling`` with ``rope_theta`` beside it. Both are read here.
"""

from __future__ import annotations

from typing import Any

from edgeomni.export.common.checkpoint import CheckpointError
from edgeomni.export.common.decoder import DecoderConfig


def rope(text: dict[str, Any], default_theta: float = 1e6) -> tuple[float, tuple[int, ...] | None]:
    """(rope_theta, mrope_section or None); ``default_theta`` where the section names none (the
    config class's default)."""
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(f"rope type {rope_type!r} is not supported yet")
    theta = params.get("rope_theta", text.get("rope_theta", default_theta))
    section_ = params.get("mrope_section")
    return float(theta), tuple(section_) if section_ else None


def decoder_config(text: dict[str, Any], default_theta: float = 1e6, **extra: Any) -> DecoderConfig:
    """A text_config section as decoder dimensions; ``extra``: DecoderConfig's other fields."""
    heads = int(text["num_attention_heads"])
    theta, _ = rope(text, default_theta)
    return DecoderConfig(
        hidden_size=int(text["hidden_size"]),
        num_layers=int(text["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or text["hidden_size"] // heads),
        intermediate_size=int(text.get("intermediate_size") or 0),
        vocab_size=int(text["vocab_size"]),
        rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        attention_bias=bool(text.get("attention_bias", False)),
        **extra,
    )


def is_moe_layer(text: dict[str, Any], layer: int) -> bool:
    """transformers' rule for which decoder layers hold a sparse MoE block."""
    experts = text.get("num_experts", text.get("num_local_experts", 0)) or 0
    step = int(text.get("decoder_sparse_step", 1) or 1)
    return (
        layer not in (text.get("mlp_only_layers") or []) and experts > 0 and (layer + 1) % step == 0
    )
