"""Read Qwen3-VL's config.json (a text_config and a vision_config section) into the LLM's
decoder dimensions and the ViT's spec."""

from __future__ import annotations

from typing import Any

from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError, section
from edgeomni.export.common.config_values import attention_dims, integer
from edgeomni.export.common.decoder import DecoderConfig
from edgeomni.export.common.text_config import decoder_config, rope
from edgeomni.export.media.vision_encoder import VisionSpec

# transformers' Qwen3VLTextConfig defaults where config.json names none
DEFAULT_THETA = 500000.0
DEFAULT_MROPE = (24, 20, 20)
EMBEDDING = "model.language_model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
# our decoder's "model.*" is the checkpoint's "model.language_model.*"
TEXT_PREFIX = "model.language_model."
VISUAL_PREFIX = "model.visual."
def vision_spec() -> VisionSpec:
    """Qwen3-VL's ViT: transformers' Qwen3VLVisionModel under ``model.visual.``, its DeepStack
    mergers in ``deepstack_merger_list`` (imported here, on first use, with transformers)."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl as hf
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    return VisionSpec(
        module=hf.Qwen3VLVisionModel,
        config=Qwen3VLVisionConfig,
        sections=("vision_config",),
        prefix=VISUAL_PREFIX,
        deepstack_mergers="deepstack_merger_list",
        model_type="qwen3_vl",
    )


def text_decoder_config(cfg: dict[str, Any]) -> DecoderConfig:
    """The LLM: a Qwen3 decoder with interleaved MRoPE and one DeepStack input per tap of the
    ViT (added after the first layers at the visual positions)."""
    text = section(cfg, "text_config")
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                           "intermediate_size", "vocab_size") if k not in text]  # fmt: skip
    if missing:
        raise CheckpointError(f"config.json: text_config has no {', '.join(missing)}")
    if text.get("num_experts"):
        raise CheckpointError("config.json: text_config has experts; Qwen3-VL MoE "
                              "(qwen3_vl_moe) is not supported yet")  # fmt: skip
    _, mrope = rope(text, DEFAULT_THETA, "text_config.")
    mrope = mrope or DEFAULT_MROPE
    head_dim = attention_dims(text, "text_config.")[3]
    if 2 * sum(mrope) != head_dim:
        raise CheckpointError(f"config.json: mrope_section {list(mrope)} does not sum to "
                              f"head_dim / 2 ({head_dim // 2})")  # fmt: skip
    deepstack = (cfg.get("vision_config") or {}).get("deepstack_visual_indexes")
    layers = len(deepstack if deepstack is not None else (8, 16, 24))  # the class default
    if layers > integer(text, "num_hidden_layers", "text_config."):
        raise CheckpointError(f"config.json: {layers} DeepStack taps for "
                              f"{text['num_hidden_layers']} text layers")  # fmt: skip
    return decoder_config(text, DEFAULT_THETA, "text_config.", mrope_section=mrope,
                          deepstack_layers=layers)  # fmt: skip


def lm_head_name(ckpt: Checkpoint) -> str:
    """Tied checkpoints (Qwen3-VL-2B) store no lm_head: the embedding table serves both.
    Tying is the top level's ``tie_word_embeddings``, as transformers reads it for
    Qwen3VLForConditionalGeneration (text_config's only where the top level has none); an
    untied checkpoint without an lm_head is an error, not a silent tie."""
    cfg = ckpt.config
    text = cfg.get("text_config") or {}
    tied = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    if tied:
        return EMBEDDING
    if not ckpt.has(LM_HEAD):
        raise CheckpointError(
            f"{ckpt.path}: config.json does not tie the word embeddings (tie_word_embeddings), "
            f"and the weights have no {LM_HEAD}"
        )
    return LM_HEAD
