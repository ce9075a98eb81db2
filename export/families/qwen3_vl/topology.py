"""Qwen3-VL's graph: one llm.backbone stage that reads messages with images and videos and
writes text; its visual encoder is the stage's, found beside it (``visual/``)."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.family import BuildArgs
from edgeomni.export.registry import LLM_RUNNER
from edgeomni.graph_schema import SCHEMA_VERSION, Emit, Graph, Input, Stage


def multistage_topology(
    bundle: Checkpoint, components: Mapping[str, str], args: BuildArgs | None
) -> Graph | None:
    """None without the llm; the visual encoder is no stage (the llm's runner calls it), named
    in the stage config relative to the llm's folder."""
    if "llm" not in components:
        return None
    inputs = [Input("prompt", "request:messages", "fail")]
    config = {}
    if "visual" in components:
        inputs += [Input("image", "request:image", "skip"), Input("video", "request:video", "skip")]
        config = {
            "encoders": {"visual": posixpath.relpath(components["visual"], components["llm"])}
        }
    stage = Stage(
        id="llm",
        runner=LLM_RUNNER,
        artifact=components["llm"],
        kind="autoregressive",
        inputs=tuple(inputs),
        emits=(Emit("text", "text", "chunk_stream", terminal=True),),
        config=config,
    )
    return Graph(SCHEMA_VERSION, ("llm:text",), (stage,))
