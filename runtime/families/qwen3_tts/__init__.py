"""Qwen3-TTS at run time: a graph with no thinker. The talker speaks the request's text (its
prompt built here as upstream's qwen-tts builds it), reusing Qwen3-Omni's talker loop, code
predictor and code2wav; Base checkpoints add the clone encoders (speaker embedding, reference
codes) for requests that bring reference audio."""

from __future__ import annotations

from edgeomni.runtime.families import qwen3_omni

# (runner name in the graph, kind, "module:attribute" of its factory, emit id -> kind)
RUNNERS = (
    ("qwen3_tts.talker", "autoregressive", "edgeomni.runtime.families.qwen3_tts.talker:TtsTalker",
     {"codes": "codec"}),
    # the same vocoder runner as Qwen3-Omni's: the engine config says how it windows
    ("qwen3_tts.code2wav", "iterative", "edgeomni.runtime.families.qwen3_omni.code2wav:Code2Wav",
     {"audio": "audio"}),
    ("qwen3_tts.speaker_encoder", "iterative",
     "edgeomni.runtime.families.qwen3_tts.clone:SpeakerEncoder", {"xvector": "hidden"}),
    ("qwen3_tts.speech_encoder", "iterative",
     "edgeomni.runtime.families.qwen3_tts.clone:SpeechEncoder", {"codes": "hidden"}),
)  # fmt: skip

# its talker reads Qwen3-Omni's talker keys (it reuses that loop) and picks its text mode
STAGE_KEYS = (*qwen3_omni.STAGE_KEYS, "talker_non_streaming_mode")
