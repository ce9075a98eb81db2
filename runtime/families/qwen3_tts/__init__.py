"""Qwen3-TTS at run time: a graph with no thinker. The talker speaks the request's text (its
prompt built here as upstream's qwen-tts builds it) on the shared speech pieces
(runtime/speech/: the talker's decoder spec, the code predictor and code2wav); Base checkpoints add the clone encoders (speaker embedding, reference
codes) for requests that bring reference audio."""

from __future__ import annotations

from typing import Any

from edgeomni.export.families.qwen3_tts import (
    CODE2WAV_RUNNER,
    SPEAKER_ENCODER_RUNNER,
    SPEECH_ENCODER_RUNNER,
    TALKER_RUNNER,
)
from edgeomni.runtime.family import RequestKey, RuntimeFamily, register_family
from edgeomni.runtime.speech import keys

# (runner name in the graph, kind, "module:attribute" of its factory, emit id -> kind)
RUNNERS = (
    (TALKER_RUNNER, "autoregressive", "edgeomni.runtime.families.qwen3_tts.talker:TtsTalker",
     {"codes": "codec"}),
    # the same vocoder runner as Qwen3-Omni's: the engine config says how it windows
    (CODE2WAV_RUNNER, "iterative", "edgeomni.runtime.speech.code2wav:Code2Wav",
     {"audio": "audio"}),
    (SPEAKER_ENCODER_RUNNER, "iterative",
     "edgeomni.runtime.families.qwen3_tts.clone:SpeakerEncoder", {"xvector": "hidden"}),
    (SPEECH_ENCODER_RUNNER, "iterative",
     "edgeomni.runtime.families.qwen3_tts.clone:SpeechEncoder", {"codes": "hidden"}),
)  # fmt: skip

# its talker reads the shared talker's keys and picks its text mode
STAGE_KEYS = (*keys.STAGE_KEYS, "talker_non_streaming_mode")


def speaker_codes(key: str, value: Any) -> tuple[tuple[int, ...], ...]:
    ok = isinstance(value, list) and all(
        isinstance(f, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in f)
        for f in value
    )
    if not ok:
        raise ValueError(f"{key} must be a list of per-frame lists of integers")
    return tuple(tuple(f) for f in value)


# its request controls (qwen3_tts_inference's keys), read by a stage whose graph input is
# request:<key>; a request that sets one on a graph without such a stage fails alone
REQUEST_KEYS = {
    "language": RequestKey(
        "the language the talker speaks (Qwen3-TTS)", flag="--language", speech_field="language",
        flag_help="on a Qwen3-TTS graph: the language spoken (default auto; an unknown one "
        "fails with the known ones); a request file's default, as --voice"),
    "instruct": RequestKey(
        "a spoken-style instruction (Qwen3-TTS VoiceDesign and 1.7B)", flag="--instruct",
        speech_field="instructions",
        flag_help="on a Qwen3-TTS graph: the voice instruction (VoiceDesign, and CustomVoice "
        "at 1.7B); a request file's default, as --voice"),
    "ref_audio": RequestKey(
        "reference audio to clone a voice from (Qwen3-TTS Base)", flag="--ref-audio", path="audio",
        flag_help="on a Qwen3-TTS Base graph: a clip whose voice is cloned (any rate; "
        "resampled to 24 kHz); a request file's default, as --voice"),
    "ref_text": RequestKey(
        "the transcript of ref_audio (Qwen3-TTS Base)", flag="--ref-text",
        flag_help="with --ref-audio: its transcript, for an in-context clone (without it the "
        "clone takes the clip's speaker embedding only)"),
    "assistant_instruct": RequestKey("an instruction in the assistant turn (Qwen3-TTS)"),
    "talker_language": RequestKey("the talker's language id override (Qwen3-TTS)"),
    "system_instruct": RequestKey("a system instruction for the talker (Qwen3-TTS)"),
    "prompt_speaker_codes": RequestKey(
        "per-frame speaker codes to prompt with (Qwen3-TTS)", check=speaker_codes),
}  # fmt: skip

FAMILY = register_family(
    RuntimeFamily(
        name="qwen3_tts",
        label="Qwen3-TTS",
        runners=RUNNERS,
        request_keys=REQUEST_KEYS,
        **{**keys.FAMILY_FIELDS, "stage_keys": STAGE_KEYS},
        # qwen3_tts_inference gives a request's repetition_penalty to the talker
        text_fallbacks={"repetition_penalty": "talker_repetition_penalty"},
    )
)
