"""Qwen3 causal LMs (model_type "qwen3"): one component, the llm, as a one-stage graph."""

from edgeomni.export.families.qwen3.build import (
    components,
    dim_ranges,
    export_component,
    memory_plan,
    position_limits,
    preflight,
    write_artifacts,
)
from edgeomni.export.families.qwen3.topology import multistage_topology

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
