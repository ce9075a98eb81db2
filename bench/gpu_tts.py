"""Qwen3-TTS text to speech on one GPU: edgeomni against upstream qwen-tts 0.1.1, same run.

A random-weight Qwen3-TTS CustomVoice checkpoint at the release's 0.6B or 1.7B dimensions is
written on the machine (export/tiny_tts.py, no download, no qwen-tts needed), edge-build builds
it (ONNX Runtime CUDA, float16 talker and code predictor, float32 code2wav; --quantization:
their linear weights int4, --group-size weights a scale), and each side runs in a fresh
process of its own, one after the other, at concurrency c = 1, 4, 16, 32:

- edgeomni: c requests submitted together in one Pipeline.run (in-flight batching); first
  audio is each request's first AudioChunk with samples, from the submission; the vocoder runs
  in windows while the talker runs (first window --first-window-frames, then doubling up to
  --window-frames), or (--code2wav-streaming stateful) as the stateful step, each frame decoded
  once in chunks (the first --first-chunk-frames, then doubling), or (--whole-utterance) each
  utterance whole once its codes are complete,
  the requests the talker finishes together in shared calls. A request's RTF is its last
  event's time over its audio.
- upstream: qwen-tts 0.1.1's Qwen3TTSModel (transformers 4.57.3, PyTorch eager, bf16, sdpa),
  one batched generate_custom_voice call of c texts (left-padded). It returns whole audio
  only, so its first audio is the call's wall time, and each request's RTF is wall / its audio.

Both sides: the same text and speaker, non-streaming text mode, greedy talker and sub-talker
(--sampled: the release's sampling) with repetition penalty 1.05, exactly --frames codec frames
a request (the codec EOS row of the talker's head is zeroed, so neither stops early).
Throughput is audio-seconds per wall-second: all requests' audio over the runs' wall time.
Written: OUT/gpu_tts.json (raw, config, machine, versions, commands) and OUT/gpu_tts.md (the
table, also printed), after each side, so a command cut short still leaves what it measured.

    python bench/gpu_tts.py --size 0.6b --out OUT [--concurrency 1 4 16 32] [--frames 100]
        [--only edgeomni|upstream] [--stop-after checkpoint|build] [--time-limit 560]
        [--quantization int4_rtn|int4_awq] [--group-size 32|64|128] [--backend fused]
    python bench/gpu_tts.py --size 0.6b --backend onnxruntime fused --out OUT   # both, one run
    python bench/gpu_tts.py --size tiny --device cpu --concurrency 1 2 --out /tmp/gpu_tts_tiny
    python bench/gpu_tts.py --size 0.6b --only edgeomni --quantization int4_rtn --out OUT

``--work`` keeps the checkpoint, the engines (an int4 one in a folder of its own) and each
side's finished concurrencies (keyed by their settings), so a command stopped by a time limit
continues where it stopped when run again (--fresh: measure again). ``--time-limit S``: stop
starting work S seconds after the start (a worker is killed at the limit) and write what was
measured; meant for a machine whose commands are cut at 10 minutes. On cuda the upstream
worker runs this python with PYTHONPATH set to --upstream-pythonpath only (default
/tmp/site-qwen-tts, staged by bench/stage_qwen_tts_gpu.sh); with --device cpu, the reference
venv's python (tests/qwen_tts_reference/make_venv.py) without PYTHONPATH. Every other worker
keeps this process's environment.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
# each standard library only at import: the upstream worker's interpreter loads them too
from backend_pair import (  # noqa: E402
    BACKENDS,
    compare,
    copy_bandwidth_gbs,
    run_backends,
    tts_traffic,
    write_pair,
)
from gpu_tts_report import (  # noqa: E402
    PEERS,
    SIDES,
    TARGETS,
    comparisons,
    machine,
    markdown,
    same_codes,
)
from gpu_tts_workers import TAG, WORKERS, say, summarize  # noqa: E402
from qwen3_tts_cpu import (  # noqa: E402
    GREEDY,
    LANGUAGE,
    RELEASE_SAMPLING,
    SAMPLES_PER_FRAME,
    SPEAKER,
    SR,
    TEXT,
    reference_python,
    set_windows,
    source_fingerprint,
)

PHASES: dict[str, float] = {}
MIN_WORKER_S = 20.0  # no worker starts with less of the time limit left


# -- the driver -------------------------------------------------------------------------------
def phase_start(name: str) -> float:
    say(f"{name} ...")
    return time.perf_counter()


def phase_end(name: str, start: float) -> None:
    PHASES[name] = round(PHASES.get(name, 0.0) + time.perf_counter() - start, 1)
    say(f"{name} done in {time.perf_counter() - start:.1f} s")


def run_worker(name: str, python: str, spec: dict, env: dict[str, str], log: Path,
               timeout: float | None, commands: list) -> dict:  # fmt: skip
    """Run worker ``name`` under ``python``: its output goes to ``log`` (its TAG lines are
    echoed here); its JSON result, or {"error": ...} with the output's tail."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [python, str(Path(__file__).resolve()), name, str(spec_path), str(result_path)]
        commands.append({"worker": name, "command": shlex.join(cmd),
                         "PYTHONPATH": env.get("PYTHONPATH"), "spec": spec})  # fmt: skip
        tail: collections.deque[str] = collections.deque(maxlen=60)
        timed_out = threading.Event()
        with log.open("a") as f:
            f.write(f"\n$ PYTHONPATH={env.get('PYTHONPATH', '')} {shlex.join(cmd)}\n")
            f.flush()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, env=env, bufsize=1)  # fmt: skip
            timer = None
            if timeout is not None:

                def kill() -> None:
                    timed_out.set()
                    proc.kill()

                timer = threading.Timer(max(timeout, 1.0), kill)
                timer.start()
            assert proc.stdout is not None
            for line in proc.stdout:
                f.write(line)
                tail.append(line)
                if line.startswith(TAG):
                    print(line, end="", flush=True)
            rc = proc.wait()
            if timer is not None:
                timer.cancel()
        if timed_out.is_set():
            return {"error": f"{name}: killed at the time limit", "timed_out": True}
        if rc or not result_path.is_file():
            return {"error": f"{name} exited {rc}:\n{''.join(tail).strip()[-4000:]}"}
        return json.loads(result_path.read_text())


