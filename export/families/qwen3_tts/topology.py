"""Qwen3-TTS's graph: no thinker. The talker speaks the request's text; code2wav makes audio.

The talker reads the request's text, voice and controls itself (skip: each has a default or
is only for some checkpoints); the graph's one terminal is code2wav:audio.
"""

from __future__ import annotations

from collections.abc import Mapping

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.family import BuildArgs
from edgeomni.graph_schema import SCHEMA_VERSION, Emit, Graph, Input, Stage

SPEECH = ("talker", "code_predictor", "code2wav")
# request controls the talker reads (qwen3_tts_inference's keys)
CONTROLS = ("voice", "language", "instruct")


def multistage_topology(
    bundle: Checkpoint, components: Mapping[str, str], args: BuildArgs | None
) -> Graph | None:
    """None unless the talker, its code predictor and code2wav are all built."""
    if not all(c in components for c in SPEECH):
        return None
    talker = Stage(
        id="talker",
        runner="qwen3_tts.talker",
        artifact=components["talker"],
        kind="autoregressive",
        inputs=(
            Input("text", "request:messages", "fail"),
            *(Input(name, f"request:{name}", "skip") for name in CONTROLS),
        ),
        emits=(Emit("codes", "codec", "chunk_stream"),),
    )
    vocoder = Stage(
        id="code2wav",
        runner="qwen3_tts.code2wav",
        artifact=components["code2wav"],
        kind="iterative",
        inputs=(Input("codes", "talker:codes", "fail"),),
        emits=(Emit("audio", "audio", "chunk_stream", terminal=True),),
    )
    return Graph(SCHEMA_VERSION, ("code2wav:audio",), (talker, vocoder))


def no_graph_reason(components: Mapping[str, str]) -> str | None:
    missing = [c for c in SPEECH if c not in components]
    if not missing:
        return None
    return f"a Qwen3-TTS graph needs {', '.join(SPEECH)}; missing {', '.join(missing)}"
