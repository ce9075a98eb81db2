"""Qwen3-TTS on this CPU: edgeomni against upstream qwen-tts 0.1.1, side by side, on one checkpoint.

Builds random-weight Qwen3-TTS checkpoints (no download) with upstream's own classes, in the
release layout, at Qwen3-TTS-12Hz-0.6B's dimensions (``--size 0.6b``: talker 28 layers x 1024,
code predictor 5 x 1024, 12 Hz codec with a Mimi encoder; ``--size tiny``: the parity tests'
tiny dimensions, to check the script in a minute): a CustomVoice and a Base checkpoint. Then
edge-build builds each, and every side runs in a fresh process of its own, one after another:

- CustomVoice (speaker vivian, English): edgeomni's pipeline (ONNX Runtime; the vocoder runs in
  windows while the talker runs, and again vocoding the whole utterance after the talker), and
  upstream's ``Qwen3TTSModel.generate_custom_voice`` (PyTorch, in the reference venv).
- Voice clone from a reference clip (ICL: clip + its transcript) on the Base checkpoint:
  edgeomni's request with ``ref_audio`` / ``ref_text``, and upstream's
  ``create_voice_clone_prompt`` + ``generate_voice_clone`` (both timed). When edgeomni's Base
  graph cannot serve the request, clone is reported as not measured, with the error.

Both sides: the same text, non-streaming text mode, greedy talker and sub-talker (``--sampled``:
the release's sampling defaults) with the release's repetition penalty 1.05, batch 1, float32,
the same intra-op threads, exactly ``--frames`` codec frames (the codec EOS row of the talker's
head is zeroed, so neither stops early). Printed: wall time, audio seconds, RTF (wall / audio),
time to first audio (upstream returns whole audio only, so its first audio is its wall time),
the ratios upstream / edgeomni, and whether the codes agree. A warm-up run is discarded; the
median of ``--repeats`` runs is reported, with every run's wall time. Upstream runs twice per
task by default: with OMP_WAIT_POLICY unset (torch's OpenMP threads spin between parallel
regions) and with PASSIVE (they sleep), since spinning cost upstream ~10x on the tiny model on
this 2-core VM; the ratios are given against each.

    python bench/qwen3_tts_cpu.py [--size 0.6b|tiny] [--frames 60] [--repeats 3] [--threads 2]
        [--work DIR] [--out DIR] [--stop-after checkpoints|build] [--sampled] [--rebuild]
        [--window-frames 25] [--first-window-frames N] [--no-whole-utterance] [--no-clone]
        [--upstream-omp-wait-policy default,PASSIVE]

Checkpoints and engines are cached in ``--work`` (per size) and reused; ``--stop-after build``
makes them and exits. Upstream runs in its reference venv (tests/qwen_tts_reference/make_venv.py,
``$EDGEOMNI_QWEN_TTS_REF`` or ~/.cache/edgeomni/qwen-tts-ref-0.1.1), which has no edgeomni; this
file is also the worker that runs there (``_make``, ``_upstream``) and the edgeomni worker
(``_edgeomni``, ``_build``), each taking a JSON spec file and writing a JSON result file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from qwen3_tts_checkpoints import KINDS, SAMPLES_PER_FRAME, SR, make_checkpoints

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TEXT = (
    "Hello world, this is a test of the speech engine on a small machine, with both sides "
    "speaking the same words in the same voice."
)
REF_TEXT = "The reference says hi, and then it keeps on talking for a little while."
SPEAKER, LANGUAGE = "vivian", "English"
# edge-build limits: batch 1; the talker's prompt (text, ICL reference codes) and its frames
# fit the KV cache (the talker stops at its capacity, so the frame counts are checked)
LIMITS = {"max_batch_size": 1, "max_input_len": 512, "max_kv_cache_capacity": 2048}
# The release's sampling (generation_config.json), and greedy as the parity tests pass it
RELEASE_SAMPLING = {
    "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9,
    "repetition_penalty": 1.05, "subtalker_dosample": True, "subtalker_top_k": 50,
    "subtalker_top_p": 1.0, "subtalker_temperature": 0.9,
}  # fmt: skip
GREEDY = {**RELEASE_SAMPLING, "do_sample": False, "subtalker_dosample": False}


# -- shared helpers ---------------------------------------------------------------------------
def peak_rss_gib() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def reference_env(threads: int, wait_policy: str | None = None) -> dict[str, str]:
    """The environment of a worker: no other venv's paths, ``threads`` OpenMP threads, no hub;
    ``wait_policy``: OMP_WAIT_POLICY (None: unset, the OpenMP runtime's default)."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "OMP_WAIT_POLICY")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    if wait_policy is not None:
        env["OMP_WAIT_POLICY"] = wait_policy
    return env


def worker(
    python: Path | str, name: str, spec: dict, threads: int, timeout: float,
    wait_policy: str | None = None,
) -> dict:  # fmt: skip
    """Run this file's worker ``name`` under ``python`` in a fresh process; its JSON result (or
    ``{"error": ...}`` with the tail of its output when it failed)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [str(python), str(Path(__file__).resolve()), name, str(spec_path), str(result_path)]
        env = reference_env(threads, wait_policy)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                                  check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"error": f"{name}: timed out after {timeout:.0f} s"}
        if proc.returncode or not result_path.is_file():
            tail = (proc.stdout[-2000:] + proc.stderr[-4000:]).strip()
            return {"error": f"{name} exited {proc.returncode}:\n{tail}"}
        return json.loads(result_path.read_text())


# -- in the reference venv: upstream's runs ---------------------------------------------------
def run_upstream(spec: dict) -> dict:
    """Upstream's wrapper: load, one warm-up call, ``repeats`` timed calls (clone: the prompt
    from the reference clip is made inside each timed call)."""
    import numpy as np
    import qwen_tts
    import torch
    import transformers

    torch.set_num_threads(spec["threads"])
    start = time.perf_counter()
    tts = qwen_tts.Qwen3TTSModel.from_pretrained(spec["ckpt"], dtype=torch.float32)
    load_s = time.perf_counter() - start
    model = tts.model
    captured: dict[str, Any] = {}
    original = model.generate

    def generate(*a: Any, **k: Any) -> Any:  # records the talker's codes, passes them on
        codes_list, hiddens = original(*a, **k)
        captured["codes"] = codes_list[0]
        return codes_list, hiddens

    model.generate = generate
    kw = {**(RELEASE_SAMPLING if spec["sampled"] else GREEDY), "max_new_tokens": spec["steps"]}
    runs = []
    for i in range(spec["warmup"] + spec["repeats"]):
        torch.manual_seed(i)
        start = time.perf_counter()
        prompt_s = None
        if spec["kind"] == "custom_voice":
            wavs, sr = tts.generate_custom_voice(
                text=spec["text"], speaker=SPEAKER, language=LANGUAGE, non_streaming_mode=True,
                **kw,
            )  # fmt: skip
        else:
            items = tts.create_voice_clone_prompt(
                ref_audio=spec["ref_audio"], ref_text=spec["ref_text"], x_vector_only_mode=False
            )
            prompt_s = time.perf_counter() - start
            wavs, sr = tts.generate_voice_clone(
                text=spec["text"], language=LANGUAGE, voice_clone_prompt=items,
                non_streaming_mode=True, **kw,
            )  # fmt: skip
        wall = time.perf_counter() - start
        if i < spec["warmup"]:
            continue
        run = {"wall_s": round(wall, 4), "audio_s": round(len(wavs[0]) / sr, 4),
               "first_audio_s": round(wall, 4),
               "frames": int(captured["codes"].shape[0])}  # fmt: skip
        if prompt_s is not None:
            run["clone_prompt_s"] = round(prompt_s, 4)
        runs.append(run)
    return {
        "load_s": round(load_s, 2),
        "runs": runs,
        "codes": captured["codes"].long().cpu().numpy().astype(np.int64).tolist(),
        "peak_rss_gib": peak_rss_gib(),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "versions": {
            "qwen-tts": dist_version("qwen-tts"),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "threads": torch.get_num_threads(),
    }


def dist_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


# -- in the project venv: edgeomni ------------------------------------------------------------
def run_build(spec: dict) -> dict:
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    start = time.perf_counter()
    build(Path(spec["ckpt"]), Path(spec["engine"]), BuildArgs(**spec["limits"]))
    return {"seconds": round(time.perf_counter() - start, 1), "peak_rss_gib": peak_rss_gib()}


def run_edgeomni(spec: dict) -> dict:
    """edgeomni's pipeline: open, one warm-up request, ``repeats`` timed requests; first audio
    is the first AudioChunk with samples (from the call to Pipeline.run)."""
    import numpy as np
    import onnxruntime

    from edgeomni.runtime.engine import Engines
    from edgeomni.runtime.events import AudioChunk
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    beside = spec.get("vocoder_threads") or None  # the vocoder's threads on its own thread
    engines = Engines(threads=spec["threads"])
    pipe = Pipeline(spec["engine"], engines=engines, whole_utterance=spec["whole"],
                    code2wav_streaming=spec.get("streaming"), vocoder_threads=beside)  # fmt: skip
    requests, _ = parse_request_file(spec["body"])
    n = int(spec.get("concurrency", 1))  # the same request n times at once, one batch
    requests = requests * n
    runs = []
    for i in range(spec["warmup"] + spec["repeats"]):
        first: list[float] = []
        start = time.perf_counter()

        def listen(event: object, start: float = start, first: list[float] = first) -> None:
            if not first and isinstance(event, AudioChunk) and event.samples.size:
                first.append(time.perf_counter() - start)

        outs = pipe.run(requests, batch_size=n, listener=listen)
        wall = time.perf_counter() - start
        out = outs[0]
        failed = next((o for o in outs if not o.entry["ok"]), None)
        if failed is not None:
            return {"error": failed.entry["error"], "load_s": round(pipe.profile.load_seconds, 2)}
        if i < spec["warmup"]:
            continue
        stages = out.entry["stages"]
        vocoder = next((s for s in stages.values() if "first_audio_ms" in s), {})
        runs.append(
            {
                "wall_s": round(wall, 4),
                "audio_s": round(sum(len(o.audio) for o in outs) / out.sample_rate, 4),
                "first_audio_s": round(first[0] if first else wall, 4),
                "first_audio_entry_s": round(vocoder.get("first_audio_ms", float("nan")) / 1e3, 4),
                "frames": int(len(out.codes)),
            }
        )
    return {
        "load_s": round(pipe.profile.load_seconds, 2),
        "runs": runs,
        "codes": np.asarray(out.codes, dtype=np.int64).tolist(),
        "stages": out.entry["stages"],
        "peak_rss_gib": peak_rss_gib(),
        "versions": {
            "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
        "threads": spec["threads"],
    }


WORKERS = {
    "_make": make_checkpoints,
    "_upstream": run_upstream,
    "_build": run_build,
    "_edgeomni": run_edgeomni,
}


# -- the driver (project venv) ----------------------------------------------------------------
def reference_python() -> Path:
    root = os.environ.get("EDGEOMNI_QWEN_TTS_REF")
    if root is None:
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        root = str(cache / "edgeomni" / "qwen-tts-ref-0.1.1")
    python = Path(root) / "bin" / "python"
    if not python.is_file():
        raise SystemExit(
            f"no upstream reference venv at {root}: make it with "
            f"`.venv/bin/python tests/qwen_tts_reference/make_venv.py` (needs network once)"
        )
    return python


def dir_gib(path: Path) -> float:
    return round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**30, 2)


def source_fingerprint() -> str:
    """A hash of the export and builder sources: an engine built by other code is stale."""
    h = hashlib.sha256()
    for folder in ("export", "builder", "plugins"):
        for f in sorted((REPO / folder).rglob("*.py")):
            h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def graph_reads(engine: Path, field: str) -> bool:
    graph = json.loads((engine / "multistage_config.json").read_text())
    return any(
        inp.get("from") == f"request:{field}" for s in graph["stages"] for inp in s["inputs"]
    )


def checkpoints(args: argparse.Namespace, work: Path, ref_python: Path) -> dict:
    """Make the checkpoints once per size (the marker is written last)."""
    marker = work / "checkpoints.json"
    if marker.is_file():
        info = json.loads(marker.read_text())
        return {**info, "cached": True}
    print(f"making the {args.size} checkpoints in {work} (upstream's classes) ...", flush=True)
    spec = {"size": args.size, "dir": str(work), "threads": args.threads,
            "ref_seconds": args.ref_seconds}  # fmt: skip
    start = time.perf_counter()
    info = worker(ref_python, "_make", spec, args.threads, timeout=7200)
    if "error" in info:
        raise SystemExit(f"making the checkpoints failed: {info['error']}")
    info["wall_s"] = round(time.perf_counter() - start, 1)
    info["disk_gib"] = {
        k: dir_gib(work / d) for k, d in (*((k, k) for k in KINDS), ("codec", "codec"))
    }
    marker.write_text(json.dumps(info, indent=2) + "\n")
    return {**info, "cached": False}


def engines(args: argparse.Namespace, work: Path) -> dict[str, dict]:
    """Build each checkpoint's engines once; a Base engine whose graph reads no reference
    audio is rebuilt when the export code has changed since (the clone stages may have landed)."""
    fingerprint = source_fingerprint()
    out: dict[str, dict] = {}
    for kind in KINDS:
        engine = work / f"{kind}-engine"
        stamp_path = engine / "bench_stamp.json"
        stamp = json.loads(stamp_path.read_text()) if stamp_path.is_file() else None
        built = (engine / "multistage_config.json").is_file() and stamp is not None
        stale = built and stamp["limits"] != LIMITS
        if built and kind == "base" and not graph_reads(engine, "ref_audio"):
            stale = stale or stamp["source"] != fingerprint
        if built and not stale and not args.rebuild:
            out[kind] = {**stamp, "engine": str(engine), "cached": True}
            if stamp["source"] != fingerprint:
                out[kind]["note"] = "built by other export code than this checkout's (--rebuild)"
            continue
        print(f"edge-build {kind} -> {engine} ...", flush=True)
        spec = {"ckpt": str(work / kind), "engine": str(engine), "limits": LIMITS}
        result = worker(sys.executable, "_build", spec, args.threads, timeout=7200)
        if "error" in result:
            out[kind] = {"error": result["error"], "engine": str(engine)}
            print(f"  failed: {result['error'][-600:]}", flush=True)
            continue
        stamp = {"limits": LIMITS, "source": fingerprint, "build_s": result["seconds"],
                 "build_peak_rss_gib": result["peak_rss_gib"], "disk_gib": dir_gib(engine),
                 "date": time.strftime("%Y-%m-%d %H:%M")}  # fmt: skip
        stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
        out[kind] = {**stamp, "engine": str(engine), "cached": False}
        print(f"  {result['seconds']} s, {stamp['disk_gib']} GiB", flush=True)
    return out


def upstream_variants(policies: str) -> list[tuple[str, str | None]]:
    """(side label, OMP_WAIT_POLICY) for each upstream run: torch's OpenMP threads spin while
    they wait by default, which on a 2-core VM can cost upstream several times its compute
    (make_reference.py runs one thread for that reason), so PASSIVE is measured beside it."""
    out = []
    for policy in policies.split(","):
        policy = policy.strip()
        if policy.lower() == "default":
            out.append(("upstream", None))
        elif policy.upper() in ("PASSIVE", "ACTIVE"):
            out.append((f"upstream OMP_WAIT_POLICY={policy.upper()}", policy.upper()))
        else:
            raise SystemExit(f"--upstream-omp-wait-policy: {policy!r} (default, PASSIVE, ACTIVE)")
    return out


def set_windows(engine: Path, window: int | None, first: int | None) -> dict:
    """The vocoder's windows in the graph's code2wav stage config (None: leave the build's);
    returns the stage config now in force."""
    path = engine / "multistage_config.json"
    graph = json.loads(path.read_text())
    config: dict = {}
    for stage in graph["stages"]:
        if stage["runner"].endswith(".code2wav"):
            config = dict(stage.get("config", {}))
            for key in ("window_frames", "first_window_frames"):
                config.pop(key, None)
            if window is not None:
                config["window_frames"] = window
            if first is not None or window is not None:
                config["first_window_frames"] = first or window
            stage["config"] = config
    path.write_text(json.dumps(graph, indent=2) + "\n")
    return config


def edgeomni_body(args: argparse.Namespace, clone: Path | None) -> dict:
    request: dict[str, Any] = {
        "messages": [{"role": "assistant", "content": TEXT}],
        "language": LANGUAGE,
        "sampling": {"talker_non_streaming_mode": 1},
    }
    if clone is None:
        request["speaker"] = SPEAKER
    else:
        request.update(ref_audio=str(clone), ref_text=REF_TEXT)
    body: dict[str, Any] = {"requests": [request], "talker_max_new_tokens": args.frames + 1}
    if not args.sampled:  # upstream's greedy: the talker and the code predictor each told so
        body.update(talker_do_sample=0, subtalker_dosample=0)
    return body


def summary(result: dict) -> dict:
    runs = result["runs"]
    wall = statistics.median(r["wall_s"] for r in runs)
    audio = statistics.median(r["audio_s"] for r in runs)
    row = {
        "wall_s": round(wall, 3),
        "audio_s": round(audio, 3),
        "rtf": round(wall / audio, 3) if audio else None,
        "first_audio_s": round(statistics.median(r["first_audio_s"] for r in runs), 3),
        "frames": sorted({r["frames"] for r in runs}),
        "wall_s_runs": [r["wall_s"] for r in runs],
        "load_s": result["load_s"],
        "peak_rss_gib": result["peak_rss_gib"],
    }
    if "clone_prompt_s" in runs[0]:
        row["clone_prompt_s"] = round(statistics.median(r["clone_prompt_s"] for r in runs), 3)
    return row


def compare_codes(a: list, b: list) -> dict:
    """Whether two runs' codes agree, and where they first differ (frame index)."""
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return {"same": first is None, "first_differing_frame": first, "frames": [len(a), len(b)]}


def machine() -> dict:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.processor() or platform.machine(),
    )  # fmt: skip
    try:
        mem = next(int(x.split()[1]) for x in Path("/proc/meminfo").read_text().splitlines()
                   if x.startswith("MemTotal"))  # fmt: skip
        mem_gib = round(mem / 2**20, 1)
    except (OSError, StopIteration):
        mem_gib = None
    git = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True,
                           text=True, check=False).stdout.strip()  # fmt: skip
    return {"cpu": cpu, "arch": platform.machine(), "cores": os.cpu_count(), "mem_gib": mem_gib,
            "os": platform.platform(), "edgeomni_commit": git + ("+dirty" if dirty else "")}  # fmt: skip


