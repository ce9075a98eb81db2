"""Qwen3-TTS text to speech on one GPU: edgeomni against upstream qwen-tts 0.1.1, same run.

A random-weight Qwen3-TTS CustomVoice checkpoint at the release's 0.6B or 1.7B dimensions is
written on the machine (export/tiny_tts.py, no download, no qwen-tts needed), edge-build builds
it (ONNX Runtime CUDA, float16 talker and code predictor, float32 code2wav), and each side runs
in a fresh process of its own, one after the other, at concurrency c = 1, 4, 16, 32:

- edgeomni: c requests submitted together in one Pipeline.run (in-flight batching); first
  audio is each request's first AudioChunk with samples, from the submission; the vocoder runs
  in windows while the talker runs (first window --first-window-frames, then doubling up to
  --window-frames), or (--whole-utterance) each utterance whole once its codes are complete,
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
    python bench/gpu_tts.py --size tiny --device cpu --concurrency 1 2 --out /tmp/gpu_tts_tiny

``--work`` keeps the checkpoint, the engines and each side's finished concurrencies (keyed by
their settings), so a command stopped by a time limit continues where it stopped when run
again (--fresh: measure again). ``--time-limit S``: stop starting work S seconds after the
start (a worker is killed at the limit) and write what was measured; meant for a machine whose
commands are cut at 10 minutes. On cuda the upstream worker runs this python with PYTHONPATH
set to --upstream-pythonpath only (default /tmp/site-qwen-tts, staged by
bench/stage_qwen_tts_gpu.sh); with --device cpu, the reference venv's python
(tests/qwen_tts_reference/make_venv.py) without PYTHONPATH. Every other worker keeps this
process's environment.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import statistics
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
from qwen3_tts_cpu import (  # noqa: E402  (standard library only at import: the upstream worker loads it too)
    GREEDY,
    LANGUAGE,
    RELEASE_SAMPLING,
    SAMPLES_PER_FRAME,
    SPEAKER,
    SR,
    TEXT,
    compare_codes,
    dist_version,
    reference_python,
    set_windows,
    source_fingerprint,
)

TAG = "[gpu_tts]"
SIDES = ("edgeomni", "upstream")
# what the project wants to show at 0.6B on one H200 (not a measurement)
TARGETS = {"size": "0.6b", "rtf_p50_c1": 0.1, "ttfa_p50_ms_c1": 100.0, "audio_s_per_s_c32": 150.0}
# published figures, printed beside ours; not reproduced here (other hardware and setups)
PEERS = [
    {"name": "faster-qwen3-tts", "setup": "0.6B on an H100, its CUDA-graph path",
     "rtf_c1": 0.257, "first_audio_ms_c1": 228},
    {"name": "vLLM-Omni", "setup": "Qwen3-TTS", "rtf_c1": 0.155,
     "first_audio_ms_c1": 129, "first_audio_is": "first packet", "audio_s_per_s": 38.7,
     "audio_s_per_s_at_c": 16},
]  # fmt: skip
PHASES: dict[str, float] = {}
MIN_WORKER_S = 20.0  # no worker starts with less of the time limit left


def say(message: str) -> None:
    print(f"{TAG} {message}", flush=True)


def p50(values: list[float]) -> float:
    return statistics.median(values)


# -- workers (each in a fresh process; a JSON spec in, a JSON result out) ---------------------
def work_make(spec: dict) -> dict:
    """The random CustomVoice checkpoint (project python: torch + edgeomni)."""
    import torch

    from edgeomni.export.tiny_tts import make_checkpoint

    start = time.perf_counter()
    out = Path(spec["dir"])
    make_checkpoint(out, "custom_voice", spec["size"], seed=spec["seed"])
    seconds = time.perf_counter() - start
    from safetensors import safe_open

    params = {}
    for name in ("model.safetensors", "speech_tokenizer/model.safetensors"):
        with safe_open(str(out / name), "pt") as f:
            params[name] = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    say(f"checkpoint: {sum(params.values()) / 1e6:.0f} M parameters in {seconds:.1f} s")
    return {
        "seconds": round(seconds, 1),
        "parameters": params,
        "bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file()),
        "torch": torch.__version__,
    }


def work_build(spec: dict) -> dict:
    """edge-build of the checkpoint into spec["engine"]; the build's own log goes to the log."""
    import logging

    import onnx
    import torch
    import transformers

    from edgeomni.builder.build import build
    from edgeomni.builder.workspace import clean_stale
    from edgeomni.export.family import BuildArgs

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("edge-build").setLevel(logging.INFO)
    engine = Path(spec["engine"])
    clean_stale(engine)  # a build killed by a time limit leaves its workspace beside it
    scratch = engine.parent / "tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    tempfile.tempdir = str(scratch)
    args = BuildArgs(**spec["build_args"])
    start = time.perf_counter()
    build(Path(spec["ckpt"]), engine, args)
    seconds = time.perf_counter() - start
    shutil.rmtree(scratch, ignore_errors=True)
    say(f"edge-build: {seconds:.1f} s")
    return {
        "seconds": round(seconds, 1),
        "build_args": {k: getattr(args, k) for k in vars(args)},
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnx": onnx.__version__,
        },
    }


