"""Probe: the stateful code2wav step engine as the pipeline runs it, one layer of the runtime at a
time, each call synchronised and reported before the next. On the H200 the Qwen3-TTS pipeline's
first stateful call failed (cuDNN found no engine for a Conv, then an illegal address) while the
step engine alone, fed host arrays, ran every chunk size tried (docs/history/, issue 34's
fifth slice); this finds the layer where the two part. Run it with CUDA_LAUNCH_BLOCKING=1 on
the GPU machine, on an engine dir built with the step engine:

    python3 bench/gpu_tts.py --size 0.6b --only edgeomni --backend fused \\
        --code2wav-streaming stateful --stop-after build --work /tmp/tts
    CUDA_LAUNCH_BLOCKING=1 python3 bench/probes/stateful_step_gpu.py /tmp/tts/0.6b-s0/ENGINE

Stages: (1) the step engine's session fed host arrays (ONNX Runtime allocates the outputs);
(2) the runtime's StepEngine.run (states and outputs in device buffers, the shared stream),
chunks of 2, 4 and a padded 3-in-4; (3) the stage's own stream (the first chunk, doubling,
chunks padded to the fixed sizes where the engine prefers them) against the whole-utterance
decode of the same codes. A JSON line per check; the first failure ends the run. It runs on
the CPU too (an engine dir built for it), where every stage passes.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def report(stage: str, check: Callable[[], dict[str, Any]]) -> bool:
    """Run one check, synchronise the device, print a JSON line; False on a failure."""
    from edgeomni.runtime import memory

    try:
        out = check()
        if memory._STREAMS:  # a GPU run: an asynchronous fault surfaces here, not later
            memory.synchronize(0)
        print(json.dumps({"stage": stage, "ok": True, **out}), flush=True)
        return True
    except Exception as e:  # noqa: BLE001 (the probe reports every failure as it is)
        print(json.dumps({"stage": stage, "ok": False, "error": f"{type(e).__name__}: {e}",
                          "trace": traceback.format_exc()[-1500:]}), flush=True)  # fmt: skip
        return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("engine", type=Path, help="an edge-build engine dir with code2wav_stream/")
    p.add_argument("--frames", type=int, default=23, help="frames of the streamed utterance")
    p.add_argument("--first", type=int, default=2, help="the stream's first chunk (1 or 2)")
    args = p.parse_args()

    from edgeomni.graph_schema import load
    from edgeomni.runtime.engine import Engines
    from edgeomni.runtime.speech.code2wav import Code2Wav
    from edgeomni.runtime.stage import RequestState

    graph = load(args.engine / "multistage_config.json")
    stage = next(s for s in graph.stages if s.runner.endswith(".code2wav"))
    if stage.config.get("streaming") != "stateful":
        sys.exit(f"{args.engine}: its code2wav stage does not stream stateful")
    folder = args.engine / stage.artifact
    runner = Code2Wav(stage, folder, engines=Engines())
    step = runner.step
    rng = np.random.default_rng(0)
    quantizers, size = int(runner.num_quantizers), int(runner.codebook_size)
    codes = rng.integers(0, size, (args.frames, quantizers))

    def host_session() -> dict[str, Any]:
        session = step.engine.session
        feeds: dict[str, Any] = {}
        for i in session.get_inputs():
            shape = [d if isinstance(d, int) else 1 for d in i.shape]
            if i.name == "codes":
                shape = [1, quantizers, 2]
            dtype = np.int64 if "int64" in i.type else np.float32
            feeds[i.name] = np.zeros(shape, dtype)
        feeds["codes"][:] = codes[:2].T[None]
        feeds["chunk_lens"][:] = 2
        wave = session.run(None, feeds)[0]
        return {"shape": list(wave.shape), "peak": float(np.abs(wave).max())}

    def runtime_steps() -> dict[str, Any]:
        row, made = step.fresh(), []
        for n, width in ((2, 2), (4, 4), (3, 4)):  # the last padded, as fixed sizes run it
            chunk = np.zeros((1, quantizers, width), np.int64)
            at = sum(k for k, _ in made)
            chunk[0, :, :n] = codes[at : at + n].T
            samples = step.run(chunk, np.array([n]), [row])
            made.append((n, float(np.abs(samples[0, : n * step.samples_per_frame]).max())))
        return {"chunks": made}

    def stream_against_whole() -> dict[str, Any]:
        runner.chunks = type(runner.chunks)(args.first, runner.chunks.size, runner.chunks.most)
        batch = runner.stream_batch()
        stream = runner.stream_for(RequestState(0, None, None), batch)
        at = 0
        for burst in (1, 1, 3, 2, 7):
            stream(codes[at : at + burst])
            batch.decode_ready()
            at += burst
        stream(codes[at:])
        audio = stream.finish()
        whole = Code2Wav(stage, folder, engines=Engines(), whole_utterance=True,
                         streaming="windows").vocode(codes)[0]  # fmt: skip
        diff = float(np.abs(audio - whole).max()) if audio.shape == whole.shape else None
        return {"fixed_sizes": list(getattr(batch, "fixed", ())), "samples": len(audio),
                "whole_samples": len(whole), "max_diff": diff,
                "peak": float(np.abs(whole).max())}  # fmt: skip

    for name, check in (("host session", host_session), ("StepEngine.run", runtime_steps),
                        ("stage stream vs whole", stream_against_whole)):  # fmt: skip
        if not report(name, check):
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
