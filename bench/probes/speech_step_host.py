"""Where the host's time goes in a served speech run's talker steps: a wall-clock timer around
each host function a step passes through (inclusive, so nested timers overlap), per step, as
served (CUDA graphs on, nothing waited for that the loop does not wait for itself).

The device timeline (bench/profile_run.py --timeline) shows where no kernel ran; this shows
which host call the loop sat in meanwhile: the draw's and frame's preparation, the copies up
(a copy from pageable memory may wait for its stream), the graph launches, the waits for codes.

    python bench/probes/speech_step_host.py ENGINE_DIR --concurrency 1 32 --frames 50 \
        [--code2wav-streaming windows] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

TEXT = "The quick brown fox jumps over the lazy dog near the riverbank, and then it runs home."

# (module, owner, attribute): what is timed; an owner of None is a module-level function
TIMED = (
    ("edgeomni.runtime.decoder_stage", "DecoderStage", "step"),
    ("edgeomni.runtime.speech.talker", "SpeechTalker", "inputs"),
    ("edgeomni.runtime.speech.talker", "SpeechTalker", "draw"),
    ("edgeomni.runtime.speech.talker", "SpeechTalker", "confirm"),
    ("edgeomni.runtime.speech.talker", "_Drawing", "tokens"),
    ("edgeomni.runtime.speech.talker", None, "draw_marks"),
    ("edgeomni.runtime.decoder", "DecoderSession", "run"),
    ("edgeomni.runtime.fused_engine", "FusedBinding", "run"),
    ("edgeomni.runtime.fused_engine", "FusedEngine", "draw_first"),
    ("edgeomni.runtime.fused_engine", "SequenceGraph", "launch"),
    ("edgeomni.runtime.speech.code_predictor", "CodePredictor", "queue_frame"),
    ("edgeomni.runtime.speech.code_predictor", "CodePredictor", "_graphed_frame"),
    ("edgeomni.runtime.speech.code_predictor", "CodePredictor", "_uniforms"),
    ("edgeomni.runtime.speech.code_predictor", "CodePredictor", "_staged"),
    ("edgeomni.runtime.speech.code_predictor", "QueuedFrame", "codes"),
    ("edgeomni.runtime.memory", "DeviceArray", "upload"),
    ("edgeomni.runtime.memory", "DeviceArray", "copy_from"),
    ("edgeomni.runtime.memory", "HostRead", "queue"),
    ("edgeomni.runtime.memory", "HostRead", "wait"),
)

SPENT: dict[str, list[float]] = collections.defaultdict(list)


def timed(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[name].append(time.perf_counter() - start)

    return wrapper


def install() -> None:
    import importlib

    for module_name, owner, attr in TIMED:
        module = importlib.import_module(module_name)
        holder = module if owner is None else getattr(module, owner)
        name = attr if owner is None else f"{owner}.{attr}"
        setattr(holder, attr, timed(name, getattr(holder, attr)))
    from edgeomni.runtime import memory

    try:
        cudart = memory._cudart()
    except memory.DeviceError:  # a CPU run: no CUDA calls to time
        return
    for attr in ("cudaGraphLaunch", "cudaMemcpyAsync", "cudaEventSynchronize"):
        try:
            setattr(cudart, attr, timed(attr, getattr(cudart, attr)))
        except (AttributeError, TypeError) as e:  # an extension module may refuse
            print(f"[probe] {attr} not timed: {e}", file=sys.stderr)


def body(c: int, frames: int) -> dict[str, Any]:
    request = {"messages": [{"role": "assistant", "content": TEXT}], "speaker": "vivian",
               "language": "english", "sampling": {"talker_non_streaming_mode": 1}}  # fmt: skip
    return {"requests": [dict(request) for _ in range(c)], "talker_max_new_tokens": frames + 1,
            "talker_do_sample": 0, "subtalker_dosample": 0}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("engine", type=Path)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    p.add_argument("--frames", type=int, default=50)
    p.add_argument("--code2wav-streaming", choices=("stateful", "windows"))
    p.add_argument("--out", type=Path)
    args = p.parse_args()

    from edgeomni.runtime.engine import Engines
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    pipe = Pipeline(args.engine, engines=Engines(cuda_graphs=True),
                    code2wav_streaming=args.code2wav_streaming)  # fmt: skip
    install()
    report = {}
    for c in args.concurrency:
        requests, _ = parse_request_file(body(c, args.frames))
        pipe.run(requests, batch_size=c)  # warm-up: engines loaded, graphs captured
        SPENT.clear()
        start = time.perf_counter()
        outcomes = pipe.run(requests, batch_size=c)
        wall = time.perf_counter() - start
        steps = len(SPENT["DecoderStage.step"])
        rows = {name: {"calls_a_step": round(len(v) / max(steps, 1), 2),
                       "ms_a_step": round(sum(v) / max(steps, 1) * 1e3, 4),
                       "us_mean": round(sum(v) / len(v) * 1e6, 2),
                       "us_max": round(max(v) * 1e6, 1)}
                for name, v in sorted(SPENT.items(), key=lambda kv: -sum(kv[1]))}  # fmt: skip
        talker = outcomes[0].entry["stages"].get("talker", {})
        report[c] = {"wall_ms": round(wall * 1e3, 3), "steps": steps,
                     "wall_ms_a_step": round(wall / max(steps, 1) * 1e3, 4),
                     "talker": talker, "host": rows}  # fmt: skip
        print(f"c={c}: {wall * 1e3:.1f} ms wall, {steps} talker steps "
              f"({wall / max(steps, 1) * 1e3:.3f} ms a step); frames summed on the device "
              f"{talker.get('frames_summed_on_device')}, first codes drawn there "
              f"{talker.get('first_codes_drawn_on_device')}")
        print(f"  {'ms a step':>10} {'calls':>6} {'us mean':>9} {'us max':>9}  host call")
        for name, r in rows.items():
            print(f"  {r['ms_a_step']:10.4f} {r['calls_a_step']:6.2f} {r['us_mean']:9.2f} "
                  f"{r['us_max']:9.1f}  {name}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "speech_step_host.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
