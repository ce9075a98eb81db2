"""Qwen3-ASR's graph: one llm.backbone stage that hears a request's audio and writes its text.

The audio encoder is no stage of its own: the stage's runner finds it beside the llm
(``audio/`` or ``multimodal/audio/``, the spec's discovery), so the stage config names it only
when it is elsewhere (``edge-build --graph-only`` over another tool's layout, the llm in
``llm/``). ``language`` is the family's request control (a forced transcript language), which
the stage reads."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.family import BuildArgs
from edgeomni.export.registry import LLM_RUNNER
from edgeomni.graph_schema import SCHEMA_VERSION, Emit, Graph, Input, Stage

# where the runtime finds an llm's audio encoder by itself (runtime/media/hook.py)
BESIDE = ("audio", "multimodal/audio")


def multistage_topology(
    bundle: Checkpoint, components: Mapping[str, str], args: BuildArgs | None
) -> Graph | None:
    """None without the llm; without the audio encoder the stage reads text only."""
    if "llm" not in components:
        return None
    config = {}
    if "audio" in components:
        where = posixpath.relpath(components["audio"], components["llm"])
        if where not in BESIDE:
            config = {"encoders": {"audio": where}}
    stage = Stage(
        id="llm",
        runner=LLM_RUNNER,
        artifact=components["llm"],
        kind="autoregressive",
        inputs=(
            Input("prompt", "request:messages", "fail"),
            Input("audio", "request:audio", "skip"),
            Input("language", "request:language", "skip"),
        ),
        emits=(Emit("text", "text", "chunk_stream", terminal=True),),
        config=config,
    )
    return Graph(SCHEMA_VERSION, ("llm:text",), (stage,))
