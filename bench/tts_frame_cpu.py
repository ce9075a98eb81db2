"""Where a Qwen3-TTS frame's time goes on this CPU, each part beside its bandwidth bound, and
the end-to-end RTF beside upstream qwen-tts in the same run (issue 53).

Qwen3-TTS CustomVoice at 0.6B dimensions (random weights; bench/int4_cpu.py's cached engines,
fp32 and int4 talker and code predictor, the code predictor built both ways edge-build can:
``frame``, one call a frame, the CPU's default, and ``steps``, one call a step), one request
streamed through edgeomni's pipeline, a fixed number of greedy frames, with the stateful
vocoder (the CPU default) and, with ``--vocoder stateful,windows``, the windowed one. From the
request's own report (the talker's and the vocoder's stage details), per codec frame:

- talker step: the time inside its engine calls (prefill included), and its bound: the talker
  engine's bytes (its weights as stored) at the best measured read bandwidth;
- code predictor: its engine time (15 calls, or one frame call), and its bound: 15 reads of its
  decoder body and one head each (each step reads the head it uses);
- host: the talker's and the code predictor's time outside their engine calls (inputs, draws,
  the codec-embedding sum, Python);
- vocoder: the stateful step's or the windows' time (vocode_ms; inline on the same thread);
  with ``--vocoder-threads 0,1``, also the vocoder on a thread of its own, its engine on one
  CPU thread, while the decoders keep theirs (edge-infer --vocoder-threads 1): its calls then
  overlap the decoders, so the rest is the wall less the decoders' time alone;
- the rest of the wall (the scheduler, events, writing the output).

Upstream qwen-tts (its reference venv, tests/qwen_tts_reference/make_venv.py; float32, eager,
the same threads) speaks the same text for the same frames, greedy; its codes are compared with
each edgeomni engine's. RTF is wall / audio seconds; real time needs a frame in 80 ms.

    python bench/tts_frame_cpu.py [--frames 60] [--repeats 3] [--threads 2]
        [--calls frame,steps] [--vocoder stateful,windows] [--vocoder-threads 0,1]
        [--precisions fp32,int4] [--concurrency N] [--no-upstream] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from int4_cpu import tts_engines  # noqa: E402 - one definition each
from llm_decode_cpu import read_bandwidth_gbs  # noqa: E402

FRAME_MS = 80.0  # 12.5 codec frames a second
CP_STEPS = 15  # code predictor calls a frame (16 codebooks, the first from the talker)


def engine_bytes(folder: Path) -> int:
    """An engine folder's weights as stored (its ONNX file and external data)."""
    return sum(p.stat().st_size for p in folder.iterdir()
               if p.name.endswith((".onnx", ".onnx.data", ".data")))  # fmt: skip


def head_bytes(folder: Path) -> int:
    """The code predictor's 15 heads as stored: a frame engine's ``frame_heads.*`` (int4 in an
    int4 build), or a steps engine's stacked float heads."""
    import onnx

    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("calls") != "frame":
        return (int(cfg["num_code_groups"]) - 1) * int(cfg["hidden_size"]) * int(cfg["vocab_size"]) * 4
    model = onnx.load(str(folder / cfg["engine"]), load_external_data=False)
    return sum(len(t.raw_data) for t in model.graph.initializer
               if t.name.startswith("frame_heads."))  # fmt: skip


def code_predictor_frame_bytes(folder: Path) -> int:
    """What a frame's 15 steps read: the engine but its heads each time, and each head once."""
    heads = head_bytes(folder)
    return CP_STEPS * (engine_bytes(folder) - heads) + heads