class Timeline:
    """Each request's first audio (an AudioChunk with samples) and last event, from the
    submission (the listener's creation, just before Pipeline.run)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first_audio: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def __call__(self, event: Any) -> None:
        now = time.perf_counter() - self.start
        samples = getattr(event, "samples", None)
        if type(event).__name__ == "AudioChunk" and samples is not None and samples.size:
            self.first_audio.setdefault(event.index, now)
        self.last[event.index] = now


def gpu_memory_used_mib() -> float | None:
    """This GPU's memory in use now (nvidia-smi), or None without one."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=True, timeout=20,
        ).stdout.split()  # fmt: skip
        return float(out[0]) if out else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def save_partial(path: Path, side: str, key: dict, c: int, result: dict, meta: dict) -> None:
    """Add concurrency c's result to the side's cache file (atomically)."""
    cache = json.loads(path.read_text()) if path.is_file() else {"key": key, "runs": {}}
    if cache.get("key") != key:
        cache = {"key": key, "runs": {}}
    cache["runs"][str(c)] = result
    cache["meta"] = meta
    cache["side"] = side
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache) + "\n")
    tmp.replace(path)


def out_of_time(spec: dict, last_block_s: float | None) -> bool:
    """Whether the next concurrency would likely run past the command's time limit."""
    deadline = spec.get("deadline")
    if deadline is None:
        return False
    need = 1.5 * last_block_s if last_block_s else 0.0
    return time.time() + need > deadline


def edgeomni_body(spec: dict, c: int) -> dict:
    request = {
        "messages": [{"role": "assistant", "content": spec["text"]}],
        "speaker": SPEAKER,
        "language": LANGUAGE,
        "sampling": {"talker_non_streaming_mode": 1},
    }
    body: dict[str, Any] = {
        "requests": [json.loads(json.dumps(request)) for _ in range(c)],
        "talker_max_new_tokens": spec["frames"] + 1,  # the last sampled code gets no frame
    }
    if not spec["sampled"]:  # upstream's greedy: the talker and the code predictor each told so
        body.update(talker_do_sample=0, subtalker_dosample=0)
    return body


