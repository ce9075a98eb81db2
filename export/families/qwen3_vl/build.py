"""Qwen3-VL's build: the llm (at the engine dir's root) and its visual encoder (``visual/``),
no stage of its own: the llm's runner calls it (the stage config names where it is)."""

from __future__ import annotations

from typing import Any

from edgeomni.export.common import artifacts
from edgeomni.export.common.checkpoint import Checkpoint, section
from edgeomni.export.common.decoder import DecoderConfig
from edgeomni.export.common.text_family import TextFamily
from edgeomni.export.families.qwen3_vl.config import (
    TEXT_PREFIX,
    VISUAL_PREFIX,
    lm_head_name,
    text_decoder_config,
    vision_spec,
)
from edgeomni.export.media import vision_encoder as visual


def llm_fields(ckpt: Checkpoint, dec: DecoderConfig) -> dict[str, Any]:
    """The llm's engine config beside a text decoder's: its MRoPE and DeepStack, the ids its
    media hook expands, the text section's end and pad ids."""
    text = section(ckpt.config, "text_config")
    return {
        "mrope_section": list(dec.mrope_section or ()),
        "deepstack_layers": dec.deepstack_layers,
        "eos_token_id": artifacts.eos_token_ids(ckpt, ckpt.config, text),
        "pad_token_id": text.get("pad_token_id", ckpt.generation_config.get("pad_token_id")),
        "media_tokens": visual.media_tokens(ckpt.config),
    }


VISUAL = visual.vision_language_encoder(vision_spec, VISUAL_PREFIX)
HOOKS = TextFamily(text=("text_config",), prefix=TEXT_PREFIX, lm_head=lm_head_name,
                   decoder=text_decoder_config, encoder=VISUAL, fields=llm_fields)  # fmt: skip
