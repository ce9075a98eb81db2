"""Qwen3-VL-2B and Qwen3-ASR-0.6B dimensions on one GPU at concurrency c: edgeomni (ONNX
Runtime CUDA, float16 engines, in-flight batching) against transformers' batched generate (bf16,
sdpa) in the same run (issue 33).

Random-weight checkpoints at the releases' dimensions (bench/vl_asr_cpu.py's, made here from
the configs, no download), built by edge-build for the GPU. For each c, c different requests
arrive together (one image of 512x512 = 256 visual tokens each, or one 10 s clip each), so the
runtime prepares them together and can share encoder calls; transformers gets the same c
requests as one batch through its processor and one ``generate`` call. Each side is timed on
two runs per c after a warm-up: one with 1 new token (time to first token: a request's time
from submission to its Finished event; transformers returns the batch at once) and one with
exactly N tokens a request (end of sequence held back; greedy).

Reported per c: TTFT p50 and max, decode tokens/s per request (edgeomni: the runner's own
count over its decode steps; transformers: (N - 1) / (t_N - t_1)), aggregate tokens/s (c * N /
wall of the N-token run), and for ASR the real-time factor (a request's wall / 10 s, p50) and
audio seconds transcribed per second. Written: OUT/gpu_vl_asr.json and OUT/gpu_vl_asr.md.

    python bench/gpu_vl_asr.py --out DIR [--concurrency 1 8 32] [--models vl,asr]
    python bench/gpu_vl_asr.py --out /tmp/gva --device cpu --size tiny   # smoke, on a CPU

With ``--size tiny --device cpu`` (float32 both sides) the c=1 greedy tokens must be identical
and the script exits 1 when they are not; on the GPU (float16 against bf16) their agreement is
reported, not required.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import PHASES, TAG, cuda_available, free_gpu, phase  # noqa: E402
from vl_asr_cpu import (  # noqa: E402
    AUDIO_SECONDS,
    BUILD,
    IMAGE_PIXELS,
    NEW_TOKENS,
    Reference,
    ensure_checkpoint,
    ensure_engine,
    machine,
    parse,
    request_body,
    write_clip,
    write_image,
)

NEEDS = {"vl": ("PIL", "Pillow"), "asr": ("soundfile", "soundfile")}  # media readers


def preflight(models: list[str]) -> None:
    """Stop before minutes of building when a model's media reader is not installed."""
    import importlib.util

    for model in models:
        module, package = NEEDS[model]
        if importlib.util.find_spec(module) is None:
            raise SystemExit(f"gpu_vl_asr: --models {model} needs {package} (not importable); "
                             f"install it into the staged site dir, or leave {model} out")  # fmt: skip


def media_files(work: Path, model: str, count: int) -> list[Path]:
    """``count`` different images or clips (same size, so every prompt has the same length)."""
    folder = work / "media"
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(count):
        path = folder / (f"image{i}.png" if model == "vl" else f"clip{i}.wav")
        if not path.is_file():
            (write_image if model == "vl" else write_clip)(path, seed=i)
        out.append(path)
    return out


