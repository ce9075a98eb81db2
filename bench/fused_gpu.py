"""Decoder steps on one GPU: the fused backend (runtime/fused_engine.py) against ONNX Runtime's
CUDA provider, the same random float16 weights in one process, at real dimensions.

Two decoders: Qwen3-0.6B (28 layers, decode at a context of ~64) and Qwen3-TTS 0.6B's code
predictor (5 layers, 15 heads; a frame is 15 one-token steps, each with its own head). Both
engines run through the runtime's DecoderSession with CUDA graphs (what a stage runs). An LLM
step is fed host embeddings and waited for; the sampling of the next token is not timed. The
code predictor is built with its in-engine sampler, as a cuda build is: a frame's steps are
queued back to back as runtime/speech/code_predictor.py queues them (each step fed the embedding
of the code the one before drew, on the device; the drawn codes copied aside) and the host
waits once, at the end of the frame; the fused engine runs the frame as one CUDA graph, as the
runtime does (``fused_calls_ms``: a graph a call). The figure is wall time per unit after
warm-up. The fused engine is timed as it runs (programmatic dependent launch on sm_90+ for
calls of fewer than OVERLAP_MAX_TOKENS rows) and again with the other choice (off below, on
from there). The HBM
bound is the bytes a step must read (weights, the KV cache) over the measured device copy
bandwidth. ``fused_qk_rope_apart_ms``: the fused engine with qk_rope a kernel of its own before
the attention (as before decode attention did it). ``--int4 GROUP`` builds both sides with
int4_rtn matrices. Run it on the GPU machine:

    python bench/fused_gpu.py [--batch 1 8 32] [--steps 50] [--int4 32] [--out DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backend_pair import copy_bandwidth_gbs  # noqa: E402

DECODERS = {
    # name: DecoderConfig fields, the context decode steps run at, and steps per measured unit
    "qwen3_0.6b": ({"hidden_size": 1024, "num_layers": 28, "num_heads": 16, "num_kv_heads": 8,
                    "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936}, 64, 1),
    "code_predictor": ({"hidden_size": 1024, "num_layers": 5, "num_heads": 16, "num_kv_heads": 8,
                        "head_dim": 128, "intermediate_size": 3072, "vocab_size": 2048,
                        "lm_heads": 15, "sampler": True}, 2, 15),
}  # fmt: skip


def build(name: str, work: Path, int4: int = 0, ort_too: bool = True) -> tuple[Path, Path, dict]:
    """Random float16 weights exported once: the ONNX Runtime CUDA engine and the fused one,
    compiled from the same graph; ``int4`` (a group size): both from the one int4_rtn pass's
    graph, a single LM head too (MatMulNBits on ONNX Runtime's side, the plan's int4 codes on
    the other; the code predictor's stacked heads stay float16 on both)."""
    import torch
    from safetensors.numpy import save_file

    from edgeomni.builder.fused_plan import compile_file
    from edgeomni.builder.onnxruntime import build_engine
    from edgeomni.export.common.decoder import CausalLM, DecoderConfig
    from edgeomni.export.common.onnx_export import export_causal_lm
    from edgeomni.export.family import BuildArgs

    fields, _, _ = DECODERS[name]
    fields = dict(fields)
    sampler = fields.pop("sampler", False)
    cfg = DecoderConfig(rms_norm_eps=1e-6, rope_theta=1e6, **fields)
    torch.manual_seed(0)
    module = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.uniform_(0.8, 1.2)
    reference = copy.deepcopy(module)  # float32, for the logits both backends should give
    module = module.half()
    raw = work / name / "raw" / "model.onnx"
    tables = None
    if sampler:  # each head's code embeddings (the next step's input), float16 as the module
        tables = torch.randn(cfg.lm_heads, cfg.vocab_size, cfg.hidden_size).half()
    # a sampler's embeddings feed the next call: its inputs stay float16, as in a build
    export_causal_lm(module, raw, logits_topk=64, float32_embeds=not sampler,
                     sampler_tables=tables)  # fmt: skip
    args = BuildArgs(32, 64, 512, device="cuda", dtype="float16")
    ort = work / name / "ort" / "model.onnx"
    ort.parent.mkdir(parents=True, exist_ok=True)
    graph = raw
    if int4:
        from edgeomni.builder.quantize import Quantization, quantize_file

        graph = raw.with_name("model.int4.onnx")
        quantize_file(raw, graph, Quantization("int4_rtn", int4))
    if ort_too:
        build_engine(graph, ort, args)
    spec, tensors = compile_file(graph)
    path = work / name / "fused" / "model.fused.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    meta = {"num_hidden_layers": cfg.num_layers, "num_key_value_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim, "dtype": "float16", "vocab_size": cfg.vocab_size,
            "hidden_size": cfg.hidden_size, "fused": spec,
            # what one step reads: every weight but the heads it does not use
            "weight_bytes": weight_bytes(module, cfg, int4),
            "reference": reference}  # fmt: skip
    return ort, path, meta


