"""Qwen3-ASR (model_type "qwen3_asr"): the llm and its audio encoder, one stage."""

from edgeomni.export.families.qwen3_asr.build import (
    components,
    dim_ranges,
    export_component,
    memory_plan,
    position_limits,
    preflight,
    write_artifacts,
)
from edgeomni.export.families.qwen3_asr.topology import multistage_topology

__all__ = [
    "components",
    "dim_ranges",
    "export_component",
    "memory_plan",
    "position_limits",
    "preflight",
    "write_artifacts",
    "multistage_topology",
]