# -- edgeomni --------------------------------------------------------------------------------
class Finishes:
    """Each request's Finished event, in seconds from the run's start (a listener)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.at: dict[int, float] = {}

    def __call__(self, event: Any) -> None:
        if type(event).__name__ == "Finished":  # runtime.events.Finished
            self.at.setdefault(event.index, time.perf_counter() - self.start)


def edgeomni_run(pipe: Any, requests: list[Any]) -> dict[str, Any]:
    """All requests in one pipe.run, submitted together."""
    finishes = Finishes()
    outcomes = pipe.run(requests, batch_size=len(requests), listener=finishes)
    wall = time.perf_counter() - finishes.start
    errors = [o.entry.get("error") for o in outcomes if not o.entry["ok"]]
    if errors:
        raise SystemExit(f"gpu_vl_asr: edgeomni failed: {errors[0]}")
    llm = [o.entry["stages"]["llm"] for o in outcomes]
    return {
        "wall_s": wall,
        "done_s": [finishes.at[i] for i in range(len(requests))],
        "tokens": [d["output_tokens"] for d in llm],
        "decode_tok_s": [d["decode_tokens_per_s"] for d in llm],
        "prompt_tokens": llm[0]["prompt_tokens"],
    }


def run_edgeomni(model: str, engine: Path, media: list[Path], args: argparse.Namespace) -> dict:
    from edgeomni.runtime.pipeline import Pipeline

    n = args.new_tokens[model]
    with phase(f"edgeomni {model}: open"):
        pipe = Pipeline(engine)
    runs: dict[str, Any] = {}
    for c in args.concurrency:
        first = parse(request_body(model, media[:c], 1))
        full = parse(request_body(model, media[:c], n))
        with phase(f"edgeomni {model} c={c}: warm-up"):
            edgeomni_run(pipe, first)
            edgeomni_run(pipe, full)
        ttft, done = [], []
        for r in range(args.repeats):
            with phase(f"edgeomni {model} c={c}: run {r + 1}/{args.repeats}"):
                ttft.append(edgeomni_run(pipe, first))
                done.append(edgeomni_run(pipe, full))
        runs[str(c)] = summarize_edgeomni(model, c, n, ttft, done)
        print(f"[gpu_vl_asr] edgeomni {model} c={c}: {json.dumps(runs[str(c)]['summary'])}",
              flush=True)  # fmt: skip
    del pipe
    free_gpu()
    return runs


def summarize_edgeomni(model: str, c: int, n: int, ttft: list[dict], done: list[dict]) -> dict:
    """Pooled over the timed runs: per-request percentiles; aggregate = all tokens / all wall."""
    med = statistics.median
    first = [t * 1e3 for run in ttft for t in run["done_s"]]
    e2e = [t * 1e3 for run in done for t in run["done_s"]]
    wall = sum(run["wall_s"] for run in done)
    summary = {
        "requests": c,
        "prompt_tokens": done[0]["prompt_tokens"],
        "new_tokens": n,
        "ttft_p50_ms": round(med(first), 1),
        "ttft_max_ms": round(max(first), 1),
        "e2e_p50_ms": round(med(e2e), 1),
        "decode_tok_s_per_request_p50": round(
            med(x for run in done for x in run["decode_tok_s"]), 1
        ),
        "aggregate_tok_s": round(c * n * len(done) / wall, 1),
        "fixed_work": all(len(t) == n for run in done for t in run["tokens"]),
    }
    if model == "asr":
        summary["rtf_p50"] = round(med(e2e) / 1e3 / AUDIO_SECONDS, 4)
        summary["audio_s_per_s"] = round(c * AUDIO_SECONDS * len(done) / wall, 1)
    return {"summary": summary, "tokens_c1": done[0]["tokens"][0] if c == 1 else None,
            "wall_s": [round(run["wall_s"], 4) for run in done]}  # fmt: skip


# -- transformers ----------------------------------------------------------------------------
def run_transformers(model: str, ckpt: Path, media: list[Path], args: argparse.Namespace,
                     device: str) -> dict:  # fmt: skip
    """One batched generate of the c requests (processor included in the time), after a
    warm-up at each c."""
    from gpu_common import sync

    n = args.new_tokens[model]
    free_gpu()
    with phase(f"transformers {model}: load"):
        ref = Reference(model, ckpt, device, "bfloat16" if device == "cuda" else "float32")

    def once(paths: list[Path], tokens: int) -> tuple[float, list[list[int]]]:
        sync()
        start = time.perf_counter()
        out = ref.generate(ref.inputs(paths), tokens)
        sync()
        return time.perf_counter() - start, out

    runs: dict[str, Any] = {}
    for c in args.concurrency:
        with phase(f"transformers {model} c={c}: warm-up"):
            once(media[:c], 2)
        t1, tn, tokens = [], [], []
        for r in range(args.hf_runs):
            with phase(f"transformers {model} c={c}: run {r + 1}/{args.hf_runs}"):
                t1.append(once(media[:c], 1)[0])
                wall, tokens = once(media[:c], n)
                tn.append(wall)
        first, full = statistics.median(t1), statistics.median(tn)
        summary = {
            "requests": c,
            "new_tokens": n,
            "ttft_p50_ms": round(first * 1e3, 1),  # the batch returns at once
            "ttft_max_ms": round(max(t1) * 1e3, 1),
            "e2e_p50_ms": round(full * 1e3, 1),
            "decode_tok_s_per_request_p50": round((n - 1) / (full - first), 1),
            "aggregate_tok_s": round(c * n * len(tn) / sum(tn), 1),
            "fixed_work": all(len(t) == n for t in tokens),
        }
        if model == "asr":
            summary["rtf_p50"] = round(full / AUDIO_SECONDS, 4)
            summary["audio_s_per_s"] = round(c * AUDIO_SECONDS * len(tn) / sum(tn), 1)
        runs[str(c)] = {"summary": summary, "tokens_c1": tokens[0] if c == 1 else None}
        print(f"[gpu_vl_asr] transformers {model} c={c}: {json.dumps(summary)}", flush=True)
    ref.close()
    free_gpu()
    return runs


# -- report ----------------------------------------------------------------------------------
def agreement(a: list[int] | None, b: list[int] | None) -> dict[str, Any] | None:
    """How far two greedy token lists agree (float16 and bf16 part ways at a near tie)."""
    if a is None or b is None:
        return None
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
    return {"identical": a == b, "common_prefix": same, "of": len(a)}


def markdown(result: dict[str, Any]) -> str:
    cfg = result["config"]
    what = ("Qwen3-VL-2B / Qwen3-ASR-0.6B dimensions" if cfg["size"] == "real"
            else "Tiny Qwen3-VL / Qwen3-ASR (smoke)")  # fmt: skip
    lines = [
        f"### {what}, {result['machine'].get('gpu', 'CPU')} ({result['date']})",
        "",
        f"`{result['command']}`",
        "",
        f"edgeomni: {cfg['engine_dtype']} engines on ONNX Runtime {result['machine']['onnxruntime']}"
        f" ({cfg['device']}), in-flight batching, c requests submitted together; transformers "
        f"{result['machine']['transformers']} {cfg['reference_dtype']}, one batched generate. "
        f"VL: one {IMAGE_PIXELS}x{IMAGE_PIXELS} image a request, {cfg['new_tokens']['vl']} "
        f"tokens; ASR: one {AUDIO_SECONDS:g} s clip a request, {cfg['new_tokens']['asr']} tokens.",
        "",
        "| model | c | side | TTFT p50 | TTFT max | decode tok/s a request | aggregate tok/s | "
        "RTF p50 | audio-s/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for model, sides in result["results"].items():
        for c in cfg["concurrency"]:
            for side in ("edgeomni", "transformers"):
                runs = sides.get(side)
                if not runs:
                    continue
                s = runs[str(c)]["summary"]
                lines.append(
                    f"| {model} | {c} | {side} | {s['ttft_p50_ms']} ms | {s['ttft_max_ms']} ms | "
                    f"{s['decode_tok_s_per_request_p50']} | {s['aggregate_tok_s']} | "
                    f"{s.get('rtf_p50', '')} | {s.get('audio_s_per_s', '')} |"
                )
    return "\n".join(lines) + "\n"


# -- main ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--size", choices=("real", "tiny"), default="real")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="engine device")
    p.add_argument("--models", default="vl,asr")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--vl-new-tokens", type=int, default=NEW_TOKENS["vl"])
    p.add_argument("--asr-new-tokens", type=int, default=NEW_TOKENS["asr"])
    p.add_argument("--repeats", type=int, default=2, help="edgeomni timed runs per c")
    p.add_argument("--hf-runs", type=int, default=2, help="transformers timed runs per c")
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--stop-after", choices=("build",))
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edgeomni-gpu-vl-asr")
    args = p.parse_args(argv)
    args.concurrency = sorted(set(args.concurrency))
    args.models = [m for m in args.models.split(",") if m]
    args.new_tokens = {"vl": args.vl_new_tokens, "asr": args.asr_new_tokens}
    args.dtype = "float16" if args.device == "cuda" else "float32"
    if min(args.new_tokens.values()) < 2:
        p.error("new tokens must be at least 2 (decode is timed from the second)")
    return args


def main(argv: list[str] | None = None) -> int:
    import logging

    args = parse_args(argv)
    preflight(args.models)
    TAG[0] = "gpu_vl_asr"
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("edge-build").setLevel(logging.INFO)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    on_gpu = cuda_available()
    if args.device == "cuda" and not on_gpu:
        print("[gpu_vl_asr] WARNING: --device cuda but torch sees no GPU", flush=True)
    from edgeomni.export.family import BuildArgs

    batch = max(args.concurrency)
    ckpts, engines, media = {}, {}, {}
    for model in args.models:
        with phase(f"{model}: checkpoint"):
            ckpts[model] = ensure_checkpoint(args.work, model, args.size)
        engines[model] = args.work / f"{ckpts[model].name}-{args.device}-{args.dtype}-b{batch}"
        build_args = BuildArgs(batch, *BUILD[model], device=args.device, dtype=args.dtype)
        with phase(f"{model}: build"):
            ensure_engine(ckpts[model], engines[model], build_args)
        media[model] = media_files(args.work, model, batch)
    if args.stop_after == "build":
        return 0

    results: dict[str, dict[str, Any]] = {}
    for model in args.models:
        results[model] = {"edgeomni": run_edgeomni(model, engines[model], media[model], args)}
        if not args.skip_transformers:
            results[model]["transformers"] = run_transformers(
                model, ckpts[model], media[model], args, "cuda" if on_gpu else "cpu"
            )
    same = {}
    for model, sides in results.items():
        if 1 in args.concurrency and "transformers" in sides:
            same[model] = agreement(sides["edgeomni"]["1"]["tokens_c1"],
                                    sides["transformers"]["1"]["tokens_c1"])  # fmt: skip
    info = machine()
    if on_gpu:
        import torch

        info["gpu"] = torch.cuda.get_device_name(0)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": shlex.join([sys.executable, *(argv or sys.argv)]),
        "machine": info,
        "config": {
            "size": args.size,
            "device": args.device,
            "engine_dtype": args.dtype,
            "reference_dtype": "bfloat16" if on_gpu else "float32",
            "concurrency": args.concurrency,
            "new_tokens": args.new_tokens,
            "build": {
                m: {
                    "max_batch_size": batch,
                    "max_input_len": BUILD[m][0],
                    "max_kv_cache_capacity": BUILD[m][1],
                }
                for m in args.models
            },  # fmt: skip
            "repeats": args.repeats,
            "hf_runs": args.hf_runs,
        },
        "phases_s": PHASES,
        "same_tokens_c1": same,
        "results": results,
    }
    text = markdown(result)
    (args.out / "gpu_vl_asr.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "gpu_vl_asr.md").write_text(text)
    print("\n" + text)
    print(f"[gpu_vl_asr] same greedy tokens at c=1: {json.dumps(same)}")
    print(f"[gpu_vl_asr] phases (s): {json.dumps(PHASES)}")
    summaries = [run["summary"] for sides in results.values() for side in sides.values()
                 for run in side.values()]  # fmt: skip
    ok = all(s["fixed_work"] for s in summaries)
    if args.device == "cpu" and not on_gpu:  # float32 both sides: the tokens must agree
        ok = ok and all(s is None or s["identical"] for s in same.values())
    if not ok:
        print("[gpu_vl_asr] FAILED: a run did not do the fixed work, or tokens differ on the CPU")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
