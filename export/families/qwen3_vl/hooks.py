"""Qwen3-VL (model_type "qwen3_vl"): the llm and its visual encoder as a one-stage graph."""

from edgeomni.export.families.qwen3_vl.build import (
    components,
    dim_ranges,
    export_component,
    memory_plan,
    position_limits,
    preflight,
    write_artifacts,
)
from edgeomni.export.families.qwen3_vl.topology import multistage_topology

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
