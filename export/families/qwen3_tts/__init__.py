"""Qwen3-TTS (model_type "qwen3_tts"): talker, code predictor and code2wav; Base checkpoints'
clone encoders too. Its build hooks are .build's; its runtime is runtime/families/qwen3_tts/,
whose runners are declared there under the names below, the ones its graphs use."""

from edgeomni.export.registry import Family, register_family

TALKER_RUNNER = "qwen3_tts.talker"
CODE2WAV_RUNNER = "qwen3_tts.code2wav"
SPEAKER_ENCODER_RUNNER = "qwen3_tts.speaker_encoder"
SPEECH_ENCODER_RUNNER = "qwen3_tts.speech_encoder"

FAMILY = register_family(Family(
    "qwen3_tts", ("qwen3_tts",), f"{__name__}.build", "edgeomni.export.tiny_tts:make_checkpoint",
    ("--voice", "vivian", "--out-audio", "{tmp}/tts.wav", "--sampling",
     '{"talker_max_new_tokens": 4}'),
))  # fmt: skip