def table(report: dict) -> str:
    """The markdown write-up: one row per side and task, then the ratios."""
    lines = [
        f"Qwen3-TTS {report['size']} on CPU ({report['date']}): {report['machine']['cpu']}, "
        f"{report['threads']} intra-op threads a side, {report['frames']} frames "
        f"({report['frames'] * SAMPLES_PER_FRAME / SR:.2f} s of audio), "
        f"{'sampled (release defaults)' if report['sampled'] else 'greedy'}, median of "
        f"{report['repeats']} after {report['warmup']} warm-up.",
        "",
        "| task | side | wall s | audio s | RTF | first audio s | frames | runs (wall s) | load s | peak RSS GiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for task, sides in report["tasks"].items():
        for side, row in sides["sides"].items():
            if "error" in row:
                lines.append(f"| {task} | {side} | not measured | | | | | | | |")
                continue
            runs = ", ".join(f"{w:.2f}" for w in row["wall_s_runs"])
            first = f"{row['first_audio_s']:.3f}" + (" (= wall)" if side[0] == "u" else "")
            lines.append(
                f"| {task} | {side} | {row['wall_s']:.3f} | {row['audio_s']:.3f} | "
                f"{row['rtf']:.3f} | {first} | {'/'.join(map(str, row['frames']))} | {runs} | "
                f"{row['load_s']:.1f} | {row['peak_rss_gib']:.2f} |"
            )
    lines += ["", "| task | edgeomni | against | RTF upstream / edgeomni | first audio upstream / edgeomni | same codes |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for task, sides in report["tasks"].items():
        for pair, ratio in sides.get("ratios", {}).items():
            same = sides.get("codes", {}).get(pair)
            same_s = "n/a (sampled)" if same is None else (
                "yes" if same["same"] else f"no (from frame {same['first_differing_frame']})")  # fmt: skip
            lines.append(f"| {task} | {ratio['edgeomni']} | {ratio['upstream']} | {ratio['rtf']}x | "
                         f"{ratio['first_audio']}x | {same_s} |")  # fmt: skip
        if sides.get("not_measured"):
            lines.append(f"| {task} | not measured | | | | |")
    notes = [f"- {task}: not measured: {s['not_measured'].splitlines()[-1][:300]}"
             for task, s in report["tasks"].items() if s.get("not_measured")]  # fmt: skip
    lines += ["", *report["what"], *notes]
    return "\n".join(lines) + "\n"


def what_each_side_does(args: argparse.Namespace, windows: dict) -> list[str]:
    win = (f"windows of {windows.get('window_frames', 'the build default')} frames (first "
           f"{windows.get('first_window_frames', windows.get('window_frames', 'the same'))})")  # fmt: skip
    return [
        f"- edgeomni: edge-build's ONNX Runtime engines (float32, CPU provider, Engines(threads="
        f"{args.threads})): talker and code predictor per frame, code2wav in {win} while the "
        'talker runs; "whole utterance" vocodes after the talker. Wall: the Pipeline.run call; '
        "first audio: its first AudioChunk with samples.",
        f"- upstream: qwen-tts 0.1.1 Qwen3TTSModel (PyTorch eager, float32, "
        f"torch.set_num_threads({args.threads})), generate_custom_voice / create_voice_clone_prompt"
        " + generate_voice_clone (the clone prompt, speech-tokenizer encode and speaker "
        "embedding, is timed inside the call); it returns the whole waveform, so its first audio "
        'is its wall time. "upstream": OMP_WAIT_POLICY unset (torch\'s OpenMP threads spin '
        'between parallel regions); "upstream OMP_WAIT_POLICY=PASSIVE": they sleep (on this '
        "2-core VM spinning cost the tiny model ~10x; edgeomni's ORT threads do not spin when "
        "several stages take turns).",
        f"- both: the same random-weight checkpoint, text ({len(TEXT)} characters), non-streaming "
        f"text mode, {'release sampling' if args.sampled else 'greedy talker and sub-talker'}, "
        "repetition penalty 1.05, batch 1, the codec EOS row zeroed so each run makes exactly "
        "the frames asked; the sides run one after the other, each in a fresh process. "
        "Weights are random: speed, not quality.",
    ]


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] in WORKERS:  # a worker process
        spec = json.loads(Path(sys.argv[2]).read_text())
        Path(sys.argv[3]).write_text(json.dumps(WORKERS[sys.argv[1]](spec)))
        return 0
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size", choices=("0.6b", "tiny"), default="0.6b")
    p.add_argument("--frames", type=int, default=60, help="codec frames per utterance (12.5/s)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per side (the median)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per side first")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads, each side")
    p.add_argument("--sampled", action="store_true", help="the release's sampling, not greedy")
    p.add_argument("--window-frames", type=int, default=25, help="edgeomni's vocoder window")
    p.add_argument("--first-window-frames", type=int, help="a shorter first window (default: same)")
    p.add_argument("--no-whole-utterance", action="store_true",
                   help="skip edgeomni's whole-utterance vocoding run")  # fmt: skip
    p.add_argument("--no-clone", action="store_true", help="CustomVoice only")
    p.add_argument(
        "--upstream-omp-wait-policy", default="default,PASSIVE",
        help="upstream's runs, one per OMP_WAIT_POLICY listed (default: the OpenMP runtime's)",
    )  # fmt: skip
    p.add_argument("--ref-seconds", type=float, default=5.0, help="the reference clip (clone)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edgeomni-tts-bench")
    p.add_argument("--out", type=Path, help="write qwen3_tts_cpu.json and qwen3_tts_cpu.md here")
    p.add_argument("--stop-after", choices=("checkpoints", "build"))
    p.add_argument("--rebuild", action="store_true", help="rebuild the engines")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per worker process")
    args = p.parse_args()

    upstream_variants(args.upstream_omp_wait_policy)  # a bad value fails before any work
    ref_python = reference_python()
    work = args.work / args.size
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "size": args.size,
        "frames": args.frames,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "threads": args.threads,
        "sampled": args.sampled,
        "text": TEXT,
        "ref_text": REF_TEXT,
        "limits": LIMITS,
        "work": str(work),
    }
    report["checkpoints"] = checkpoints(args, work, ref_python)
    if args.stop_after != "checkpoints":
        start = time.perf_counter()
        report["engines"] = engines(args, work)
        report["build_wall_s"] = round(time.perf_counter() - start, 1)
    if args.stop_after is not None:
        print(json.dumps({k: report[k] for k in ("checkpoints", "engines") if k in report},
                         indent=2))  # fmt: skip
        return write(args, report, None)
    if "error" in report["engines"]["custom_voice"]:
        raise SystemExit("the CustomVoice build failed: nothing to compare")

    tasks: dict[str, dict] = {}
    steps = args.frames + 1  # the talker's last step draws the code that gets no frame

    def side(label: str, python: Path | str, name: str, spec: dict, policy: str | None = None):
        print(f"{label} ...", flush=True)
        spec = {**spec, "threads": args.threads, "repeats": args.repeats, "warmup": args.warmup}
        result = worker(python, name, spec, args.threads, args.timeout, policy)
        if "error" not in result:
            frames = {r["frames"] for r in result["runs"]}
            if frames != {args.frames}:
                result["error"] = f"made {sorted(frames)} frames, not {args.frames}"
        if "error" in result:
            print(f"  {label}: {result['error'][-1500:]}", flush=True)
        else:
            s = summary(result)
            print(f"  wall {s['wall_s']} s, RTF {s['rtf']}, first audio {s['first_audio_s']} s",
                  flush=True)  # fmt: skip
        return result

    cv_engine = Path(report["engines"]["custom_voice"]["engine"])
    windows = set_windows(cv_engine, args.window_frames, args.first_window_frames)
    report["vocoder_stage_config"] = windows
    up_spec = {"text": TEXT, "sampled": args.sampled, "steps": steps}
    results: dict[str, dict[str, dict]] = {"custom_voice": {}}
    ed = {"body": edgeomni_body(args, None), "engine": str(cv_engine)}
    results["custom_voice"]["edgeomni"] = side(
        "edgeomni CustomVoice", sys.executable, "_edgeomni", {**ed, "whole": False}
    )
    if not args.no_whole_utterance:
        results["custom_voice"]["edgeomni whole utterance"] = side(
            "edgeomni CustomVoice, whole utterance", sys.executable, "_edgeomni",
            {**ed, "whole": True},
        )  # fmt: skip
    for label, policy in upstream_variants(args.upstream_omp_wait_policy):
        results["custom_voice"][label] = side(
            f"{label} CustomVoice", ref_python, "_upstream",
            {**up_spec, "kind": "custom_voice", "ckpt": str(work / "custom_voice")}, policy,
        )  # fmt: skip
    clone_error = None
    if not args.no_clone:
        base = report["engines"]["base"]
        ref = work / "ref.wav"
        if "error" in base:
            clone_error = f"edge-build of the Base checkpoint failed: {base['error']}"
        else:
            set_windows(Path(base["engine"]), args.window_frames, args.first_window_frames)
            ours = side(
                "edgeomni voice clone", sys.executable, "_edgeomni",
                {"body": edgeomni_body(args, ref), "engine": base["engine"], "whole": False},
            )  # fmt: skip
            if "error" in ours:
                clone_error = f"edgeomni's voice clone failed: {ours['error']}"
            else:
                results["clone"] = {"edgeomni": ours}
                for label, policy in upstream_variants(args.upstream_omp_wait_policy):
                    results["clone"][label] = side(
                        f"{label} voice clone", ref_python, "_upstream",
                        {**up_spec, "kind": "base", "ckpt": str(work / "base"),
                         "ref_audio": str(ref), "ref_text": REF_TEXT}, policy,
                    )  # fmt: skip
        if clone_error:
            print(f"voice clone not measured: {clone_error.splitlines()[0][:300]}", flush=True)
            tasks["clone"] = {"sides": {}, "not_measured": clone_error}

    versions: dict[str, dict] = {}
    for task, sides in results.items():
        entry: dict[str, Any] = {"sides": {}, "ratios": {}, "codes": {}, "raw": {}}
        for name, result in sides.items():
            if "error" in result:
                entry["sides"][name] = {"error": result["error"]}
                continue
            entry["sides"][name] = summary(result)
            entry["raw"][name] = {k: v for k, v in result.items() if k not in ("codes", "versions")}
            versions[name.split()[0]] = result["versions"]
        ok = {n: r for n, r in entry["sides"].items() if "error" not in r}
        for ours in (n for n in ok if n.startswith("edgeomni")):
            for theirs in (n for n in ok if n.startswith("upstream")):
                pair = f"{ours} vs {theirs}"
                entry["ratios"][pair] = {
                    "edgeomni": ours,
                    "upstream": theirs,
                    "rtf": round(ok[theirs]["rtf"] / ok[ours]["rtf"], 2),
                    "first_audio": round(
                        ok[theirs]["first_audio_s"] / ok[ours]["first_audio_s"], 2
                    ),
                }
                if not args.sampled:
                    entry["codes"][pair] = compare_codes(
                        sides[ours]["codes"], sides[theirs]["codes"]
                    )
        failed = [n for n, r in entry["sides"].items() if "error" in r]
        if failed:
            entry["not_measured"] = "; ".join(f"{n}: {entry['sides'][n]['error']}" for n in failed)
        tasks[task] = entry
    report["tasks"] = {k: tasks[k] for k in ("custom_voice", "clone") if k in tasks}
    report["versions"] = versions
    report["what"] = what_each_side_does(args, windows)
    md = table(report)
    print("\n" + md)
    return write(args, report, md)


def write(args: argparse.Namespace, report: dict, md: str | None) -> int:
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "qwen3_tts_cpu.json").write_text(json.dumps(report, indent=2) + "\n")
        if md is not None:
            (args.out / "qwen3_tts_cpu.md").write_text(md)
        print(f"wrote {args.out / 'qwen3_tts_cpu.json'}" + (" and .md" if md else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
