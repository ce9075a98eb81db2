"""Qwen3-VL (model_type "qwen3_vl"): the LLM with interleaved MRoPE and DeepStack inputs, and
its ViT, as a one-stage graph run by the generic text model's runner, which finds the visual
encoder beside it. Its build hooks are .build's HOOKS (a TextFamily); its runtime (the media
hook: image and video preprocessing, timestamps, 3-axis positions) is runtime/families/qwen3_vl/."""

from edgeomni.export.registry import TEXT_SMOKE, Family, register_family

FAMILY = register_family(Family(
    "qwen3_vl", ("qwen3_vl",), f"{__name__}.build:HOOKS",
    tiny="edgeomni.export.tiny_vl:make_qwen3_vl", smoke=TEXT_SMOKE,
))  # fmt: skip
