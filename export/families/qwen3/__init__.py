"""Qwen3 causal LMs (model_type "qwen3"): one component, the llm, as a one-stage graph run by
the generic text model's runner. Its build hooks are .build's HOOKS (a TextFamily)."""

from edgeomni.export.registry import Family, register_family

FAMILY = register_family(
    Family(
        name="qwen3",
        model_types=("qwen3",),
        module="edgeomni.export.families.qwen3.build:HOOKS",
        tiny="edgeomni.export.tiny:make_qwen3",
        smoke=("--max-generate-length", "4", "--sampling", '{"top_k": 1}'),
    )
)
