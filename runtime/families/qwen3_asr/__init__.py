"""Qwen3-ASR at run time: the generic text model's runner hears the request's audio through this
family's media hook (the shared AuT encoder found beside the llm, plain 1-D positions), and its
transcription form renders a transcription request as transformers' processor does and parses
the reply into its language and transcript (edge-infer's predictions, edge-serve's
/v1/audio/transcriptions). ``language`` forces the transcript's language, as the processor's
``language`` does; Qwen3-TTS declares the same key (the language spoken), so the control is one
key each family's stage reads as it declares (runtime/families/__init__.py, merged_keys)."""

from __future__ import annotations

from edgeomni.runtime.family import RequestKey, RuntimeFamily, register_family

# the llm's media hook and speech-to-text form, by its engine config's model_type
MEDIA = {"qwen3_asr": "edgeomni.runtime.families.qwen3_asr.media:AsrMedia"}
TRANSCRIPTION = {"qwen3_asr": "edgeomni.runtime.families.qwen3_asr.transcription:Transcription"}

REQUEST_KEYS = {
    "language": RequestKey(
        "the transcript's language, forced (Qwen3-ASR: a name or code, e.g. English or en)",
        flag="--language", speaks=False,
        flag_help="on a Qwen3-ASR graph: the transcript's language, forced (a name or code, "
        "e.g. English or en; default: the model says which); a request file's default"),
}  # fmt: skip

FAMILY = register_family(
    RuntimeFamily(
        name="qwen3_asr",
        label="Qwen3-ASR",
        media=MEDIA,
        request_keys=REQUEST_KEYS,
        transcription=TRANSCRIPTION,
    )
)
