"""The build pieces the speech families share: a talker whose code predictor completes each
frame (one engine with a head per residual group), and the code2wav vocoder, windowed or
stepped (code2wav.py, code2wav_stream.py). Each family names its runners; the components, what
a build leaves out, the shapes, the code predictor's export, artifacts and memory, and the
talker's and vocoder's graph stages are the same."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from edgeomni.export.common import artifacts
from edgeomni.export.common.decoder import CausalLM, decoder_dtype
from edgeomni.export.common.memory_plan import F32, decoder_memory, table_rows
from edgeomni.export.common.onnx_export import export_causal_lm
from edgeomni.export.common.predictor_frame import HEADS, PredictorFrame, export_predictor_frame
from edgeomni.export.common.shapes import DimRanges, decoder_ranges, vocoder_ranges
from edgeomni.export.family import BuildArgs, Component, ComponentMemory
from edgeomni.export.speech import code2wav, code2wav_stream
from edgeomni.graph_schema import Emit, Input, Stage

SPEECH = ("talker", "code_predictor", "code2wav")  # what a speech graph needs
CALIBRATION_FRAMES = 48  # frames each int4_awq calibration request speaks


def components(talker_runner: str, code2wav_runner: str) -> tuple[Component, ...]:
    """The talker, its code predictor (run by the talker's runner), code2wav and the stateful
    step engine the code2wav stage streams with (--code2wav-streaming stateful)."""
    step = code2wav_stream.COMPONENT
    return (
        Component("talker", "talker", "llm.onnx", talker_runner),
        Component("code_predictor", "code_predictor", "llm.onnx", talker_runner),
        Component("code2wav", "code2wav", code2wav.ENGINE, code2wav_runner),
        Component(step, step, code2wav_stream.ENGINE, code2wav_runner),
    )


def left_out(ckpt: Any, args: BuildArgs) -> dict[str, str]:
    """The stateful code2wav step is built unless --code2wav-streaming windows."""
    if args.code2wav_streaming == "windows":
        return {code2wav_stream.COMPONENT: "--code2wav-streaming windows"}
    return {}


def dim_ranges(name: str, args: BuildArgs, groups: int, talker_rows: int = 0) -> DimRanges:
    """The sizes the runtime calls a speech component with (export/common/shapes.py);
    ``groups``: codes a frame; ``talker_rows``: rows the talker's prefill adds to a prompt."""
    batch, prompt, capacity = args.max_batch_size, args.max_input_len, args.max_kv_cache_capacity
    if name == "talker":
        return decoder_ranges(batch, prompt + talker_rows, capacity)
    if name == "code_predictor":  # a frame's codes: its cache holds one frame's groups
        return decoder_ranges(batch, groups, groups)
    if name == "code2wav":  # streamed windows (with their left context), or whole utterances
        window = code2wav.WINDOW_FRAMES + code2wav.LEFT_CONTEXT_FRAMES
        return vocoder_ranges(batch, window, code2wav.MAX_FRAMES)
    if name == code2wav_stream.COMPONENT:  # chunks of new frames, each row with its state
        return code2wav_stream.dim_ranges(batch)
    raise ValueError(f"no dimension ranges for component {name!r}")


def export_predictor(talker: Any, ckpt: Any, path: Path, args: BuildArgs) -> Path:
    """The code predictor (``talker``: the family's talker module, with ``build_predictor``
    and ``predictor_embeddings``); with engine sampling it draws its codes itself
    (export/common/sampler.py) from its embedding_<i> tables. Its inputs stay the engine's
    dtype (no float32_embeds): on a GPU the talker's hidden state and the drawn codes'
    embeddings reach it as device buffers of that dtype."""
    module = talker.build_predictor(ckpt, decoder_dtype(ckpt, args))
    topk = args.logits_topk or 0
    if args.code_predictor_calls == "frame":
        return export_predictor_frame(module, path)
    if not args.engine_sampling:
        return export_causal_lm(module, path, logits_topk=topk)
    found = talker.predictor_embeddings(ckpt, module.cfg.lm_heads + 1)
    stacked = torch.stack([found[f"embedding_{i}"] for i in range(len(found))])
    return export_causal_lm(module, path, logits_topk=topk, sampler_tables=stacked)


def write_predictor(
    talker: Any, ckpt: Any, out_dir: Path, base: Mapping[str, Any], args: BuildArgs
) -> None:
    """The code predictor's folder: its embedding_<i> tables and its engine config (a frame
    engine's says ``"calls": "frame"`` and declares no row state)."""
    from safetensors.torch import save_file

    cfg = talker.predictor_decoder_config(ckpt.config)
    save_file(talker.predictor_embeddings(ckpt, cfg.lm_heads + 1),
              str(out_dir / "embedding.safetensors"))  # fmt: skip
    fields = {**base, **artifacts.decoder_fields(cfg, base["dtype"]), "input_size": cfg.embeds_size,
              "num_code_groups": cfg.lm_heads + 1}  # fmt: skip
    if args.code_predictor_calls == "frame":
        fields.update(state=[], calls="frame")
    artifacts.write_engine_config(out_dir, fields)


def predictor_memory(module: CausalLM, dtype: str, args: BuildArgs) -> ComponentMemory:
    """The code predictor as --estimate counts it: one float32 table a residual group; a frame
    engine's cache lives inside its call (no row state)."""
    rows = table_rows(module)
    tables = {f"embedding_{i}": (rows, F32) for i in range(module.cfg.lm_heads)}
    if args.code_predictor_calls == "frame":
        return ComponentMemory(PredictorFrame(module), tables, [], lm_head=HEADS)
    return decoder_memory(module, tables, dtype)


def missing(components: Mapping[str, str]) -> list[str]:
    """The speech components a graph needs that were not built."""
    return [c for c in SPEECH if c not in components]


def talker_stage(runner: str, components: Mapping[str, str], inputs: tuple[Input, ...]) -> Stage:
    """The talker: it speaks codes a frame, its code predictor completing each."""
    return Stage(id="talker", runner=runner, artifact=components["talker"], kind="autoregressive",
                 inputs=inputs, emits=(Emit("codes", "codec", "chunk_stream"),))  # fmt: skip


def vocoder_stage(runner: str, components: Mapping[str, str], *inputs: Input) -> Stage:
    """code2wav: the talker's codes (then ``inputs``) to audio, stepped where the step engine
    was built (code2wav_stream.stage_config), else in windows."""
    return Stage(
        id="code2wav",
        runner=runner,
        artifact=components["code2wav"],
        kind="iterative",
        inputs=(Input("codes", "talker:codes", "fail"), *inputs),
        emits=(Emit("audio", "audio", "chunk_stream", terminal=True),),
        config=code2wav_stream.stage_config(components),
    )