def worker_env(extra: dict[str, str] | None = None, drop: tuple[str, ...] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")  # fmt: skip
    env.update(extra or {})
    return env


def upstream_command(args: argparse.Namespace) -> tuple[str, dict[str, str]]:
    """The upstream worker's python and environment."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    if args.upstream_python is not None:
        python = args.upstream_python
    elif args.device == "cpu":
        python = str(reference_python())
    else:
        python = sys.executable
    extra: dict[str, str] = {}
    pythonpath = args.upstream_pythonpath
    if pythonpath is None:
        pythonpath = "/tmp/site-qwen-tts" if args.device == "cuda" else ""
    if pythonpath:
        extra["PYTHONPATH"] = pythonpath
    if args.device == "cpu":  # torch's OpenMP threads spin between regions by default
        extra.update(OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="PASSIVE")
    return python, worker_env(extra, drop)


def left(deadline: float | None) -> float | None:
    """Seconds to the time limit (None: no limit)."""
    return None if deadline is None else deadline - time.time()


def ensure_checkpoint(args: argparse.Namespace, work: Path, log: Path, commands: list,
                      deadline: float | None) -> dict:  # fmt: skip
    ckpt = work / "ckpt"
    stamp = ckpt / "bench_stamp.json"
    wanted = {"size": args.size, "seed": args.seed, "kind": "custom_voice",
              "writer": hashlib.sha256((REPO / "export" / "tiny_tts.py").read_bytes()).hexdigest()[:16]}  # fmt: skip
    if stamp.is_file() and json.loads(stamp.read_text()).get("wanted") == wanted:
        return {**json.loads(stamp.read_text())["made"], "reused": True, "dir": str(ckpt)}
    if ckpt.exists():
        shutil.rmtree(ckpt)
    t = phase_start("checkpoint")
    made = run_worker("_make", sys.executable, {"dir": str(ckpt), "size": args.size,
                      "seed": args.seed}, worker_env(), log, left(deadline), commands)  # fmt: skip
    if "error" in made:
        raise SystemExit(f"{TAG} making the checkpoint failed: {made['error']}")
    phase_end("checkpoint", t)
    stamp.write_text(json.dumps({"wanted": wanted, "made": made}, indent=2) + "\n")
    return {**made, "reused": False, "dir": str(ckpt)}


def limits(args: argparse.Namespace) -> dict[str, int]:
    """edge-build's limits: the talker's prompt (chat rows, every text token in non-streaming
    mode: at most one a byte of the text with this byte-level BPE, and the codec prefix) and
    its frames fit the KV cache (the runtime stops the talker at its capacity; the frame count
    is checked)."""
    prompt = 64 * math.ceil((len(TEXT.encode()) + 32) / 64)
    capacity = 64 * math.ceil((prompt + args.frames + 8) / 64)
    return {"max_batch_size": args.max_batch, "max_input_len": prompt,
            "max_kv_cache_capacity": capacity}  # fmt: skip


def ensure_engine(args: argparse.Namespace, work: Path, ckpt: Path, log: Path, commands: list,
                  deadline: float | None, may_build: bool = True) -> dict | None:  # fmt: skip
    """The engine dir for these settings, built unless one built from this checkpoint by this
    checkout's export code is there (None: none there, and ``may_build`` is False)."""
    lim = limits(args)
    build_args: dict[str, Any] = {**lim, "device": args.device, "dtype": args.dtype}
    if args.logits_topk is not None:
        build_args["logits_topk"] = args.logits_topk
    if args.quantization:
        build_args.update(quantization=args.quantization, group_size=args.group_size)
    if args.backend != "onnxruntime":
        build_args["backend"] = args.backend
    if args.code2wav_streaming == "stateful":
        build_args["code2wav_streaming"] = "stateful"
    name = (f"engine-{args.device}-{args.dtype}-b{lim['max_batch_size']}-i{lim['max_input_len']}"
            f"-c{lim['max_kv_cache_capacity']}" + (f"-k{args.logits_topk}"
                                                   if args.logits_topk is not None else ""))  # fmt: skip
    if args.quantization:  # never a float engine's folder
        name += f"-{args.quantization}-g{args.group_size}"
    if args.backend != "onnxruntime":
        name += f"-{args.backend}"
    if args.code2wav_streaming == "stateful":
        name += "-stateful"
    engine = work / name
    stamp_path = engine / "bench_stamp.json"
    fingerprint = source_fingerprint()
    ckpt_made = json.loads((ckpt / "bench_stamp.json").read_text())["made"]
    if (engine / "multistage_config.json").is_file() and stamp_path.is_file() and not args.rebuild:
        stamp = json.loads(stamp_path.read_text())
        if stamp.get("source") == fingerprint and stamp.get("checkpoint") == ckpt_made:
            return {**stamp, "engine": str(engine), "reused": True}
        if may_build:
            say("the engine was built by other export code or from another checkpoint: rebuilding")
    if not may_build:
        return None
    free = shutil.disk_usage(work).free
    if free < 2 * ckpt_made["bytes"]:
        error = (f"the build needs about {2 * ckpt_made['bytes'] / 1e9:.0f} GB free; {work} "
                 f"has {free / 1e9:.0f} GB")  # fmt: skip
        say(f"edge-build not started (upstream still runs): {error}")
        return {"error": error, "engine": str(engine)}
    t = phase_start("build")
    spec = {"ckpt": str(ckpt), "engine": str(engine), "build_args": build_args}
    result = run_worker("_build", sys.executable, spec, worker_env(), log, left(deadline),
                        commands)  # fmt: skip
    if "error" in result:
        phase_end("build", t)
        say(f"edge-build failed (upstream still runs): {result['error'][-3000:]}")
        return {"error": f"edge-build failed: {result['error']}", "engine": str(engine)}
    phase_end("build", t)
    stamp = {**result, "source": fingerprint, "checkpoint": ckpt_made,
             "disk_bytes": sum(f.stat().st_size for f in engine.rglob("*") if f.is_file()),
             "date": time.strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
    return {**stamp, "engine": str(engine), "reused": False}


def engine_windows(engine: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Set the vocoder's windows (or, streaming stateful, its first chunk) in the graph's
    code2wav stage; the settings in force, with the build's left context (or chunk sizes)."""
    path = engine / "multistage_config.json"
    graph = json.loads(path.read_text())
    stage = next(s for s in graph["stages"] if s["runner"].endswith(".code2wav"))
    if args.code2wav_streaming == "stateful":
        config = stage.setdefault("config", {})
        if config.get("streaming") != "stateful":
            raise SystemExit(f"{engine}: its code2wav stage does not stream stateful")
        if args.first_chunk_frames is not None:
            config["first_chunk_frames"] = args.first_chunk_frames
        path.write_text(json.dumps(graph, indent=2) + "\n")
        step = json.loads((engine / stage["artifact"] / config["stream"] / "config.json")
                          .read_text())  # fmt: skip
        return {"streaming": "stateful",
                **{k: config.get(k, step[k]) for k in ("first_chunk_frames", "chunk_frames")}}
    windows = set_windows(engine, args.window_frames, args.first_window_frames)
    built = engine / stage["artifact"] / "config.json"
    if "left_context_frames" not in windows and built.is_file():
        windows["left_context_frames"] = json.loads(built.read_text()).get("left_context_frames")
    return windows


def side_key(side: str, args: argparse.Namespace, engine: dict, windows: dict) -> dict:
    """What a side's cached results depend on."""
    key: dict[str, Any] = {"side": side, "size": args.size, "seed": args.seed,
                           "frames": args.frames, "sampled": args.sampled, "text": TEXT,
                           "warmup": args.warmup, "device": args.device}  # fmt: skip
    if side == "edgeomni":
        key.update(repeats=args.repeats, engine=engine["engine"], source=engine["source"],
                   windows=windows, cuda_graphs=not args.no_cuda_graphs, batching=args.batching,
                   whole_utterance=args.whole_utterance,
                   threads=args.threads if args.device == "cpu" else None)  # fmt: skip
        if args.host_frame_sum:  # absent by default: the default's cached results stay valid
            key.update(host_frame_sum=True)
        if args.host_first_draw:
            key.update(host_first_draw=True)
        if args.vocoder_beside:
            key.update(vocoder_beside=True)
        if args.quantization:  # absent for float engines: their cached results stay valid
            key.update(quantization=args.quantization, group_size=args.group_size)
    else:
        key.update(repeats=args.upstream_repeats, dtype=args.upstream_dtype,
                   attn=args.upstream_attn, checkpoint=engine["checkpoint"],
                   python=upstream_command(args)[0],
                   pythonpath=upstream_command(args)[1].get("PYTHONPATH"))  # fmt: skip
    return key


def side_cache(side: str, args: argparse.Namespace, engine: dict, windows: dict) -> tuple:
    """The side's cache file and its key."""
    key = side_key(side, args, engine, windows)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return engine["results_dir"] / f"{side}-{digest}.json", key


def load_side(side: str, args: argparse.Namespace, engine: dict, windows: dict,
              todo: list[int] | None = None, error: str | None = None) -> dict:  # fmt: skip
    """A side's cached results for every concurrency asked for (``todo``: those run now)."""
    cache, key = side_cache(side, args, engine, windows)
    have = json.loads(cache.read_text()) if cache.is_file() else {"runs": {}}
    if have.get("key") not in (None, key):
        have = {"runs": {}}
    runs = {c: have["runs"][str(c)] for c in args.concurrency if str(c) in have["runs"]}
    return {
        "runs": {str(c): {**r, "summary": summarize(r["batches"], args.frames)}
                 for c, r in runs.items()},
        "meta": have.get("meta", {}),
        "missing": [c for c in args.concurrency if c not in runs],
        "cached": [c for c in runs if c not in (todo or [])],
        "error": error,
        "cache": str(cache),
    }  # fmt: skip


def run_side(side: str, args: argparse.Namespace, engine: dict, windows: dict, ckpt: Path,
             log: Path, commands: list, deadline: float | None) -> dict:  # fmt: skip
    """A side's results for every concurrency, from its cache where the settings match, the
    missing ones measured now in one worker."""
    cache, key = side_cache(side, args, engine, windows)
    if args.fresh and cache.exists():
        cache.unlink()
    todo = load_side(side, args, engine, windows)["missing"]
    error = None
    if todo:
        name = f"{side} c={','.join(map(str, todo))}"
        t = phase_start(name)
        spec: dict[str, Any] = {
            "key": key, "cache": str(cache), "concurrency": todo, "frames": args.frames,
            "text": TEXT, "sampled": args.sampled, "warmup": args.warmup,
            "deadline": None if deadline is None else deadline - 15,
        }  # fmt: skip
        if side == "edgeomni":
            spec.update(engine=engine["engine"], repeats=args.repeats, device=args.device,
                        cuda_graphs=not args.no_cuda_graphs, batching=args.batching,
                        whole_utterance=args.whole_utterance, host_frame_sum=args.host_frame_sum,
                        host_first_draw=args.host_first_draw, vocoder_beside=args.vocoder_beside,
                        threads=args.threads if args.device == "cpu" else None)  # fmt: skip
            python, env = sys.executable, worker_env()
        else:
            spec.update(ckpt=str(ckpt), repeats=args.upstream_repeats, device=args.device,
                        dtype=args.upstream_dtype, attn=args.upstream_attn,
                        threads=args.threads if args.device == "cpu" else None)  # fmt: skip
            python, env = upstream_command(args)
            absent = [p for p in env.get("PYTHONPATH", "").split(":") if p and not Path(p).exists()]
            if absent:  # a fresh GPU machine: the staging has to be done again
                error = (f"upstream: PYTHONPATH {absent} does not exist (stage it with "
                         "bench/stage_qwen_tts_gpu.sh, or pass --upstream-pythonpath)")  # fmt: skip
                say(error)
                phase_end(name, t)
                return load_side(side, args, engine, windows, todo, error)
        limit = left(deadline)
        if limit is not None and limit < MIN_WORKER_S:
            error = f"not started: {limit:.0f} s were left of the time limit"
            say(f"{side}: {error}")
            phase_end(name, t)
            return load_side(side, args, engine, windows, todo, error)
        result = run_worker(f"_{side}", python, spec, env, log,
                            None if limit is None else limit - 5, commands)  # fmt: skip
        if "error" in result:
            error = result["error"]
            say(f"{side}: {error.splitlines()[0]}")
            if not result.get("timed_out"):
                print(error[-3000:], flush=True)
        elif result.get("skipped"):
            error = f"skipped at the time limit: c={result['skipped']}"
        phase_end(name, t)
    return load_side(side, args, engine, windows, todo, error)


def write(args: argparse.Namespace, report: dict, final: bool) -> None:
    report["phases_s"] = PHASES
    report["comparisons"] = comparisons(report)
    report["same_codes_c1"] = same_codes(report)
    md = markdown(report)
    (args.out / "gpu_tts.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (args.out / "gpu_tts.md").write_text(md)
    if final:
        print("\n" + md, flush=True)
        say(f"phases (s): {json.dumps(PHASES)}")
        say(f"wrote {args.out / 'gpu_tts.json'} and {args.out / 'gpu_tts.md'}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="writes gpu_tts.json, .md and logs")
    p.add_argument("--size", choices=("0.6b", "1.7b", "tiny"), default="0.6b")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="both sides")
    p.add_argument("--dtype", choices=("float16", "float32"),
                   help="edgeomni's engines (default: float16 on cuda, float32 on cpu)")  # fmt: skip
    p.add_argument("--upstream-dtype", choices=("bfloat16", "float16", "float32"),
                   help="default: bfloat16 on cuda, float32 on cpu")  # fmt: skip
    p.add_argument("--upstream-attn", default="sdpa", help="attn_implementation (sdpa, eager)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 32])
    p.add_argument("--max-batch", type=int,
                   help="edge-build's max batch (default: 32 on cuda, else the largest c)")  # fmt: skip
    p.add_argument("--frames", type=int, default=100, help="codec frames a request (80 ms each)")
    p.add_argument("--repeats", type=int, default=2, help="edgeomni timed runs per concurrency")
    p.add_argument("--upstream-repeats", type=int, help="upstream's (default: --repeats)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per concurrency first")
    p.add_argument("--sampled", action="store_true", help="the release's sampling, not greedy")
    p.add_argument("--window-frames", type=int, default=25, help="edgeomni's vocoder window")
    p.add_argument("--first-window-frames", type=int, default=5,
                   help="edgeomni's first vocoder window (then doubling to --window-frames)")  # fmt: skip
    p.add_argument("--code2wav-streaming", choices=("windows", "stateful"), default="windows",
                   help="edge-build's --code2wav-streaming: windows (the cuda default, set by "
                   "--window-frames and --first-window-frames) or the stateful step, each frame "
                   "decoded once in chunks (the first --first-chunk-frames)")  # fmt: skip
    p.add_argument("--first-chunk-frames", type=int, choices=(1, 2),
                   help="stateful: frames of the first chunk (default: the build's, 2)")
    p.add_argument("--logits-topk", type=int, help="edge-build's (default: the builder's)")
    p.add_argument("--quantization", choices=("int4_rtn", "int4_awq"),
                   help="edgeomni's talker and code predictor weights int4 (edge-build "
                   "--quantization; default: none, float weights)")  # fmt: skip
    p.add_argument("--group-size", type=int, choices=(32, 64, 128),
                   help="with --quantization: weights a scale (edge-build --group-size; "
                   "default 32)")  # fmt: skip
    p.add_argument("--backend", choices=BACKENDS, nargs="+", default=["onnxruntime"],
                   help="edge-build's --backend: fused runs the talker and code predictor on "
                        "edgeomni's kernels, the rest on ONNX Runtime CUDA; two (onnxruntime "
                        "fused): edgeomni's side once with each, in this run (OUT/<backend>), "
                        "then the two side by side with the ratios and the fraction of the HBM "
                        "bound (OUT/backends.md; bench/backend_pair.py)")  # fmt: skip
    p.add_argument("--no-cuda-graphs", action="store_true", help="edgeomni without graph replay")
    p.add_argument("--host-frame-sum", action="store_true",
                   help="comparison only: each codec frame summed on the host and the talker's "
                   "next input uploaded, as before frames were summed on the device")
    p.add_argument("--host-first-draw", action="store_true",
                   help="comparison only: each step's first codes drawn on the host from the "
                   "talker's top K, as before the device drew them and queued the next frame "
                   "behind the draw")
    p.add_argument("--vocoder-beside", action="store_true",
                   help="edgeomni's vocoder calls on a thread of their own, its engine on a CUDA "
                   "stream of its own (edge-infer --vocoder-threads 1)")
    p.add_argument("--batching", choices=("inflight", "cohort"), default="inflight")
    p.add_argument("--whole-utterance", action="store_true",
                   help="edgeomni vocodes each utterance whole once its codes are complete "
                   "(requests finishing together share calls), not in windows as they come: "
                   "throughput over first audio")  # fmt: skip
    p.add_argument("--threads", type=int, default=2, help="intra-op threads a side (cpu only)")
    p.add_argument("--only", choices=SIDES, help="run one side (the other's cached runs still "
                   "show)")  # fmt: skip
    p.add_argument("--stop-after", choices=("checkpoint", "build"))
    p.add_argument("--time-limit", type=float,
                   help="seconds from the start after which no new work starts (workers are "
                   "killed there); the report is written with what was measured")  # fmt: skip
    p.add_argument("--fresh", action="store_true", help="measure again, ignoring cached runs")
    p.add_argument("--rebuild", action="store_true", help="rebuild the engines")
    p.add_argument("--seed", type=int, default=0, help="the checkpoint's weights")
    p.add_argument("--upstream-python", help="the upstream worker's interpreter (default: this "
                   "one on cuda, the reference venv's on cpu)")  # fmt: skip
    p.add_argument("--upstream-pythonpath",
                   help="the upstream worker's whole PYTHONPATH (default: /tmp/site-qwen-tts on "
                   "cuda, none on cpu; '' for none)")  # fmt: skip
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edgeomni-gpu-tts")
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("float16" if args.device == "cuda" else "float32")
    args.upstream_dtype = args.upstream_dtype or (
        "bfloat16" if args.device == "cuda" else "float32"
    )
    args.upstream_repeats = args.upstream_repeats or args.repeats
    if len(set(args.backend)) != len(args.backend):
        p.error("--backend: each backend once")
    args.backends, args.backend = args.backend, args.backend[0]
    if len(args.backends) > 1 and (args.only == "upstream" or args.stop_after == "checkpoint"):
        p.error("--backend with two backends measures edgeomni's side with each (no --only "
                "upstream, no --stop-after checkpoint)")  # fmt: skip
    if args.group_size is not None and not args.quantization:
        p.error("--group-size needs --quantization")
    if args.quantization:
        args.group_size = args.group_size or 32
    if "fused" in args.backends and (args.quantization == "int4_awq" or args.device != "cuda"):
        p.error("--backend fused: on cuda only, float16 or int4_rtn weights")
    if args.first_chunk_frames is not None and args.code2wav_streaming != "stateful":
        p.error("--first-chunk-frames needs --code2wav-streaming stateful")
    args.concurrency = sorted(set(args.concurrency))
    if args.max_batch is None:
        args.max_batch = (
            max(32, *args.concurrency) if args.device == "cuda" else max(args.concurrency)
        )
    if args.max_batch < max(args.concurrency):
        p.error("--max-batch must be at least the largest --concurrency")
    if args.frames < 1 or min(args.concurrency) < 1 or args.repeats < 1:
        p.error("--frames, --concurrency and --repeats must be >= 1")
    if args.first_window_frames > args.window_frames:
        p.error("--first-window-frames must not exceed --window-frames")
    return args


def both_backends(args: argparse.Namespace, argv: list[str]) -> int:
    """edgeomni's side once with each backend (their engines built from one checkpoint), then
    the two side by side: OUT/backends.json and OUT/backends.md."""
    args.out.mkdir(parents=True, exist_ok=True)
    codes = run_backends(main, [*argv, "--only", "edgeomni"], args.backends, args.out)
    if args.stop_after is not None:  # nothing measured to set side by side
        return max(codes.values())
    runs, ckpt = {}, None
    for backend in args.backends:
        path = args.out / backend / "gpu_tts.json"
        if not path.is_file():
            continue
        report = json.loads(path.read_text())
        side = report["sides"].get("edgeomni") or {"runs": {}}
        runs[backend] = {c: r["summary"] for c, r in side["runs"].items()}
        ckpt = Path(report["config"]["checkpoint"]["dir"])
    bandwidth = copy_bandwidth_gbs() if args.device == "cuda" else None
    rows = compare(runs, lambda c: tts_traffic(ckpt, c, args.frames), 0, args.frames,
                   bandwidth if ckpt else None)  # fmt: skip
    mode = ("stateful vocoder" if args.code2wav_streaming == "stateful"
            else "whole utterance" if args.whole_utterance else "vocoder windows")  # fmt: skip
    title = (f"Qwen3-TTS {args.size} on {args.device}, {args.frames} frames a request, {mode}: "
             f"{' and '.join(args.backends)} in one run ({time.strftime('%Y-%m-%d %H:%M %Z')})")
    write_pair(args.out, "backends", title, rows, bandwidth, codes,
               {"command": shlex.join([sys.executable, *sys.argv]), "checkpoint": str(ckpt)})
    return max(codes.values())


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 4 and sys.argv[1] in WORKERS:  # a worker process
        spec = json.loads(Path(sys.argv[2]).read_text())
        Path(sys.argv[3]).write_text(json.dumps(WORKERS[sys.argv[1]](spec), default=str))
        return 0
    args = parse_args(argv)
    if len(args.backends) > 1:
        return both_backends(args, list(sys.argv[1:] if argv is None else argv))
    PHASES.clear()  # a run's own phases (both_backends runs main once a backend)
    started = time.time()
    deadline = None if args.time_limit is None else started + args.time_limit
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work / f"{args.size}-s{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    log = args.out / "gpu_tts.log"
    commands: list[dict] = []
    quant = f" ({args.quantization} g{args.group_size})" if args.quantization else ""
    say(f"Qwen3-TTS {args.size} on {args.device}{quant}, c={args.concurrency}, "
        f"{args.frames} frames; work {work}; worker output in {log}")  # fmt: skip

    ckpt_info = ensure_checkpoint(args, work, log, commands, deadline)
    ckpt = Path(ckpt_info["dir"])
    if args.stop_after == "checkpoint":
        return 0
    # upstream needs no engine (one already built still shows edgeomni's cached runs)
    may_build = args.only != "upstream" or args.stop_after is not None
    engine = ensure_engine(args, work, ckpt, log, commands, deadline, may_build)
    windows: dict[str, Any] = {}
    build_error = None if engine is None else engine.get("error")
    if engine is None or build_error:
        ckpt_made = json.loads((ckpt / "bench_stamp.json").read_text())["made"]
        engine = {"engine": None, "source": None, "checkpoint": ckpt_made, "error": build_error}
    else:
        windows = engine_windows(Path(engine["engine"]), args)
    engine["results_dir"] = work / "results"
    engine["results_dir"].mkdir(exist_ok=True)
    if args.stop_after == "build":
        return 1 if build_error else 0

    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine(),
        "config": {
            "size": args.size, "kind": "custom_voice", "device": args.device, "dtype": args.dtype,
            "upstream_dtype": args.upstream_dtype, "upstream_attn": args.upstream_attn,
            "concurrency": args.concurrency, "frames": args.frames,
            "audio_s_per_request": args.frames * SAMPLES_PER_FRAME / SR,
            "talker_max_new_tokens": args.frames + 1, "sampled": args.sampled,
            "sampling": RELEASE_SAMPLING if args.sampled else GREEDY, "text": TEXT,
            "speaker": SPEAKER, "language": LANGUAGE, "repeats": args.repeats,
            "upstream_repeats": args.upstream_repeats, "warmup": args.warmup,
            "windows": windows, "limits": limits(args), "seed": args.seed,
            "cuda_graphs": not args.no_cuda_graphs, "batching": args.batching,
            "whole_utterance": args.whole_utterance, "host_frame_sum": args.host_frame_sum,
            "host_first_draw": args.host_first_draw, "vocoder_beside": args.vocoder_beside,
            "quantization": args.quantization, "group_size": args.group_size,
            "checkpoint": ckpt_info, "engine": {k: v for k, v in engine.items()
                                                if k != "results_dir"},
            "time_limit_s": args.time_limit,
        },
        "targets": TARGETS,
        "peers_published_not_reproduced": PEERS,
        "sides": {},
        "commands": commands,
    }  # fmt: skip
    failed = False
    for side in SIDES:
        if args.only not in (None, side):  # the other side's finished runs still show
            cached = load_side(side, args, engine, windows)
            if cached["runs"]:
                report["sides"][side] = cached
            continue
        if side == "edgeomni" and build_error:
            report["sides"][side] = {"runs": {}, "meta": {}, "missing": args.concurrency,
                                     "cached": [], "error": build_error, "cache": None}  # fmt: skip
            failed = True
            continue
        report["sides"][side] = run_side(side, args, engine, windows, ckpt, log, commands,
                                         deadline)  # fmt: skip
        s = report["sides"][side]
        failed = failed or bool(s["error"] or s["missing"])
        failed = failed or any(not (r["summary"].get("ok") and r["summary"].get("fixed_work"))
                               for r in s["runs"].values())  # fmt: skip
        write(args, report, final=False)
    report["total_s"] = round(time.time() - started, 1)
    write(args, report, final=True)
    if failed:
        say("FAILED: a side had errors, missed concurrencies or did not make the frames asked")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
