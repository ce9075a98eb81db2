"""Qwen3 causal LMs (model_type "qwen3"): one component, the llm, as a one-stage graph run by
the generic text model's runner. Its build hooks are .build's HOOKS (a TextFamily)."""

from edgeomni.export.registry import TEXT_SMOKE, Family, register_family

FAMILY = register_family(Family(
    "qwen3", ("qwen3",), f"{__name__}.build:HOOKS",
    tiny="edgeomni.export.tiny:make_qwen3", smoke=TEXT_SMOKE,
))  # fmt: skip
