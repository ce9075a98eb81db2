"""Qwen3-VL's graph: one llm.backbone stage that reads messages with images and videos and
writes text; its visual encoder is the stage's, found beside it (``visual/``)."""

from __future__ import annotations

from collections.abc import Mapping

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.topology import llm_graph
from edgeomni.export.family import BuildArgs
from edgeomni.graph_schema import Graph, Input


def multistage_topology(
    bundle: Checkpoint, components: Mapping[str, str], args: BuildArgs | None
) -> Graph | None:
    """None without the llm; without the visual encoder the stage reads text only."""
    media = (Input("image", "request:image", "skip"), Input("video", "request:video", "skip"))
    return llm_graph(components, media if "visual" in components else (), ("visual",))
