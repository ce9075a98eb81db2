"""Qwen3-TTS (model_type "qwen3_tts"): talker, code predictor and code2wav; Base checkpoints'
clone encoders land here as they are built."""

from edgeomni.export.families.qwen3_tts.build import (
    calibration_fields,
    calibration_needs,
    components,
    export_component,
    left_out,
    position_limits,
    preflight,
    write_artifacts,
)
from edgeomni.export.families.qwen3_tts.memory import memory_plan
from edgeomni.export.families.qwen3_tts.shapes import dim_ranges
from edgeomni.export.families.qwen3_tts.topology import multistage_topology, no_graph_reason

__all__ = [
    "calibration_fields",
    "calibration_needs",
    "components",
    "dim_ranges",
    "export_component",
    "left_out",
    "memory_plan",
    "multistage_topology",
    "no_graph_reason",
    "position_limits",
    "preflight",
    "write_artifacts",
]
