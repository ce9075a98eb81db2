"""Qwen3-Omni (model_type "qwen3_omni_moe"): thinker, talker, code predictor and code2wav."""

from edgeomni.export.families.qwen3_omni.build import (
    calibration_fields,
    components,
    export_component,
    left_out,
    position_limits,
    preflight,
    write_artifacts,
)
from edgeomni.export.families.qwen3_omni.memory import memory_plan
from edgeomni.export.families.qwen3_omni.shapes import dim_ranges
from edgeomni.export.families.qwen3_omni.topology import multistage_topology

__all__ = [
    "calibration_fields",
    "components",
    "dim_ranges",
    "export_component",
    "left_out",
    "memory_plan",
    "position_limits",
    "preflight",
    "write_artifacts",
    "multistage_topology",
]