def edgeomni_batch(pipe: Any, requests: list, c: int) -> dict:
    """One Pipeline.run of c requests submitted together: per-request and per-stage numbers."""
    import numpy as np

    events = Timeline()
    outcomes = pipe.run(requests, batch_size=c, listener=events)
    wall = time.perf_counter() - events.start
    rows, errors = [], []
    for o in outcomes:
        e = o.entry
        if not e["ok"] or o.audio is None:
            errors.append(str(e.get("error") or "no audio"))
            continue
        st, i = e["stages"], e["request_idx"]
        audio_s = len(o.audio) / o.sample_rate
        end = events.last.get(i, wall)
        rows.append({
            "request_idx": i,
            "frames": st["talker"]["frames"],
            "finish": st["talker"]["finish_reason"],
            "audio_s": round(audio_s, 4),
            "ttfa_ms": round(events.first_audio.get(i, end) * 1e3, 3),
            "ttfa_ms_stage": st["code2wav"].get("first_audio_ms"),
            "e2e_ms": round(end * 1e3, 3),
            "rtf": round(end / audio_s, 5) if audio_s else None,
            "stall_ms": st["code2wav"].get("stall_ms"),
            "vocode_ms": st["code2wav"].get("vocode_ms"),
            "vocoder_windows": st["code2wav"].get("windows"),
            "cohort_size": st["talker"].get("cohort_size"),
            "_codes": np.asarray(o.codes, dtype=np.int64),
        })  # fmt: skip
    first = outcomes[0].entry.get("stages", {}) if outcomes else {}
    tk, cw = first.get("talker", {}), first.get("code2wav", {})
    return {
        "wall_ms": round(wall * 1e3, 3),
        "audio_s": round(sum(r["audio_s"] for r in rows), 4),
        "errors": errors,
        "talker": {k: tk.get(k) for k in (
            "talker_ms", "code_predictor_ms", "talker_engine_ms", "code_predictor_engine_ms",
            "code_predictor_draws", "code_predictor_host_frames", "full_logit_rows", "batching",
            "streamed_vocoder_ms")},
        "code2wav": {k: cw.get(k) for k in (
            "mode", "window_frames", "first_window_frames", "left_context_frames",
            "fixed_lengths", "call_rows")},
        "requests": rows,
    }  # fmt: skip


