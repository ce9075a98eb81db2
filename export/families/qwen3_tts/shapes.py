"""The sizes the runtime calls each Qwen3-TTS component with (export/common/shapes.py)."""

from __future__ import annotations

from edgeomni.export.common.checkpoint import Checkpoint, section
from edgeomni.export.common.shapes import DimRanges, decoder_ranges, upto, vocoder_ranges
from edgeomni.export.families.qwen3_omni import code2wav as omni
from edgeomni.export.families.qwen3_omni import code2wav_stream as stream
from edgeomni.export.families.qwen3_tts import speaker_encoder, speech_encoder
from edgeomni.export.families.qwen3_tts.config import predictor_decoder_config
from edgeomni.export.family import BuildArgs, Component

# the longest reference clip a voice-clone request may bring
REFERENCE_SECONDS = 60


def dim_ranges(ckpt: Checkpoint, component: Component, args: BuildArgs) -> DimRanges:
    batch, prompt, capacity = args.max_batch_size, args.max_input_len, args.max_kv_cache_capacity
    name = component.name
    if name == "talker":
        return decoder_ranges(batch, prompt, capacity)
    if name == "code_predictor":  # a frame's codes: its cache holds one frame's groups
        groups = predictor_decoder_config(ckpt.config).lm_heads + 1
        return decoder_ranges(batch, groups, groups)
    if name == "code2wav":  # streamed windows (with their left context), or whole utterances
        window = omni.WINDOW_FRAMES + omni.LEFT_CONTEXT_FRAMES
        return vocoder_ranges(batch, window, omni.MAX_FRAMES)
    if name == stream.COMPONENT:  # chunks of new frames, each row with its state
        return stream.dim_ranges(batch)
    if name == "speaker_encoder":  # a reference clip's mel frames, one clip a call
        cfg = {**speaker_encoder.DEFAULTS, **section(ckpt.config, "speaker_encoder_config")}
        frames = REFERENCE_SECONDS * int(cfg["sample_rate"]) // speaker_encoder.HOP_SIZE + 1
        lo = speaker_encoder.min_frames(cfg)
        return {"clip": {"batch": upto(batch, opt=1), "frames": upto(frames, lo=lo)}}
    if name == "speech_tokenizer_encoder":  # a reference clip's samples, one clip a call
        from edgeomni.export.families.qwen3_tts.build import code2wav_settings

        enc = speech_encoder.engine_config(code2wav_settings(ckpt))
        samples = upto(REFERENCE_SECONDS * enc["sample_rate"], lo=enc["samples_per_frame"] + 1)
        return {"clip": {"batch": upto(batch, opt=1), "samples": samples}}
    raise ValueError(f"no dimension ranges for component {name!r}")
