"""Qwen3-ASR's graph: one llm.backbone stage that hears a request's audio and writes its text.

The audio encoder is no stage of its own: the stage's runner finds it beside the llm
(export/common/topology.py). ``language`` is the family's request control (a forced
transcript language), which the stage reads."""

from __future__ import annotations

from collections.abc import Mapping

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.topology import llm_graph
from edgeomni.export.family import BuildArgs
from edgeomni.graph_schema import Graph, Input


def multistage_topology(
    bundle: Checkpoint, components: Mapping[str, str], args: BuildArgs | None
) -> Graph | None:
    """None without the llm; without the audio encoder the stage reads text only."""
    inputs = (
        Input("audio", "request:audio", "skip"),
        Input("language", "request:language", "skip"),
    )
    return llm_graph(components, inputs, ("audio",))
