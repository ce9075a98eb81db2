"""The sizes the runtime calls each Qwen3-Omni component with (export/common/shapes.py)."""

from __future__ import annotations

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.shapes import DimRanges, decoder_ranges, vocoder_ranges
from edgeomni.export.families.qwen3_omni import code2wav, code2wav_stream, talker
from edgeomni.export.family import BuildArgs, Component
from edgeomni.export.media import audio_encoder as audio
from edgeomni.export.media import vision_encoder as visual

# rows the talker's prefill adds after a prompt's user rows: 3 reply tokens, 4 pads, bos and
# the 4th reply token (runtime/families/qwen3_omni/talker.py, _prefills)
TALKER_PREFILL_EXTRA = 9
# attention rows (frames of images or videos) one visual call may hold
VISUAL_SEGMENTS = 16


def dim_ranges(ckpt: Checkpoint, component: Component, args: BuildArgs) -> DimRanges:
    batch, prompt, capacity = args.max_batch_size, args.max_input_len, args.max_kv_cache_capacity
    name = component.name
    if name == "llm":
        return decoder_ranges(batch, prompt, capacity)
    if name == "talker":
        return decoder_ranges(batch, prompt + TALKER_PREFILL_EXTRA, capacity)
    if name == "code_predictor":  # a frame's codes: its cache holds one frame's groups
        groups = talker.predictor_decoder_config(ckpt.config).lm_heads + 1
        return decoder_ranges(batch, groups, groups)
    if name == "audio":  # one call: up to chunks_per_call chunks of one clip
        return audio.audio_dim_ranges(audio.audio_config(ckpt.config))
    if name == "visual":  # the images of one prompt: merge^2 patches per merged token
        return visual.visual_ranges(ckpt.config, prompt, VISUAL_SEGMENTS)
    if name == "code2wav":  # streamed windows (with their left context), or whole utterances
        window = code2wav.WINDOW_FRAMES + code2wav.LEFT_CONTEXT_FRAMES
        return vocoder_ranges(batch, window, code2wav.MAX_FRAMES)
    if name == code2wav_stream.COMPONENT:  # chunks of new frames, each row with its state
        return code2wav_stream.dim_ranges(batch)
    raise ValueError(f"no dimension ranges for component {name!r}")
