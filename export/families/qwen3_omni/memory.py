"""What edge-build --estimate counts for each Qwen3-Omni component, from config.json alone: each
component's module as the export builds it (the family's own constructors, on the meta device:
shapes, no weights, no memory) and its host tables' shapes."""

from __future__ import annotations

from typing import Any

import torch

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.decoder import DTYPES
from edgeomni.export.common.memory_plan import (
    F32,
    decoder_memory,
    float_memory,
    module_shapes,
    table_rows,
)
from edgeomni.export.families.qwen3_omni import code2wav, talker, thinker
from edgeomni.export.family import BuildArgs, Component, ComponentMemory
from edgeomni.export.media import audio_encoder as audio
from edgeomni.export.media import vision_encoder as visual
from edgeomni.export.speech import code2wav_stream, parts


def memory_plan(ckpt: Checkpoint, component: Component, args: BuildArgs) -> ComponentMemory:
    config, name = ckpt.config, component.name
    with torch.device("meta"):
        if name == "audio":
            return float_memory(audio.hf.Qwen3OmniMoeAudioEncoder(audio.audio_config(config)))
        if name == "visual":
            return float_memory(visual.OMNI.module(visual.vision_config(config)))
        if name in ("code2wav", code2wav_stream.COMPONENT):  # the same weights, each its engine
            return float_memory(code2wav.hf.Qwen3OmniMoeCode2Wav(code2wav.code2wav_config(config)))
        dtype = DTYPES.get(args.dtype, torch.float32)
        if name == "llm":
            module = thinker.thinker_module(config).to(dtype)
            return decoder_memory(module, {"embedding": (table_rows(module), F32)}, args.dtype)
        if name == "talker":
            module = talker.talker_module(config).to(dtype)
            text = thinker.thinker_module(config).cfg.hidden_size
            tables = {"embedding": (table_rows(module), F32), "tts_special": ((3, text), F32)}
            tables.update(_projection_tables(config))
            return decoder_memory(module, tables, args.dtype)
        if name == "code_predictor":
            return parts.predictor_memory(talker.predictor_module(config).to(dtype), args.dtype, args)
    raise ValueError(f"qwen3_omni_moe has no component {name!r}")


def _projection_tables(config: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """text_projection and hidden_projection, as transformers' talker builds them."""
    from transformers import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

    cfg = Qwen3OmniMoeConfig(**config).talker_config
    out = {}
    for proj in talker.PROJECTIONS:
        shapes = module_shapes(hf.Qwen3OmniMoeTalkerResizeMLP(cfg))
        out.update({f"{proj}.{name}": (shape, F32) for name, (shape, _) in shapes.items()})
    return out
