"""Qwen3-TTS's graph: no thinker. The talker speaks the request's text; code2wav makes audio.

The talker reads the request's text, voice and controls itself (skip: each has a default or
is only for some checkpoints); the graph's one terminal is code2wav:audio. A Base checkpoint's
clone encoders come first: each needs ref_audio (the speech tokenizer's ref_text too), so a
request without them plans neither and the talker skips their outputs.
"""

from __future__ import annotations

from collections.abc import Mapping

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.families.qwen3_tts import (
    CODE2WAV_RUNNER,
    SPEAKER_ENCODER_RUNNER,
    SPEECH_ENCODER_RUNNER,
    TALKER_RUNNER,
)
from edgeomni.export.family import BuildArgs
from edgeomni.export.speech import parts
from edgeomni.graph_schema import SCHEMA_VERSION, Emit, Graph, Input, Stage

# request controls the talker reads (qwen3_tts_inference's keys)
CONTROLS = ("voice", "language", "instruct")
SPEAKER_ENCODER, SPEECH_ENCODER = "speaker_encoder", "speech_tokenizer_encoder"
CLONE = (SPEAKER_ENCODER, SPEECH_ENCODER)
CLONE_RUNNERS = {SPEAKER_ENCODER: SPEAKER_ENCODER_RUNNER,
                 SPEECH_ENCODER: SPEECH_ENCODER_RUNNER}  # fmt: skip
CLONE_PORTS = {SPEAKER_ENCODER: "xvector", SPEECH_ENCODER: "codes"}
CLONE_INPUTS = {SPEAKER_ENCODER: "xvector", SPEECH_ENCODER: "ref_codes"}  # the talker's names


def multistage_topology(
    bundle: Checkpoint, components: Mapping[str, str], args: BuildArgs | None
) -> Graph | None:
    """None unless the talker, its code predictor and code2wav are all built."""
    if parts.missing(components):
        return None
    clone = [c for c in CLONE if c in components]
    encoders = tuple(_encoder(name, components[name]) for name in clone)
    talker = parts.talker_stage(TALKER_RUNNER, components, (
        Input("text", "request:messages", "fail"),
        *(Input(name, f"request:{name}", "skip") for name in CONTROLS),
        # a Base checkpoint's clone inputs: the x-vector (ref_audio), the ICL prompt's
        # reference codes and their transcript (ref_audio with ref_text)
        *((Input("ref_text", "request:ref_text", "skip"),) if clone else ()),
        *(Input(CLONE_INPUTS[name], f"{name}:{CLONE_PORTS[name]}", "skip") for name in clone),
    ))  # fmt: skip
    # ICL: the reference codes are vocoded in front of the talker's and cut off again
    prompt = Input("prompt_codes", f"{SPEECH_ENCODER}:codes", "skip")
    vocoder = parts.vocoder_stage(CODE2WAV_RUNNER, components,
                                  *((prompt,) if SPEECH_ENCODER in clone else ()))  # fmt: skip
    return Graph(SCHEMA_VERSION, ("code2wav:audio",), (*encoders, talker, vocoder))


def _encoder(name: str, artifact: str) -> Stage:
    """A clone encoder: it runs for a request that brings ref_audio (the speech tokenizer's
    also needs ref_text: only an ICL prompt reads its codes), else it is not planned."""
    needs = ["ref_audio"] + (["ref_text"] if name == SPEECH_ENCODER else [])
    return Stage(
        id=name,
        runner=CLONE_RUNNERS[name],
        artifact=artifact,
        kind="iterative",
        inputs=tuple(Input(field, f"request:{field}", "fail") for field in needs),
        emits=(Emit(CLONE_PORTS[name], "hidden", "device_tensor"),),
    )


def no_graph_reason(components: Mapping[str, str]) -> str | None:
    missing = parts.missing(components)
    if not missing:
        return None
    return f"a Qwen3-TTS graph needs {', '.join(parts.SPEECH)}; missing {', '.join(missing)}"