def breakdown(run: dict[str, Any], engine: Path, bandwidth: float,
              beside: bool = False) -> dict[str, Any]:  # fmt: skip
    """Per-frame milliseconds of each part, of the last run (the stage details are its), and
    each decoder's bound; RTF the median of the runs'."""
    talker, vocoder = run["stages"]["talker"], run["stages"]["code2wav"]
    frames = int(talker["frames"])
    wall = run["runs"][-1]["wall_s"] * 1e3
    t_engine = talker["talker_engine_ms"]
    cp_engine = talker["code_predictor_engine_ms"]
    host = talker["talker_ms"] - t_engine + talker["code_predictor_ms"] - cp_engine
    vocode = vocoder["vocode_ms"]
    inline = 0.0 if beside else vocode  # on its own thread it overlaps the decoders
    talker_bound = engine_bytes(engine / "talker") / (bandwidth * 1e9) * 1e3
    cp_bound = code_predictor_frame_bytes(engine / "code_predictor") / (bandwidth * 1e9) * 1e3
    per = {
        "talker_engine_ms": t_engine / frames,
        "code_predictor_engine_ms": cp_engine / frames,
        "decoders_host_ms": host / frames,
        "vocoder_ms": vocode / frames,
        "rest_ms": (wall - t_engine - cp_engine - host - inline) / frames,
        "wall_ms": wall / frames,
    }
    return {
        "frames": frames,
        "audio_s": run["runs"][0]["audio_s"],
        "rtf": round(statistics.median(r["wall_s"] for r in run["runs"])
                     / run["runs"][0]["audio_s"], 3),
        "first_audio_s": statistics.median(r["first_audio_s"] for r in run["runs"]),
        "per_frame": {k: round(v, 2) for k, v in per.items()},
        "talker_bound_ms": round(talker_bound, 2),
        "code_predictor_bound_ms": round(cp_bound, 2),
        "talker_fraction_of_bound": round(talker_bound / per["talker_engine_ms"], 3),
        "code_predictor_fraction_of_bound": round(cp_bound / per["code_predictor_engine_ms"], 3),
        "talker_engine_bytes": engine_bytes(engine / "talker"),
        "code_predictor_frame_bytes": code_predictor_frame_bytes(engine / "code_predictor"),
        "vocoder_mode": vocoder.get("mode"),
        "vocoder_beside": beside,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--frames", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--group-size", type=int, default=32, choices=(32, 64, 128))
    p.add_argument("--calls", default="frame,steps", help="the code predictor builds to run")
    p.add_argument("--vocoder", default="stateful", help="stateful, windows or both (a,b)")
    p.add_argument("--vocoder-threads", default="0",
                   help="the stateful vocoder in the loop's turn (0) or on a thread of its own "
                   "with that many CPU threads (edge-infer --vocoder-threads); a list: each (a,b)")
    p.add_argument("--precisions", default="fp32,int4", help="the engines: fp32, int4 or both")
    p.add_argument("--concurrency", type=int, default=1,
                   help="that many copies of the request at once, one batch (an engine built for "
                   "that many rows; RTF is then the wall over all their audio)")
    p.add_argument("--no-upstream", action="store_true", help="leave qwen-tts out")
    p.add_argument("--upstream-repeats", type=int, default=1)
    p.add_argument("--bandwidth-probes", type=int, default=3, help="before and after the runs")
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    import qwen3_tts_cpu as tb

    calls = tuple(c for c in args.calls.split(",") if c)
    vocoders = tuple(v for v in args.vocoder.split(",") if v)
    precisions = tuple(x for x in args.precisions.split(",") if x)
    engines, body = tts_engines(args, calls, precisions, args.concurrency)
    probes = [read_bandwidth_gbs() for _ in range(args.bandwidth_probes)]
    besides = tuple(int(v) for v in args.vocoder_threads.split(",") if v)
    sides = [(v, b) for v in vocoders for b in besides if not (b and v != "stateful")]
    runs, folders, beside = {}, {}, {}
    for name, engine in engines.items():
        for vocoder, threads in sides:
            label = name if vocoders == ("stateful",) else f"{name}, {vocoder} vocoder"
            label += f", vocoder beside on {threads} thread" if threads else ""
            spec = {"engine": str(engine), "body": body, "threads": args.threads, "whole": False,
                    "warmup": 1, "repeats": args.repeats, "streaming": vocoder,
                    "vocoder_threads": threads, "concurrency": args.concurrency}  # fmt: skip
            print(f"{label} ...", file=sys.stderr, flush=True)
            run = tb.worker(sys.executable, "_edgeomni", spec, args.threads, timeout=7200)
            if "error" in run:
                raise SystemExit(run["error"])
            runs[label], folders[label], beside[label] = run, engine, bool(threads)
    upstream = None
    if not args.no_upstream and args.concurrency == 1:  # upstream speaks one at a time
        print("upstream qwen-tts ...", file=sys.stderr, flush=True)
        work = next(iter(engines.values())).parent
        spec = {"text": tb.TEXT, "sampled": False, "steps": args.frames + 1,
                "kind": "custom_voice", "ckpt": str(work / "custom_voice"),
                "threads": args.threads, "repeats": args.upstream_repeats, "warmup": 1}  # fmt: skip
        upstream = tb.worker(tb.reference_python(), "_upstream", spec, args.threads, timeout=7200)
        if "error" in upstream:
            raise SystemExit(upstream["error"])
    probes += [read_bandwidth_gbs() for _ in range(args.bandwidth_probes)]
    best = max(max(x.values()) for x in probes)
    rows = {name: breakdown(run, folders[name], best, beside[name])
            for name, run in runs.items()}  # fmt: skip
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "frames": args.frames, "threads": args.threads,
        "concurrency": args.concurrency,
        "best_read_bandwidth_gbs": round(best, 2),
        "bandwidth_probes_gbs": [round(max(x.values()), 2) for x in probes],
        "engines": rows, "stages": {n: r["stages"] for n, r in runs.items()},
    }  # fmt: skip
    if upstream is not None:
        wall = statistics.median(r["wall_s"] for r in upstream["runs"])
        audio = upstream["runs"][0]["audio_s"]
        result["upstream"] = {
            "rtf": round(wall / audio, 3), "wall_s": wall, "audio_s": audio,
            "frames": upstream["runs"][0]["frames"], "versions": upstream["versions"],
            "threads": upstream["threads"],
            "codes": {n: tb.compare_codes(r["codes"], upstream["codes"]) for n, r in runs.items()},
        }  # fmt: skip
        for r in rows.values():
            r["speedup_vs_upstream"] = round(result["upstream"]["rtf"] / r["rtf"], 2)
    print(json.dumps(result, indent=2))
    print("\n| engine | RTF | vs upstream | first audio | talker | its bound | code predictor "
          "| its bound | host | vocoder | rest | frame |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        f = r["per_frame"]
        print(f"| {name} | {r['rtf']} | {r.get('speedup_vs_upstream', '-')}x | "
              f"{r['first_audio_s']} s | {f['talker_engine_ms']} | {r['talker_bound_ms']} | "
              f"{f['code_predictor_engine_ms']} | {r['code_predictor_bound_ms']} | "
              f"{f['decoders_host_ms']} | {f['vocoder_ms']} | {f['rest_ms']} | "
              f"{f['wall_ms']} (real time: {FRAME_MS}) |")  # fmt: skip
    if upstream is not None:
        print(f"| upstream qwen-tts fp32 | {result['upstream']['rtf']} | 1.0x | "
              f"(whole audio) | | | | | | | | |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
