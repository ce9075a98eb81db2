"""Qwen3-VL's build: the llm (at the engine dir's root) and its visual encoder (``visual/``),
no stage of its own: the llm's runner calls it (the stage config names where it is)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from edgeomni.export.common import artifacts
from edgeomni.export.common.checkpoint import Checkpoint, section
from edgeomni.export.common.decoder import DecoderConfig
from edgeomni.export.common.text_family import Encoder, TextFamily
from edgeomni.export.families.qwen3_vl.config import (
    TEXT_PREFIX,
    VISUAL_PREFIX,
    lm_head_name,
    text_decoder_config,
    vision_spec,
)
from edgeomni.export.family import BuildArgs, Component
from edgeomni.export.media import vision_encoder as visual
from edgeomni.export.registry import LLM_RUNNER
from edgeomni.graph_schema import Input


def _export(ckpt: Checkpoint, path: Path) -> Path:
    spec = vision_spec()
    return visual.export_visual(visual.load_visual(ckpt.tensor, ckpt.config, spec), path, spec)


def _engine_config(ckpt: Checkpoint, args: BuildArgs) -> dict[str, Any]:
    image, video = visual.image_video_settings(ckpt)
    return visual.visual_engine_config(ckpt.config, args.backend, args.device,
                                       image_processor=image, video_processor=video,
                                       spec=vision_spec())  # fmt: skip


def _ranges(ckpt: Checkpoint, args: BuildArgs) -> Any:
    """One request's image or video (a frame a segment)."""
    segments = max(visual.MIN_SEGMENTS, args.max_input_len // visual.TOKENS_PER_FRAME)
    return visual.visual_ranges(ckpt.config, args.max_input_len, segments, vision_spec())


def _module(ckpt: Checkpoint) -> torch.nn.Module:
    spec = vision_spec()
    return spec.module(visual.vision_config(ckpt.config, spec))


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


VISUAL = Encoder(
    component=Component("visual", "visual", visual.ENGINE, LLM_RUNNER),
    weights=VISUAL_PREFIX, config="vision_config", export=_export,
    inputs=(Input("image", "request:image", "skip"), Input("video", "request:video", "skip")),
    engine_config=_engine_config, ranges=_ranges, module=_module, check=visual.image_video_settings,
)  # fmt: skip
HOOKS = TextFamily(text=("text_config",), prefix=TEXT_PREFIX, lm_head=lm_head_name,
                   decoder=text_decoder_config, encoder=VISUAL, fields=llm_fields)  # fmt: skip
