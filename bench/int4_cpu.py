"""int4 weights on this CPU: edgeomni's int4 engines against its fp32 engine and transformers.

Builds a random-weight checkpoint at Qwen3-0.6B dimensions (no download; random weights measure
speed, not quality: tests/test_trained_quality.py measures quality), then builds it three ways
with edge-build (ONNX Runtime, CPU): fp32, ``--quantization int4_rtn`` (the lm_head int4 too, the
default) and the same with ``--no-quantize-lm-head``. It times greedy decode of one prompt at batch 1 through edge-infer's
pipeline for each, and transformers' fp32 eager ``generate`` on the same checkpoint, and compares
each engine's step with its bandwidth bound: the bytes it reads a step (its weights as stored in
the engine, plus the KV cache at mid-generation) / the best measured read bandwidth.

With ``--tts``, instead: Qwen3-TTS CustomVoice at 0.6B dimensions (random weights, made by
bench/qwen3_tts_cpu.py's upstream-class maker and cached there), built fp32 and int4 (talker and
code predictor quantized; code2wav stays float), each run through edgeomni's pipeline for the
same text, greedy, a fixed number of codec frames: RTF (wall / audio seconds) against fp32.

    python bench/int4_cpu.py [--work DIR] [--new-tokens 64] [--repeats 3] [--group-size 32]
    python bench/int4_cpu.py --tts [--frames 60] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from llm_decode_cpu import (  # noqa: E402 - the fp32 bench's pieces, one definition each
    QWEN3_06B,
    decode_parser,
    make_checkpoint,
    read_bandwidth_gbs,
    time_edgeomni,
    time_transformers,
)


def build(ckpt: Path, engine: Path, capacity: int, **quant: object) -> float:
    from edgeomni.builder.build import build as edge_build
    from edgeomni.export.family import BuildArgs

    if (engine / "multistage_config.json").is_file():
        return 0.0
    start = time.perf_counter()
    edge_build(ckpt, engine, BuildArgs(1, 256, capacity, **quant))  # type: ignore[arg-type]
    return time.perf_counter() - start


def engine_bytes(engine: Path) -> int:
    """What the engine holds: the model file and its external data (weights, almost all)."""
    return sum(p.stat().st_size for p in engine.glob("llm.onnx*"))


def kv_bytes(layers: int, context: int) -> int:
    c = QWEN3_06B
    return 4 * 2 * layers * c["num_key_value_heads"] * c["head_dim"] * context


def main() -> int:
    p = decode_parser(__doc__, "edgeomni-bench")
    p.add_argument("--group-size", type=int, default=32, choices=(32, 64, 128))
    p.add_argument("--bandwidth-probes", type=int, default=5, help="before and after the runs")
    p.add_argument("--no-transformers", action="store_true", help="skip the transformers run")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--tts", action="store_true", help="Qwen3-TTS 0.6B RTF instead (see above)")
    p.add_argument("--frames", type=int, default=60, help="--tts: codec frames per utterance")
    p.add_argument("--threads", type=int, default=2, help="--tts: intra-op threads")
    args = p.parse_args()
    if args.tts:
        return tts(args)

    ckpt = args.work / f"qwen3-0.6b-L{args.layers}"
    make_checkpoint(ckpt, args.layers)
    g = args.group_size
    engines = {
        "fp32": (args.work / f"engine-L{args.layers}", {}),
        f"int4 g{g}, float lm_head": (
            args.work / f"engine-L{args.layers}-int4-g{g}-float-head",
            {"quantization": "int4_rtn", "group_size": g, "quantize_lm_head": False},
        ),
        f"int4 g{g}": (
            args.work / f"engine-L{args.layers}-int4-g{g}-head",
            {"quantization": "int4_rtn", "group_size": g, "quantize_lm_head": True},
        ),
    }
    build_s = {name: build(ckpt, path, 512, **q) for name, (path, q) in engines.items()}
    probes = [read_bandwidth_gbs() for _ in range(args.bandwidth_probes)]
    runs = {name: time_edgeomni(path, args.new_tokens, args.repeats)
            for name, (path, _) in engines.items()}  # fmt: skip
    eager = (
        None
        if args.no_transformers
        else time_transformers(ckpt, engines["fp32"][0], "eager", args.new_tokens, args.repeats)
    )
    probes += [read_bandwidth_gbs() for _ in range(args.bandwidth_probes)]
    best_bw = max(max(x.values()) for x in probes)
    fp32 = runs["fp32"]
    context = fp32["prompt_tokens"] + args.new_tokens // 2
    rows = {}
    for name, (path, _) in engines.items():
        r = runs[name]
        read = engine_bytes(path) + kv_bytes(args.layers, context)
        bound_ms = read / (best_bw * 1e9) * 1e3
        rows[name] = {
            "engine_gb": round(engine_bytes(path) / 1e9, 3),
            "step_ms": round(r["step_ms"], 2),
            "step_ms_median": round(r["step_ms_median"], 2),
            "tok_s": round(1e3 / r["step_ms"], 2),
            "speedup_vs_fp32": round(fp32["step_ms"] / r["step_ms"], 2),
            "speedup_vs_transformers_eager": (
                round(eager["step_ms"] / r["step_ms"], 2) if eager else None
            ),
            "bytes_per_step_gb": round(read / 1e9, 3),
            "bound_step_ms": round(bound_ms, 2),
            "fraction_of_bandwidth_bound": round(bound_ms / r["step_ms"], 3),
            "greedy_agreement_with_fp32": sum(
                a == b for a, b in zip(r["tokens"], fp32["tokens"], strict=True)
            )
            / len(fp32["tokens"]),
            "build_s": round(build_s[name], 1),
        }
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "layers": args.layers,
        "prompt_tokens": fp32["prompt_tokens"],
        "new_tokens": args.new_tokens,
        "best_read_bandwidth_gbs": round(best_bw, 2),
        "transformers_eager_step_ms": round(eager["step_ms"], 2) if eager else None,
        "transformers_tokens_equal_fp32": eager["tokens"] == fp32["tokens"] if eager else None,
        "engines": rows,
    }
    print(json.dumps(result, indent=2))
    print("\n| engine | GB | step ms | tok/s | vs fp32 | vs transformers eager | % of bound |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['engine_gb']} | {r['step_ms']} | {r['tok_s']} | "
              f"{r['speedup_vs_fp32']}x | {r['speedup_vs_transformers_eager']}x | "
              f"{100 * r['fraction_of_bandwidth_bound']:.0f}% |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def tts_engines(
    args: argparse.Namespace, calls: tuple[str, ...] = ("frame",),
    precisions: tuple[str, ...] = ("fp32", "int4"), batch: int = 1,
) -> tuple[dict[str, Path], dict]:
    """The Qwen3-TTS CustomVoice 0.6B engines, fp32 and int4 (``args.group_size``; those of
    ``precisions``), each with its code predictor called as ``calls`` say (edge-build's
    --code-predictor-calls: frame, the CPU's default, or steps), built for ``batch`` rows, made
    once and cached (bench/qwen3_tts_cpu.py's checkpoint and limits), and the request body of
    ``args.frames`` greedy frames."""
    import qwen3_tts_cpu as tb

    work = Path(tempfile.gettempdir()) / "edgeomni-tts-bench" / "0.6b"
    work.mkdir(parents=True, exist_ok=True)
    ns = argparse.Namespace(size="0.6b", threads=args.threads, ref_seconds=5.0,
                            frames=args.frames, sampled=False)  # fmt: skip
    tb.checkpoints(ns, work, tb.reference_python())
    quant = {"quantization": "int4_rtn", "group_size": args.group_size}
    engines = {}
    kinds = {"fp32": ("fp32", {}), "int4": (f"int4 g{args.group_size}", quant)}
    variants = [(f"{kinds[p][0]}, cp {how}", how, kinds[p][1])
                for p in precisions for how in calls]  # fmt: skip
    for name, how, extra in variants:
        precision = f"-int4-g{args.group_size}" if extra else "-fp32"
        rows = f"-b{batch}" if batch > 1 else ""
        engine = work / f"custom_voice-engine{precision}-{how}{rows}"
        if not (engine / "multistage_config.json").is_file():
            spec = {"ckpt": str(work / "custom_voice"), "engine": str(engine),
                    "limits": {**tb.LIMITS, **extra, "code_predictor_calls": how,
                               "max_batch_size": batch}}  # fmt: skip
            built = tb.worker(sys.executable, "_build", spec, args.threads, timeout=7200)
            if "error" in built:
                raise SystemExit(built["error"])
        engines[name] = engine
    return engines, tb.edgeomni_body(ns, None)


def tts(args: argparse.Namespace) -> int:
    """Qwen3-TTS CustomVoice 0.6B: fp32 against int4 engines, RTF through the pipeline."""
    import statistics

    import qwen3_tts_cpu as tb

    engines, body = tts_engines(args)
    rows = {}
    for name, engine in engines.items():
        spec = {"engine": str(engine), "body": body, "threads": args.threads, "whole": False,
                "warmup": 1, "repeats": args.repeats}  # fmt: skip
        run = tb.worker(sys.executable, "_edgeomni", spec, args.threads, timeout=7200)
        if "error" in run:
            raise SystemExit(run["error"])
        wall = statistics.median(r["wall_s"] for r in run["runs"])
        audio = run["runs"][0]["audio_s"]
        rows[name] = {"engine_gib": tb.dir_gib(engine), "wall_s": wall, "audio_s": audio,
                      "rtf": round(wall / audio, 3), "codes": run["codes"],
                      "walls": [r["wall_s"] for r in run["runs"]]}  # fmt: skip
    fp32 = rows["fp32, cp frame"]
    reference = fp32["codes"]
    for r in rows.values():
        r["speedup_vs_fp32"] = round(fp32["rtf"] / r["rtf"], 2)
        same = sum(a == b for a, b in zip(r.pop("codes"), reference, strict=False))
        r["frames_equal_fp32"] = f"{same}/{len(reference)}"
    result = {"date": time.strftime("%Y-%m-%d"), "frames": args.frames,
              "threads": args.threads, "engines": rows}  # fmt: skip
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
