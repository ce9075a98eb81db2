"""Qwen3's graph: one llm.backbone stage that turns messages into text."""

from __future__ import annotations

from collections.abc import Mapping

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.topology import llm_graph
from edgeomni.export.family import BuildArgs
from edgeomni.graph_schema import Graph


def multistage_topology(
    bundle: Checkpoint, components: Mapping[str, str], args: BuildArgs | None
) -> Graph | None:
    return llm_graph(components)
