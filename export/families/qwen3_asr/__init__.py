"""Qwen3-ASR (model_type "qwen3_asr"): speech in, text out, as a one-stage graph. The llm (a
Qwen3 decoder taking float32 input embeddings, so the audio rows are spliced over their
placeholders) is run by the generic text model's runner, which finds the audio encoder beside
it (``audio/``). Its build hooks are .build's HOOKS (a TextFamily); its runtime (the media hook,
the transcription form, the ``language`` control) is runtime/families/qwen3_asr/."""

from edgeomni.export.registry import TEXT_SMOKE, Family, register_family

FAMILY = register_family(Family(
    "qwen3_asr", ("qwen3_asr",), f"{__name__}.build:HOOKS",
    tiny="edgeomni.export.tiny_asr:make_qwen3_asr", smoke=TEXT_SMOKE,
))  # fmt: skip
