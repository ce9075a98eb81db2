"""The one-stage graph of a text model that may read media: one llm.backbone stage, its
encoders no stages of their own (the stage's runner calls them)."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

from edgeomni.export.registry import LLM_RUNNER
from edgeomni.graph_schema import SCHEMA_VERSION, Emit, Graph, Input, Stage


def llm_graph(
    components: Mapping[str, str],
    inputs: Sequence[Input] = (),
    encoders: Sequence[str] = (),
) -> Graph | None:
    """None without the llm. The stage reads the request's messages, then ``inputs``. Each of
    ``encoders`` that was built is named in the stage config, relative to the llm's folder,
    only where the runtime would not find it by itself (``kind/`` or ``multimodal/kind/``
    beside the llm: runtime/media/hook.py), as after ``edge-build --graph-only`` over another
    tool's layout."""
    if "llm" not in components:
        return None
    where = {
        kind: posixpath.relpath(components[kind], components["llm"])
        for kind in encoders
        if kind in components
    }
    named = {k: w for k, w in where.items() if w not in (k, f"multimodal/{k}")}
    stage = Stage(
        id="llm",
        runner=LLM_RUNNER,
        artifact=components["llm"],
        kind="autoregressive",
        inputs=(Input("prompt", "request:messages", "fail"), *inputs),
        emits=(Emit("text", "text", "chunk_stream", terminal=True),),
        config={"encoders": named} if named else {},
    )
    return Graph(SCHEMA_VERSION, ("llm:text",), (stage,))
