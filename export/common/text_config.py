"""A decoder section of a Qwen3 checkpoint's config.json as decoder dimensions: the one reading
of every family's decoders (a Qwen3 LLM's top level, Qwen3-ASR's, Qwen3-VL's and Qwen3-Omni's
``text_config`` sections, Qwen3-TTS's talker and code predictor). transformers 5 writes the rope
settings into
``rope_parameters``; checkpoints saved by transformers 4 (the released ones) keep them in
``rope_scaling`` with ``rope_theta`` beside it. Both are read here.
"""

from __future__ import annotations

from typing import Any

from edgeomni.export.common.checkpoint import CheckpointError
from edgeomni.export.common.config_values import attention_dims, integer, number
from edgeomni.export.common.decoder import DecoderConfig


def rope(
    text: dict[str, Any], default_theta: float = 1e6, where: str = ""
) -> tuple[float, tuple[int, ...] | None]:
    """(rope_theta, mrope_section or None); ``default_theta`` where the section names none (the
    config class's default)."""
    key = "rope_parameters" if text.get("rope_parameters") else "rope_scaling"
    params = text.get(key) or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"config.json: {where}{key} must be an object, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(f"rope type {rope_type!r} is not supported yet")
    if "rope_theta" in params:
        theta = number(params, "rope_theta", f"{where}{key}.", default=default_theta)
    else:
        theta = number(text, "rope_theta", where, default=default_theta)
    section_ = params.get("mrope_section")
    if section_ and not (isinstance(section_, list)
                         and all(isinstance(v, int) and v > 0 for v in section_)):  # fmt: skip
        raise CheckpointError(f"config.json: {where}{key}.mrope_section must be a list of "
                              f"integers > 0, got {section_!r}")  # fmt: skip
    return theta, tuple(section_) if section_ else None


def decoder_config(
    text: dict[str, Any], default_theta: float = 1e6, where: str = "", *,
    kv_heads: int | None = None, head_dim: int | None = None, **extra: Any,
) -> DecoderConfig:  # fmt: skip
    """A decoder section as decoder dimensions, each value checked by name (``where``: the
    section's dotted path), refusing the layers our decoder does not implement;
    ``default_theta``, ``kv_heads`` and ``head_dim``: the config class's defaults for absent
    keys (config_values.attention_dims); ``extra``: DecoderConfig's other fields."""
    if text.get("use_sliding_window"):
        raise CheckpointError(f"config.json: {where}use_sliding_window true: sliding-window "
                              "layers are not supported")  # fmt: skip
    if any(t != "full_attention" for t in text.get("layer_types") or []):
        raise CheckpointError(
            f"config.json: {where}layer_types: only full_attention layers are supported"
        )
    if text.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"config.json: {where}hidden_act {text['hidden_act']!r} is not silu")
    hidden, heads, kv, dim = attention_dims(text, where, kv_heads=kv_heads, head_dim=head_dim)
    theta, _ = rope(text, default_theta, where)
    # a sparse-MoE section may leave the dense MLP's width out
    moe = bool(text.get("num_experts", text.get("num_local_experts")))
    return DecoderConfig(
        hidden_size=hidden,
        num_layers=integer(text, "num_hidden_layers", where),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=dim,
        intermediate_size=(integer(text, "intermediate_size", where, least=0, default=0) if moe
                           else integer(text, "intermediate_size", where)),  # fmt: skip
        vocab_size=integer(text, "vocab_size", where),
        rms_norm_eps=number(text, "rms_norm_eps", where, default=1e-6),
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
