"""The sizes the runtime calls each Qwen3-Omni component with (export/common/shapes.py)."""

from __future__ import annotations

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.shapes import DimRanges, decoder_ranges
from edgeomni.export.families.qwen3_omni import talker
from edgeomni.export.family import BuildArgs, Component
from edgeomni.export.media import audio_encoder as audio
from edgeomni.export.media import vision_encoder as visual
from edgeomni.export.speech import parts

# rows the talker's prefill adds after a prompt's user rows: 3 reply tokens, 4 pads, bos and
# the 4th reply token (runtime/families/qwen3_omni/talker.py, _prefills)
TALKER_PREFILL_EXTRA = 9
# attention rows (frames of images or videos) one visual call may hold
VISUAL_SEGMENTS = 16


def dim_ranges(ckpt: Checkpoint, component: Component, args: BuildArgs) -> DimRanges:
    name = component.name
    if name == "llm":
        return decoder_ranges(args.max_batch_size, args.max_input_len, args.max_kv_cache_capacity)
    if name == "audio":  # one call: up to chunks_per_call chunks of one clip
        return audio.audio_dim_ranges(audio.audio_config(ckpt.config))
    if name == "visual":  # the images of one prompt: merge^2 patches per merged token
        return visual.visual_ranges(ckpt.config, args.max_input_len, VISUAL_SEGMENTS)
    groups = talker.predictor_decoder_config(ckpt.config).lm_heads + 1
    return parts.dim_ranges(name, args, groups, TALKER_PREFILL_EXTRA)
