"""Qwen3.5's vision tower (Qwen3_5ForConditionalGeneration's ``model.visual``), built beside
the llm as Qwen3-VL's is (export/media/vision_encoder.py's vision_language_encoder: the same
engine, inputs and processor settings), since transformers' Qwen3_5VisionModel is
Qwen3VLVisionModel without DeepStack (its one output is the merged embeddings). The ids its
media hook expands are config.json's top-level image_token_id, video_token_id and vision
start/end ids, read as Qwen3-VL's build reads them."""

from __future__ import annotations

from typing import Any

from edgeomni.export.common import artifacts
from edgeomni.export.common.checkpoint import Checkpoint, section
from edgeomni.export.media import vision_encoder as visual

PREFIX = "model.visual."


def vision_spec() -> visual.VisionSpec:
    """transformers' Qwen3_5VisionModel under ``model.visual.``, no DeepStack mergers
    (imported here, on first use, with transformers)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig

    return visual.VisionSpec(
        module=hf.Qwen3_5VisionModel,
        config=Qwen3_5VisionConfig,
        sections=("vision_config",),
        prefix=PREFIX,
        deepstack_mergers=None,
        model_type="qwen3_5",
    )


VISUAL = visual.vision_language_encoder(vision_spec, PREFIX)


def llm_fields(ckpt: Checkpoint, dec: Any = None) -> dict[str, Any]:
    """The llm's engine config beside its decoder's, for a ConditionalGeneration checkpoint:
    its text section's end and pad ids, and (where config.json names them) the ids its media
    hook expands; a Qwen3_5ForCausalLM's config gives none of these. ``dec``: unread (the
    TextFamily ``fields`` hook's signature, so that preflight reads these too)."""
    if not isinstance(ckpt.config.get("text_config"), dict):
        return {}
    text = section(ckpt.config, "text_config")
    out: dict[str, Any] = {
        "eos_token_id": artifacts.eos_token_ids(ckpt, ckpt.config, text),
        "pad_token_id": next((c["pad_token_id"] for c in (text, ckpt.generation_config)
                             if c.get("pad_token_id") is not None), None),
    }  # fmt: skip
    if any(key in ckpt.config for key in visual.MEDIA_TOKENS):
        out["media_tokens"] = visual.media_tokens(ckpt.config)
    return out
