"""Qwen3-Omni's graph: the thinker writes text; the talker speaks it; code2wav makes audio."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.families.qwen3_omni import CODE2WAV_RUNNER, TALKER_RUNNER
from edgeomni.export.family import BuildArgs
from edgeomni.export.registry import LLM_RUNNER
from edgeomni.export.speech import parts
from edgeomni.graph_schema import SCHEMA_VERSION, Emit, Graph, Input, Stage


def multistage_topology(
    bundle: Checkpoint, components: Mapping[str, str], args: BuildArgs | None
) -> Graph | None:
    """None without the thinker (the spec: no graph for a qwen3_omni_moe build without its llm);
    the thinker alone when any speech component is missing."""
    if "llm" not in components:
        return None
    # the encoders are the thinker runner's, not stages: it finds them through its config,
    # as paths relative to its own artifact folder
    encoders = {
        kind: posixpath.relpath(components[kind], components["llm"])
        for kind in ("audio", "visual")
        if kind in components
    }
    thinker = Stage(
        id="thinker",
        runner=LLM_RUNNER,
        artifact=components["llm"],
        kind="autoregressive",
        inputs=(
            Input("prompt", "request:messages", "fail"),
            Input("audio", "request:audio", "skip"),
            Input("image", "request:image", "skip"),
        ),
        emits=(
            Emit("text", "text", "chunk_stream", terminal=True),
            Emit("accept_hidden", "hidden", "chunk_stream"),
        ),
        config={"encoders": encoders} if encoders else {},
    )
    if parts.missing(components):
        return Graph(SCHEMA_VERSION, ("thinker:text",), (thinker,))
    talker = parts.talker_stage(TALKER_RUNNER, components, (
        Input("hidden", "thinker:accept_hidden", "fail"),
        Input("text_ids", "thinker:text", "fail"),
        Input("voice", "request:voice", "skip"),
    ))  # fmt: skip
    vocoder = parts.vocoder_stage(CODE2WAV_RUNNER, components)
    return Graph(SCHEMA_VERSION, ("thinker:text", "code2wav:audio"), (thinker, talker, vocoder))
