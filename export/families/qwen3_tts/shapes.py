"""The sizes the runtime calls each Qwen3-TTS component with (export/common/shapes.py)."""

from __future__ import annotations

from edgeomni.export.common.checkpoint import Checkpoint, section
from edgeomni.export.common.shapes import DimRanges, upto
from edgeomni.export.families.qwen3_tts import speaker_encoder, speech_encoder
from edgeomni.export.families.qwen3_tts.config import num_code_groups
from edgeomni.export.family import BuildArgs, Component
from edgeomni.export.speech import parts

# the longest reference clip a voice-clone request may bring
REFERENCE_SECONDS = 60


def dim_ranges(ckpt: Checkpoint, component: Component, args: BuildArgs) -> DimRanges:
    batch, name = args.max_batch_size, component.name
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
    return parts.dim_ranges(name, args, num_code_groups(ckpt.config))