def work_edgeomni(spec: dict) -> dict:
    """edgeomni's pipeline: open once; per concurrency a warm-up run and the timed runs."""
    import numpy as np
    import onnxruntime

    from edgeomni.runtime.pipeline import Pipeline, Profile
    from edgeomni.runtime.requests import BadRequest, parse_request_file

    providers = onnxruntime.get_available_providers()
    if spec["device"] == "cuda" and "CUDAExecutionProvider" not in providers:
        raise SystemExit(
            f"onnxruntime {onnxruntime.__version__} ({onnxruntime.__file__}) has no CUDA provider "
            f"({providers}): stage onnxruntime-gpu (../shared/gpu/stage-ort-gpu.sh) and put "
            "/tmp/site first on PYTHONPATH"
        )
    from edgeomni.runtime.engine import Engines

    options = {"cuda_graphs": spec["cuda_graphs"], "batching": spec["batching"]}
    if spec.get("whole_utterance"):
        options["whole_utterance"] = True
    if spec.get("threads"):
        options["threads"] = spec["threads"]
    start = time.perf_counter()
    engines = Engines(threads=spec.get("threads") or None, cuda_graphs=spec["cuda_graphs"])
    pipe = Pipeline(spec["engine"], engines=engines, batching=spec["batching"],
                    whole_utterance=bool(spec.get("whole_utterance")))  # fmt: skip
    meta: dict[str, Any] = {
        "pipeline_options": options,
        "versions": {
            "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "onnxruntime_providers": providers,
        "onnxruntime_path": str(Path(onnxruntime.__file__).parent),
    }
    out: dict[str, Any] = {"runs": {}, "skipped": []}
    cache, block_s = Path(spec["cache"]), None
    for c in spec["concurrency"]:
        if out_of_time(spec, block_s):
            out["skipped"].append(c)
            say(f"edgeomni c={c}: skipped, the time limit is near")
            continue
        block = time.perf_counter()
        requests, _ = parse_request_file(edgeomni_body(spec, c))
        bad = [r.error for r in requests if isinstance(r, BadRequest)]
        if bad:
            raise SystemExit(f"the runtime rejected the requests: {bad[0]}")
        load_before = pipe.profile.load_seconds
        warm = [edgeomni_batch(pipe, requests, c) for _ in range(spec["warmup"])]
        load_s = pipe.profile.load_seconds - load_before
        batches = []
        for _ in range(spec["repeats"]):
            pipe.profile = Profile()
            batches.append(edgeomni_batch(pipe, requests, c))
        result = {
            "concurrency": c,
            "warmup_wall_ms": [w["wall_ms"] for w in warm],
            "engine_load_s": round(load_s, 2),
            "batches": batches,
            "stage_totals_last_run": pipe.profile.as_dict()["stages"],
            "gpu_memory_used_mib": gpu_memory_used_mib(),
        }
        codes = batches[0]["requests"][0]["_codes"] if batches[0]["requests"] else None
        for b in batches:
            for r in b["requests"]:
                r["codes_head"] = r.pop("_codes")[:2].tolist()
        if c == 1 and codes is not None:
            result["codes"] = codes.tolist()
        block_s = time.perf_counter() - block
        meta["open_s"] = round(time.perf_counter() - start, 2)
        save_partial(cache, "edgeomni", spec["key"], c, result, meta)
        out["runs"][str(c)] = result
        s = summarize(batches, spec["frames"])
        say(f"edgeomni c={c}: first audio p50 {s['ttfa_p50_ms']:.1f} ms, RTF p50 "
            f"{s['rtf_p50']:.3f}, {s['audio_s_per_s']:.1f} audio-s/s ({block_s:.1f} s)")  # fmt: skip
    return {**out, "meta": meta}


def work_upstream(spec: dict) -> dict:
    """Upstream's wrapper: load (CPU, then moved to the GPU: no accelerate), then per
    concurrency a warm-up call and the timed calls, each one batched generate_custom_voice."""
    import numpy as np
    import qwen_tts
    import torch
    import transformers

    if transformers.__version__ != "4.57.3":
        say(f"upstream: WARNING: transformers {transformers.__version__}, not the 4.57.3 "
            f"qwen-tts 0.1.1 pins ({transformers.__file__})")  # fmt: skip
    device = torch.device(spec["device"])
    dtype = getattr(torch, spec["dtype"])
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    start = time.perf_counter()
    tts = qwen_tts.Qwen3TTSModel.from_pretrained(
        spec["ckpt"], dtype=dtype, attn_implementation=spec["attn"]
    )
    if device.type != "cpu":  # device_map needs accelerate; .to() does the same here
        tts.model.to(device)
        tts.device = device
        st = tts.model.speech_tokenizer
        st.model.to(device)
        st.device = device
    load_s = time.perf_counter() - start
    say(f"upstream: loaded in {load_s:.1f} s ({spec['dtype']}, {spec['attn']}, {device})")
    checks = {
        "model.safetensors": load_check(tts.model, Path(spec["ckpt"]) / "model.safetensors"),
        "speech_tokenizer/model.safetensors": load_check(
            tts.model.speech_tokenizer.model,
            Path(spec["ckpt"]) / "speech_tokenizer" / "model.safetensors",
        ),
    }
    for name, check in checks.items():
        if check["missing"] or check["unexpected"]:
            say(f"upstream: {name}: {len(check['missing'])} tensors missing (random), "
                f"{len(check['unexpected'])} unexpected: {check}")  # fmt: skip
    model = tts.model
    captured: dict[str, Any] = {}
    original = model.generate

    def generate(*a: Any, **k: Any) -> Any:  # records the talker's codes, passes them on
        codes_list, hiddens = original(*a, **k)
        captured["codes"] = codes_list
        return codes_list, hiddens

    model.generate = generate
    kw = {**(RELEASE_SAMPLING if spec["sampled"] else GREEDY), "max_new_tokens": spec["frames"] + 1}

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def call(c: int, seed: int) -> dict:
        torch.manual_seed(seed)
        sync()
        t0 = time.perf_counter()
        wavs, sr = tts.generate_custom_voice(
            text=[spec["text"]] * c, speaker=[SPEAKER] * c, language=[LANGUAGE] * c,
            non_streaming_mode=True, **kw,
        )  # fmt: skip
        sync()
        wall = time.perf_counter() - t0
        rows = []
        for i, (wav, codes) in enumerate(zip(wavs, captured["codes"], strict=True)):
            audio_s = len(wav) / sr
            rows.append({"request_idx": i, "frames": int(codes.shape[0]),
                         "audio_s": round(audio_s, 4), "ttfa_ms": round(wall * 1e3, 3),
                         "e2e_ms": round(wall * 1e3, 3),
                         "rtf": round(wall / audio_s, 5) if audio_s else None})  # fmt: skip
        return {"wall_ms": round(wall * 1e3, 3), "audio_s": round(sum(len(w) for w in wavs) / sr, 4),
                "errors": [], "requests": rows}  # fmt: skip

    meta: dict[str, Any] = {
        "load_s": round(load_s, 2),
        "load_check": checks,
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "dtype": str(next(model.parameters()).dtype),
        "device": str(next(model.parameters()).device),
        "codec_device": str(next(model.speech_tokenizer.model.parameters()).device),
        "versions": {
            **{d: dist_version(d) for d in ("qwen-tts", "torchaudio", "librosa", "numba",
                                            "scipy", "tokenizers", "huggingface-hub")},
            "transformers": transformers.__version__, "torch": torch.__version__,
            "numpy": np.__version__, "python": platform.python_version(),
            "transformers_path": str(Path(transformers.__file__).parent),
        },
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
    }  # fmt: skip
    out: dict[str, Any] = {"runs": {}, "skipped": []}
    cache, block_s = Path(spec["cache"]), None
    for c in spec["concurrency"]:
        if out_of_time(spec, block_s):
            out["skipped"].append(c)
            say(f"upstream c={c}: skipped, the time limit is near")
            continue
        block = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        warm = [call(c, 1000 + i) for i in range(spec["warmup"])]
        batches = [call(c, i) for i in range(spec["repeats"])]
        result: dict[str, Any] = {
            "concurrency": c,
            "warmup_wall_ms": [w["wall_ms"] for w in warm],
            "batches": batches,
            "gpu_memory_used_mib": gpu_memory_used_mib(),
            "torch_max_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1)
            if device.type == "cuda" else None,
        }  # fmt: skip
        if c == 1:
            result["codes"] = captured["codes"][0].long().cpu().numpy().tolist()
        block_s = time.perf_counter() - block
        save_partial(cache, "upstream", spec["key"], c, result, meta)
        out["runs"][str(c)] = result
        s = summarize(batches, spec["frames"])
        say(f"upstream c={c}: wall p50 {s['wall_ms_p50']:.0f} ms (= first audio), RTF p50 "
            f"{s['rtf_p50']:.3f}, {s['audio_s_per_s']:.1f} audio-s/s ({block_s:.1f} s)")  # fmt: skip
    return {**out, "meta": meta}


def load_check(module: Any, path: Path) -> dict[str, list[str]]:
    """The module's saved tensors that the file lacks (left as initialized) and the file's
    tensors that the module has no place for (ignored)."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        saved = set(f.keys())  # noqa: SIM118
    expected = set(module.state_dict())
    return {"missing": sorted(expected - saved), "unexpected": sorted(saved - expected)}


WORKERS = {"_make": work_make, "_build": work_build, "_edgeomni": work_edgeomni,
           "_upstream": work_upstream}  # fmt: skip


# -- the driver -------------------------------------------------------------------------------
def summarize(batches: list[dict], frames: int) -> dict:
    """Pooled over the timed runs: first audio and RTF p50 over requests; audio-s/s = all audio
    over all wall time."""
    rows = [r for b in batches for r in b["requests"]]
    if not rows:
        return {"ok": False, "requests": 0}
    wall = sum(b["wall_ms"] for b in batches) / 1e3
    out = {
        "ok": not any(b["errors"] for b in batches),
        "requests": len(rows),
        "ttfa_p50_ms": round(p50([r["ttfa_ms"] for r in rows]), 1),
        "ttfa_max_ms": round(max(r["ttfa_ms"] for r in rows), 1),
        "rtf_p50": round(p50([r["rtf"] for r in rows]), 4),
        "audio_s_per_s": round(sum(b["audio_s"] for b in batches) / wall, 2),
        "wall_ms_p50": round(p50([b["wall_ms"] for b in batches]), 1),
        "e2e_p50_ms": round(p50([r["e2e_ms"] for r in rows]), 1),
        "audio_s_per_request": round(p50([r["audio_s"] for r in rows]), 3),
        "fixed_work": all(r["frames"] == frames for r in rows),
        "frames": sorted({r["frames"] for r in rows}),
    }
    stalls = [r["stall_ms"] for r in rows if r.get("stall_ms") is not None]
    if stalls:
        out["stall_p50_ms"] = round(p50(stalls), 1)
        out["stall_max_ms"] = round(max(stalls), 1)
    return out


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
    name = (f"engine-{args.device}-{args.dtype}-b{lim['max_batch_size']}-i{lim['max_input_len']}"
            f"-c{lim['max_kv_cache_capacity']}" + (f"-k{args.logits_topk}"
                                                   if args.logits_topk is not None else ""))  # fmt: skip
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
    """Set the vocoder's windows in the graph's code2wav stage; the settings in force, with the
    build's left context."""
    windows = set_windows(engine, args.window_frames, args.first_window_frames)
    graph = json.loads((engine / "multistage_config.json").read_text())
    stage = next(s for s in graph["stages"] if s["runner"].endswith(".code2wav"))
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
                        whole_utterance=args.whole_utterance,
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


def machine() -> dict:
    info: dict[str, Any] = {"host": platform.node(), "arch": platform.machine(),
                            "cores": os.cpu_count(), "python": platform.python_version()}  # fmt: skip
    try:
        info["cpu"] = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        info["cpu"] = platform.processor()
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
             "--format=csv,noheader"], capture_output=True, text=True, check=True, timeout=20,
        ).stdout.strip()  # fmt: skip
        info["gpus"] = smi.splitlines()
    except (OSError, subprocess.SubprocessError):
        info["gpus"] = []
    git = ["git", "-C", str(REPO)]
    try:  # the GPU machine's copy of the tree may have no .git (or no git)
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=False).stdout.strip()  # fmt: skip
        dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True,
                               check=False).stdout.strip()  # fmt: skip
    except OSError:
        head = dirty = ""
    info["edgeomni_commit"] = head + ("+dirty" if dirty else "") if head else None
    return info


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def comparisons(report: dict) -> dict[str, dict]:
    """Per concurrency: upstream / edgeomni for first audio and RTF, edgeomni / upstream for
    throughput (each > 1 where edgeomni is ahead)."""
    ed, up = report["sides"].get("edgeomni"), report["sides"].get("upstream")
    out: dict[str, dict] = {}
    for c in report["config"]["concurrency"]:
        e = ed and ed["runs"].get(str(c), {}).get("summary")
        u = up and up["runs"].get(str(c), {}).get("summary")
        if e and u and e.get("requests") and u.get("requests"):
            out[str(c)] = {
                "first_audio_upstream_over_edgeomni": ratio(u["ttfa_p50_ms"], e["ttfa_p50_ms"]),
                "rtf_upstream_over_edgeomni": ratio(u["rtf_p50"], e["rtf_p50"]),
                "throughput_edgeomni_over_upstream": ratio(e["audio_s_per_s"], u["audio_s_per_s"]),
            }
    return out


