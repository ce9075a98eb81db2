"""Qwen3's graph: one llm.backbone stage that turns messages into text."""

from __future__ import annotations

from collections.abc import Mapping

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.family import BuildArgs
from edgeomni.export.registry import LLM_RUNNER
from edgeomni.graph_schema import SCHEMA_VERSION, Emit, Graph, Input, Stage


def multistage_topology(
    bundle: Checkpoint, components: Mapping[str, str], args: BuildArgs | None
) -> Graph | None:
    if "llm" not in components:
        return None
    stage = Stage(
        id="llm",
        runner=LLM_RUNNER,
        artifact=components["llm"],
        kind="autoregressive",
        inputs=(Input(name="prompt", source="request:messages", on_missing="fail"),),
        emits=(Emit(id="text", kind="text", transport="chunk_stream", terminal=True),),
    )
    return Graph(schema_version=SCHEMA_VERSION, terminals=("llm:text",), stages=(stage,))
