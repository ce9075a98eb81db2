"""The worker processes of bench/gpu_tts.py: the checkpoint maker, edge-build, edgeomni's
pipeline and upstream qwen-tts, each run in a fresh process (a JSON spec in, a JSON result out).

Apart from gpu_tts.py to keep each file under the project's 800-line limit; gpu_tts.py runs
itself as ``python bench/gpu_tts.py _NAME SPEC RESULT`` and calls ``WORKERS[_NAME]``. Standard
library only at import (the upstream worker's interpreter may have neither torch nor edgeomni
on its path until it loads them).
"""

from __future__ import annotations

import json
import math
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from gpu_common import Timeline
from qwen3_tts_cpu import GREEDY, LANGUAGE, RELEASE_SAMPLING, SPEAKER, dist_version

TAG = "[gpu_tts]"


def say(message: str) -> None:
    print(f"{TAG} {message}", flush=True)


def p50(values: list[float]) -> float:
    return statistics.median(values)


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
            "frames_summed_on_device", "first_codes_drawn_on_device",
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
    if spec.get("host_frame_sum"):  # the comparison: no frame queued with its sum
        from edgeomni.runtime.speech.code_predictor import CodePredictor

        CodePredictor.queue_frame = lambda *args, **kwargs: None  # type: ignore[method-assign]
        options["host_frame_sum"] = True
    if spec.get("host_first_draw"):  # the comparison: each step's first codes drawn on the host
        from edgeomni.runtime.speech.talker import SpeechTalker

        SpeechTalker.draw = lambda *args, **kwargs: None  # type: ignore[method-assign]
        options["host_first_draw"] = True
    if spec.get("vocoder_beside"):  # the vocoder's calls on a thread (a stream) of their own
        options["vocoder_beside"] = True
    start = time.perf_counter()
    engines = Engines(threads=spec.get("threads") or None, cuda_graphs=spec["cuda_graphs"])
    pipe = Pipeline(spec["engine"], engines=engines, batching=spec["batching"],
                    whole_utterance=bool(spec.get("whole_utterance")),
                    vocoder_threads=1 if spec.get("vocoder_beside") else None)  # fmt: skip
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