def weight_bytes(module, cfg, int4: int) -> int:  # noqa: ANN001
    """What one step reads of the weights: all but the LM heads it does not use; with int4
    the matrices at half a byte a weight and 2 bytes a group's scale (stacked heads float)."""
    total = 0
    for name, p in module.named_parameters():
        n = p.numel()
        if name.startswith("lm_head"):
            n //= cfg.lm_heads
        matrix = p.dim() > 1 and "embed" not in name
        matrix = matrix and not (name.startswith("lm_head") and cfg.lm_heads > 1)
        total += n // 2 + n // int4 * 2 if int4 and matrix else n * 2
    return total


def inputs(meta: dict, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The prefill embeddings and a step's, row r the same at every batch size."""
    _, context, _ = DECODERS[meta["name"]]
    rng = np.random.default_rng(0)
    h = meta["hidden_size"]
    x = (rng.standard_normal((32, context, h)) * 0.5).astype(np.float32)
    step = (rng.standard_normal((32, 1, h)) * 0.5).astype(np.float32)
    return x[:batch], step[:batch]


def reference_logits(meta: dict) -> np.ndarray:
    """Row 0's first-step logits from the float32 module on the CPU (the plugin ops' torch
    versions), after the same prefill."""
    import torch

    module, cfg = meta["reference"], meta["reference"].cfg
    x, step = inputs(meta, 1)
    cache = [torch.zeros(1, cfg.num_kv_heads, 512, cfg.head_dim) for _ in range(2 * cfg.num_layers)]
    head = (torch.zeros(1, dtype=torch.int64),) if cfg.lm_heads > 1 else ()
    n = x.shape[1]
    with torch.no_grad():
        out = module(torch.from_numpy(x), torch.arange(n)[None], torch.zeros(1, dtype=torch.int32),
                     torch.full((1,), n, dtype=torch.int32), torch.full((1,), n - 1),
                     *head, *cache)  # fmt: skip
        cache = list(out[1:])
        out = module(torch.from_numpy(step), torch.full((1, 1), n), torch.full((1,), n, dtype=torch.int32),
                     torch.ones(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int64),
                     *head, *cache)  # fmt: skip
    return out[0].numpy()[0]


def time_calls(engine, meta: dict, batch: int, steps: int, persistent: tuple[int, ...] = (),
               runs: dict | None = None) -> tuple:  # fmt: skip
    """ms per measured unit (a decode step, or a code-predictor frame of 15 steps), the first
    unit's logits (for the backends' agreement), the device's ms per unit (fused) and, where
    the engine captures a frame's calls as one graph (the fused code predictor, as
    runtime/speech/code_predictor.py runs it), ms per frame that way; ``persistent``: the frame
    also as one persistent kernel at each of these blocks an SM, its timing into ``runs``."""
    from edgeomni.graph_schema.state import kv_tensors
    from edgeomni.runtime.decoder import DecoderSession, text_positions
    from edgeomni.runtime.row_state import RowState

    name = meta["name"]
    _, context, per_unit = DECODERS[name]
    layers = (meta["num_hidden_layers"], meta["num_key_value_heads"], meta["head_dim"])
    kv = RowState(kv_tensors(*layers, meta.get("dtype", "float32")), batch, 512,
                  engine.buffers)
    outputs = {"logits": (meta["vocab_size"],)}
    draws = "sampled_ids" in engine.output_names
    if draws:
        outputs.update(sampled_ids=(), sampled_embeds=(meta["hidden_size"],))
    session = DecoderSession(engine, kv, batch, outputs)
    heads = "lm_head_index" in engine.input_names
    x, step_x = (a.astype(engine.input_types["inputs_embeds"]) for a in inputs(meta, batch))
    memory = engine.buffers
    # greedy, as the engine takes it: top-k 1 at temperature 1, uniform 0 (host arrays, uploaded
    # once: they do not change)
    greedy = {"sample_uniform": np.zeros(batch), "sample_temperature": np.ones(1),
              "sample_top_k": np.ones(1, np.int64), "sample_top_p": np.ones(1)} if draws else {}
    drawn = memory.zeros((per_unit, batch), np.int64) if draws else None
    zero, n = np.zeros(batch, np.int32), np.full(batch, context, np.int32)
    extra = {"lm_head_index": np.zeros(1, np.int64)} if heads else {}
    session.run(x, text_positions(zero, context, False), zero, n, n - 1, **extra, **greedy)
    one = np.ones(batch, np.int32)

    def unit(past: int, first: bool = False, download: bool = True) -> np.ndarray | None:
        """A unit's calls; with ``first``, the first call's logits (read after it)."""
        logits, x = None, step_x
        for j in range(per_unit):
            p = np.full(batch, past + j, np.int32)
            feeds = {"lm_head_index": np.array([j], np.int64)} if heads else {}
            out = session.run(x, text_positions(p, 1, False), p, one, np.zeros(batch, np.int64),
                              tag=j, wait=not draws, **feeds, **greedy)  # fmt: skip
            if first and j == 0:
                logits = np.array(out["logits"], np.float32)
            if draws:  # the next step's input where the engine left it; the code set aside
                memory.copy_into(memory.view(memory.rows(drawn, 1, j), (batch,)),
                                 out.buffer("sampled_ids"))  # fmt: skip
                x = memory.view(out.buffer("sampled_embeds"), (batch, 1, meta["hidden_size"]))
        if draws and download:
            memory.to_host(drawn)  # the frame's codes: the one wait
        return logits

    def timed(run) -> float:  # noqa: ANN001
        start = time.perf_counter()
        for _ in range(steps):
            run()  # the same positions: each unit overwrites the last's cache slots
        return (time.perf_counter() - start) / steps * 1e3

    logits = unit(context, first=True)  # captures the graphs
    wall = timed(lambda: unit(context))
    fused = type(engine).__name__ == "FusedEngine"
    device = replay_ms(session, per_unit, steps) if fused else None
    graph_ms = None
    if draws and getattr(engine, "captures_sequences", False):
        graph = engine.sequence_graph(lambda: unit(context, download=False))

        def frame() -> None:
            graph.launch()
            memory.to_host(drawn)

        frame()
        graph_ms = timed(frame)
        codes = np.array(memory.to_host(drawn))
        runs = {} if runs is None else runs
        for blocks in persistent:  # the frame as one persistent kernel (issue 55), into runs
            launch = persistent_frame(engine, lambda: unit(context, download=False), blocks)

            def program(launch=launch) -> None:  # noqa: ANN001
                launch()
                memory.to_host(drawn)

            program()
            same = bool(np.array_equal(memory.to_host(drawn), codes))
            runs[blocks] = {"ms": round(timed(program), 3), "same_codes": same,
                            "blocks": launch.blocks, "steps": launch.steps}
    return wall, logits, device, graph_ms


def persistent_frame(engine, queue, min_blocks: int):  # noqa: ANN001, ANN201
    """The calls ``queue`` makes as one persistent kernel (bench/persistent_cuda.py), the
    comparison the product does not run: sequence_graph's capture run records them instead
    (its graph is empty), then the program is built and its table uploaded. Returns a launch
    function (with the grid's ``blocks`` and the program's ``steps``)."""
    import persistent_cuda as pc

    from edgeomni.plugins import decoder_cuda as dc

    program = pc.Program(min_blocks=min_blocks)

    def recorded() -> None:
        if engine._sequence_mode != "capture":  # the load run: host feeds staged
            queue()
            return
        attention = [a for a in (engine.attention, engine.attention_qk) if a is not None]
        with pc.recording(program, attention):
            queue()

    engine.sequence_graph(recorded)
    loaded = pc.Loaded(program, dc.cubin)
    table = engine.buffers.zeros(program.table().shape, np.uint64)
    engine.buffers.upload(table, program.table())
    barrier = engine.buffers.zeros((2,), np.uint32)

    def launch() -> None:
        loaded.launch(table.ptr, barrier.ptr, engine.cu_stream)

    launch.blocks, launch.steps = loaded.blocks, len(program.steps)  # type: ignore[attr-defined]
    launch.held = (loaded, table, barrier)  # type: ignore[attr-defined]
    return launch


def replay_ms(session, per_unit: int, steps: int) -> float | None:
    """The device's time per unit: a fused engine's captured graphs replayed back to back,
    no host work between them (None for other engines)."""
    from edgeomni.runtime import memory

    graphs = [g for slot in session.state.graph_slots.values()
              for g in getattr(slot.binding, "_graphs", {}).values()]  # fmt: skip
    if not graphs:
        return None
    cudart, s = memory._cudart(), memory.stream(0)
    memory.synchronize(0)
    start = time.perf_counter()
    for _ in range(steps):
        for g in graphs:
            memory._check(cudart.cudaGraphLaunch(g, s), "cudaGraphLaunch")
    memory.synchronize(0)
    return (time.perf_counter() - start) / steps / len(graphs) * per_unit * 1e3


def ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--decoders", nargs="+", default=list(DECODERS))
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edgeomni-fused")
    p.add_argument("--out", type=Path)
    p.add_argument("--int4", type=int, choices=(32, 64, 128), default=0, metavar="GROUP",
                   help="int4_rtn matrices on both sides, one scale a row and GROUP weights")
    p.add_argument("--no-onnxruntime", action="store_true",
                   help="the fused engine alone (where onnxruntime-gpu is not installed)")
    p.add_argument("--persistent", type=int, nargs="*", default=[], metavar="BLOCKS",
                   help="also time a frame as one persistent kernel (bench/persistent_cuda.py) "
                        "with these least blocks an SM the compiler allows (1, 2)")
    args = p.parse_args()

    from edgeomni.runtime import fused_engine as fe
    from edgeomni.runtime.engine import OrtEngine
    from edgeomni.runtime.fused_engine import FusedEngine

    bw = copy_bandwidth_gbs()
    rows = []
    for name in args.decoders:
        start = time.perf_counter()
        ort_path, fused_path, meta = build(name, args.work / (f"int4-{args.int4}" if args.int4
                                                              else "float16"), args.int4,
                                         not args.no_onnxruntime)  # fmt: skip
        meta["name"] = name
        built_s = time.perf_counter() - start
        start = time.perf_counter()
        fused = FusedEngine(fused_path, meta, cuda_graphs=True)
        load_s = time.perf_counter() - start
        overlap_on = fused.overlap
        ort = None if args.no_onnxruntime else OrtEngine(ort_path, device="cuda", cuda_graphs=True)
        _, context, per_unit = DECODERS[name]
        truth = reference_logits(meta)
        for batch in args.batch:
            fused.overlap = overlap_on
            persistent: dict[int, dict] = {}
            calls_ms, fused_logits, fused_device, graph_ms = time_calls(
                fused, meta, batch, args.steps, tuple(args.persistent), persistent)  # fmt: skip
            fused_ms = calls_ms if graph_ms is None else graph_ms  # as the runtime runs it
            alt_ms = alt_device = alt_overlap = None
            if overlap_on:  # the other choice of programmatic dependent launch, for the record:
                # off below OVERLAP_MAX_TOKENS rows (where the engine uses it), on from there
                alt_overlap = batch >= fe.OVERLAP_MAX_TOKENS
                held, fe.OVERLAP_MAX_TOKENS = fe.OVERLAP_MAX_TOKENS, 1 << 30
                fused.overlap = alt_overlap
                try:
                    alt_calls, _, alt_device, alt_graph = time_calls(fused, meta, batch, args.steps)
                    alt_ms = alt_calls if alt_graph is None else alt_graph
                finally:
                    fe.OVERLAP_MAX_TOKENS = held
                fused.overlap = True
            # decode steps with qk_rope then attention (the attention kernel not doing them)
            held, fused.attention_qk = fused.attention_qk, None
            try:
                split_calls, _, _, split_graph = time_calls(fused, meta, batch, args.steps)
            finally:
                fused.attention_qk = held
            split_ms = split_calls if split_graph is None else split_graph
            ort_ms, ort_logits = float("nan"), fused_logits
            if ort is not None:
                ort_ms, ort_logits, _, _ = time_calls(ort, meta, batch, args.steps)
            scale = np.abs(truth).max()
            errors = {k: float(f"{np.abs(v[0] - truth).max() / scale:.2e}")
                      for k, v in (("onnxruntime", ort_logits), ("fused", fused_logits))}  # fmt: skip
            kv_bytes = 2 * meta["num_hidden_layers"] * meta["num_key_value_heads"] * 128 * 2
            traffic = per_unit * (meta["weight_bytes"] + kv_bytes * (context + 8) * batch)
            bound = traffic / (bw * 1e9) * 1e3
            diff = np.abs(fused_logits - ort_logits).max() / np.abs(ort_logits).max()
            rows.append({
                "decoder": name, "batch": batch, "unit": "frame" if per_unit > 1 else "step",
                "onnxruntime_ms": round(ort_ms, 3), "fused_ms": round(fused_ms, 3),
                "speedup": round(ort_ms / fused_ms, 2), "hbm_bound_ms": round(bound, 3),
                "fused_over_bound": round(fused_ms / bound, 2),
                "onnxruntime_over_bound": round(ort_ms / bound, 2),
                "logits_rel_diff": float(f"{diff:.2e}"),
                "row0_error_vs_float32": errors,
                "fused_device_ms": None if fused_device is None else round(fused_device, 3),
                # a frame's calls each from its own graph, where fused_ms is the frame's graph
                "fused_calls_ms": None if graph_ms is None else round(calls_ms, 3),
                "fused_overlap": overlap_on and batch < fe.OVERLAP_MAX_TOKENS,
                "fused_other_overlap": alt_overlap,
                "fused_other_ms": None if alt_ms is None else round(alt_ms, 3),
                "fused_other_device_ms": None if alt_device is None else round(alt_device, 3),
                "fused_qk_rope_apart_ms": round(split_ms, 3),
                "same_argmax": bool((fused_logits.argmax(-1) == ort_logits.argmax(-1)).all()),
                # the frame as one persistent kernel: ms, codes equal to the graph's, grid
                "fused_persistent": persistent or None,
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        print(json.dumps({"decoder": name, "export_and_build_s": round(built_s, 1),
                          "fused_load_s": round(load_s, 1)}), flush=True)  # fmt: skip
    import torch

    result = {
        "date": time.strftime("%Y-%m-%d"), "command": shlex.join([sys.executable, *sys.argv]),
        "gpu": torch.cuda.get_device_name(0), "host": platform.machine(),
        "onnxruntime": None if args.no_onnxruntime else ort_version(), "copy_bandwidth_gbs": round(bw, 1), "rows": rows,
    }  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fused_gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
