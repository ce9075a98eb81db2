"""Read Qwen3-Omni's nested config.json into what each component's export needs."""

from __future__ import annotations

from typing import Any

from edgeomni.export.common.checkpoint import CheckpointError, section
from edgeomni.export.common.decoder import DecoderConfig

__all__ = ["decoder_config", "is_moe_layer", "rope", "section", "thinker_decoder_config"]


def rope(text: dict[str, Any]) -> tuple[float, tuple[int, ...] | None]:
    params = text.get("rope_parameters") or {}
    if params.get("rope_type", "default") != "default":
        raise CheckpointError(f"rope type {params.get('rope_type')!r} is not supported yet")
    section_ = params.get("mrope_section")
    return float(params.get("rope_theta", 1e6)), tuple(section_) if section_ else None


def decoder_config(text: dict[str, Any], **extra: Any) -> DecoderConfig:
    """A text_config section (thinker, talker or code predictor) as decoder dimensions."""
    heads = int(text["num_attention_heads"])
    theta, mrope = rope(text)
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


def thinker_decoder_config(cfg: dict[str, Any]) -> DecoderConfig:
    thinker = section(cfg, "thinker_config")
    text = section(cfg, "thinker_config", "text_config")
    _, mrope = rope(text)
    if mrope is None:
        mrope = (24, 20, 20)  # transformers' default when the config names none
    accept = int(section(cfg, "talker_config").get("accept_hidden_layer", 0))
    if not 0 <= accept <= int(text["num_hidden_layers"]):
        raise CheckpointError(f"talker_config.accept_hidden_layer {accept} is out of range")
    deepstack = len((thinker.get("vision_config") or {}).get("deepstack_visual_indexes") or [])
    return decoder_config(
        text, mrope_section=mrope, hidden_output_layer=accept, deepstack_layers=deepstack
    )