def same_codes(report: dict) -> dict | None:
    """Whether the two sides' c=1 codes agree (greedy; the same only where the dtypes are)."""
    try:
        a = report["sides"]["edgeomni"]["runs"]["1"]["codes"]
        b = report["sides"]["upstream"]["runs"]["1"]["codes"]
    except (KeyError, TypeError):
        return None
    return compare_codes(a, b)


def target_lines(report: dict) -> list[str]:
    size = report["config"]["size"]
    rows = []
    for side in SIDES:
        s = report["sides"].get(side)
        if not s:
            continue
        c1 = s["runs"].get("1", {}).get("summary", {})
        c32 = s["runs"].get("32", {}).get("summary", {})

        def check(value: float | None, ok: bool, fmt: str) -> str:
            return (
                "not measured"
                if value is None
                else f"{fmt.format(value)} ({'met' if ok else 'not met'})"
            )

        rtf, ttfa, thr = c1.get("rtf_p50"), c1.get("ttfa_p50_ms"), c32.get("audio_s_per_s")
        rows.append(
            f"| {side} | {check(rtf, rtf is not None and rtf <= TARGETS['rtf_p50_c1'], '{:.3f}')} "
            f"| {check(ttfa, ttfa is not None and ttfa < TARGETS['ttfa_p50_ms_c1'], '{:.1f} ms')} "
            f"| {check(thr, thr is not None and thr >= TARGETS['audio_s_per_s_c32'], '{:.1f}')} |"
        )  # fmt: skip
    head = (f"Targets (at {TARGETS['size']} on one H200; this run: {size}, "
            f"{report['machine'].get('gpus') or 'no GPU'}):")  # fmt: skip
    return [head, "", "| side | RTF p50 c=1 <= 0.1 | first audio p50 c=1 < 100 ms | "
            "audio-s/s c=32 >= 150 |", "|---|---|---|---|", *rows]  # fmt: skip


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown(report: dict) -> str:
    cfg = report["config"]
    frames = cfg["frames"]
    gpu = ", ".join(report["machine"].get("gpus") or []) or f"CPU ({report['machine']['cpu']})"
    win = cfg["windows"]
    up_cfg = f"{cfg['upstream_dtype']}, attn {cfg['upstream_attn']}"
    lines = [
        f"Qwen3-TTS {cfg['size']} CustomVoice, random weights, on {gpu} ({report['date']}): "
        f"{frames} frames a request ({frames * SAMPLES_PER_FRAME / SR:.2f} s of audio), "
        f"{'sampled (release defaults)' if cfg['sampled'] else 'greedy'}, c requests submitted "
        f"together; p50 over requests pooled over {cfg['repeats']} (edgeomni) / "
        f"{cfg['upstream_repeats']} (upstream) timed runs after {cfg['warmup']} warm-up.",
        "",
        "| c | side | first audio p50 ms | first audio max ms | RTF p50 | audio-s/s | "
        "wall p50 ms | stall max ms | frames |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cfg["concurrency"]:
        for side in SIDES:
            s = report["sides"].get(side)
            if s is None:
                continue
            run = s["runs"].get(str(c))
            if run is None:
                lines.append(f"| {c} | {side} | not measured | | | | | | |")
                continue
            m = run["summary"]
            if not m.get("requests"):
                lines.append(f"| {c} | {side} | failed | | | | | | |")
                continue
            first = fmt(m["ttfa_p50_ms"]) + (" (= wall)" if side == "upstream" else "")
            ok = "ok" if m["fixed_work"] and m["ok"] else f"NOT {frames}: {m['frames']}"
            lines.append(
                f"| {c} | {side} | {first} | {fmt(m['ttfa_max_ms'])} | {fmt(m['rtf_p50'], 3)} | "
                f"{fmt(m['audio_s_per_s'])} | {fmt(m['wall_ms_p50'], 0)} | "
                f"{fmt(m.get('stall_max_ms'))} | {ok} |"
            )
    lines += ["", "| c | first audio upstream / edgeomni | RTF upstream / edgeomni | "
              "audio-s/s edgeomni / upstream |", "|---|---|---|---|"]  # fmt: skip
    for c, r in report["comparisons"].items():
        lines.append(
            f"| {c} | {fmt(r['first_audio_upstream_over_edgeomni'], 2)}x | "
            f"{fmt(r['rtf_upstream_over_edgeomni'], 2)}x | "
            f"{fmt(r['throughput_edgeomni_over_upstream'], 2)}x |"
        )
    lines += ["", *target_lines(report), "", "Published peers (not reproduced here):", ""]
    for p in PEERS:
        extra = (f"; {p['audio_s_per_s']} audio-s/s at c={p['audio_s_per_s_at_c']}"
                 if "audio_s_per_s" in p else "")  # fmt: skip
        lines.append(f"- {p['name']} ({p['setup']}): c=1 {p.get('first_audio_is', 'first audio')} "
                     f"{p['first_audio_ms_c1']} ms, RTF {p['rtf_c1']}{extra}")  # fmt: skip
    codes = report.get("same_codes_c1")
    codes_s = ("n/a" if codes is None else "yes" if codes["same"]
               else f"no (from frame {codes['first_differing_frame']})")  # fmt: skip
    ed_meta = report["sides"].get("edgeomni", {}).get("meta", {})
    up_meta = report["sides"].get("upstream", {}).get("meta", {})
    lines += [
        "",
        f"- edgeomni: edge-build engines on {cfg['device']} ({cfg['dtype']} talker and code "
        f"predictor, float32 code2wav; built for batch {cfg['limits']['max_batch_size']}, "
        f"input {cfg['limits']['max_input_len']}, KV {cfg['limits']['max_kv_cache_capacity']}), "
        f"ONNX Runtime {ed_meta.get('versions', {}).get('onnxruntime', '?')}, Pipeline "
        f"{json.dumps(ed_meta.get('pipeline_options', {}))}; vocoder windows: "
        + (
            f"first {win.get('first_window_frames')} frames, doubling to "
            f"{win.get('window_frames')} (left context {win.get('left_context_frames')}). "
            if win
            else "- (no engine). "
        )
        + "First audio: each request's "
        "first AudioChunk with samples, from the submission; RTF: its last event / its audio.",
        f"- upstream: qwen-tts {up_meta.get('versions', {}).get('qwen-tts', '?')} on transformers "
        f"{up_meta.get('versions', {}).get('transformers', '?')}, torch "
        f"{up_meta.get('versions', {}).get('torch', '?')}, {up_cfg}, one generate_custom_voice "
        "call of c texts (a batch, left-padded); it returns whole audio only, so first audio = "
        "the call's wall time and RTF = wall / audio.",
        f"- both: the same checkpoint and text ({len(TEXT)} characters), non-streaming text mode, "
        "repetition penalty 1.05, the codec EOS row zeroed (exactly the frames asked for). "
        f"Same codes at c=1: {codes_s} (expected only where both sides run the same dtype). "
        "Random weights: speed, not quality.",
    ]
    for side in SIDES:
        s = report["sides"].get(side)
        if s and (s["missing"] or s["error"]):
            why = (s["error"] or "").splitlines()[0][:200] if s["error"] else "not run"
            lines.append(f"- {side}: not measured at c={s['missing']}: {why}")
    return "\n".join(lines) + "\n"


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
    p.add_argument("--logits-topk", type=int, help="edge-build's (default: the builder's)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="edgeomni without graph replay")
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


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 4 and sys.argv[1] in WORKERS:  # a worker process
        spec = json.loads(Path(sys.argv[2]).read_text())
        Path(sys.argv[3]).write_text(json.dumps(WORKERS[sys.argv[1]](spec), default=str))
        return 0
    args = parse_args(argv)
    started = time.time()
    deadline = None if args.time_limit is None else started + args.time_limit
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work / f"{args.size}-s{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    log = args.out / "gpu_tts.log"
    commands: list[dict] = []
    say(f"Qwen3-TTS {args.size} on {args.device}, c={args.concurrency}, {args.frames} frames; "
        f"work {work}; worker output in {log}")  # fmt: skip

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
            "whole_utterance": args.whole_utterance,
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
