"""Where edge-serve's time goes when requests trickle in: ``Pipeline.serve`` in this process,
no HTTP, fed at Poisson arrival times from a thread, as edge-serve feeds it.

For each stage patience and rate, twice (the second pass on graphs the first captured): every request's time from
its arrival to its first audio and to its end, the engine calls that ran under a CUDA graph id
not seen before (a capture) and their seconds, and the wall. Then the same requests all at once
through ``Pipeline.run`` (the offline bound of bench/serve_load.py).

    python bench/probes/serve_trickle.py --engine ENG --voice ethan --rates 2 8 --requests 32 \\
        --tokens 32 --frames 50 --batch-size 32 [--patience 16 0] [--no-cuda-graphs]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serve_load import request_file  # noqa: E402

from edgeomni.runtime import engine as engine_mod  # noqa: E402
from edgeomni.runtime.events import AudioChunk  # noqa: E402
from edgeomni.runtime.pipeline import Pipeline, Submission  # noqa: E402
from edgeomni.runtime.scheduler import Arrivals  # noqa: E402

CAPTURES: dict[str, Any] = {"seen": set(), "count": 0, "seconds": 0.0}


def count_captures() -> None:
    """Wrap OrtBinding.run: a call under a graph id this binding has not run yet captures."""
    run = engine_mod.OrtBinding.run

    def timed(self: Any, feeds: Any, *, graph: int | None = None, wait: bool = True) -> None:
        key = (id(self), graph)
        if graph is None or key in CAPTURES["seen"]:
            return run(self, feeds, graph=graph, wait=wait)
        CAPTURES["seen"].add(key)
        start = time.perf_counter()
        run(self, feeds, graph=graph, wait=True)
        CAPTURES["count"] += 1
        CAPTURES["seconds"] += time.perf_counter() - start

    engine_mod.OrtBinding.run = timed


def requests(n: int, tokens: int, voice: str | None, frames: int, first: int = 0) -> list[Any]:
    return [dataclasses.replace(r, index=first + i)
            for i, r in enumerate(request_file(n, tokens, voice, frames))]  # fmt: skip


def trickle(pipe: Pipeline, reqs: list[Any], rate: float, batch: int, seed: int) -> dict:
    feed = Arrivals()
    arrived: dict[int, float] = {}
    first: dict[int, float] = {}
    end: dict[int, float] = {}

    def listener(event: Any) -> None:
        if isinstance(event, AudioChunk) and event.samples.size and event.index not in first:
            first[event.index] = time.perf_counter()

    def done(state: Any) -> None:
        end[state.index] = time.perf_counter()
        assert state.error is None, state.error

    def producer() -> None:
        rng = random.Random(seed)
        t = time.perf_counter()
        for r in reqs:
            time.sleep(max(0.0, t - time.perf_counter()))
            arrived[r.index] = time.perf_counter()
            feed.put(Submission(r.index, r, None))
            t += 0.0 if rate == float("inf") else rng.expovariate(rate)
        feed.close()

    before = dict(count=CAPTURES["count"], seconds=CAPTURES["seconds"])
    start = time.perf_counter()
    thread = threading.Thread(target=producer)
    thread.start()
    pipe.serve(feed, batch_size=batch, listener=listener, done=done, cancelled=lambda s: False)
    thread.join()
    wall = time.perf_counter() - start
    e2e = sorted(end[i] - arrived[i] for i in arrived)
    ttfa = sorted(first[i] - arrived[i] for i in first)
    return {
        "rate": rate, "wall_s": round(wall, 3), "requests": len(e2e),
        "e2e_p50_ms": round(e2e[len(e2e) // 2] * 1e3, 1), "e2e_max_ms": round(e2e[-1] * 1e3, 1),
        "ttfa_p50_ms": round(ttfa[len(ttfa) // 2] * 1e3, 1) if ttfa else None,
        "captures": CAPTURES["count"] - before["count"],
        "capture_s": round(CAPTURES["seconds"] - before["seconds"], 3),
    }  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", type=Path, required=True)
    p.add_argument("--voice")
    p.add_argument("--rates", type=float, nargs="+", default=[2.0, 8.0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--frames", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--no-cuda-graphs", action="store_true")
    p.add_argument("--patience", type=int, nargs="+", default=[16],
                   help="run everything once per stage patience")  # fmt: skip
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    count_captures()
    pipe = Pipeline(a.engine, engines=engine_mod.Engines(cuda_graphs=not a.no_cuda_graphs))
    text = None if a.voice is not None else pipe.text_terminals()
    base = 0
    rows = []

    def batch(n: int) -> list[Any]:
        nonlocal base
        reqs = requests(n, a.tokens, a.voice, a.frames, base)
        base += n
        return reqs

    warm = trickle(pipe, batch(a.batch_size), float("inf"), a.batch_size, 0)
    print("warm-up (a full batch at once):", json.dumps(warm), flush=True)
    offline = {}
    for patience in a.patience:
        pipe.patience = patience
        for rate in a.rates:
            for attempt in (1, 2):
                row = trickle(pipe, batch(a.requests), rate, a.batch_size, attempt)
                row.update(attempt=attempt, patience=patience)
                rows.append(row)
                print(json.dumps(row), flush=True)
        start = time.perf_counter()
        outcomes = pipe.run(requests(a.requests, a.tokens, a.voice, a.frames),
                            batch_size=a.batch_size, requested=text)  # fmt: skip
        wall = time.perf_counter() - start
        assert all(o.entry["ok"] for o in outcomes)
        offline[patience] = {"wall_s": round(wall, 3), "captures_total": CAPTURES["count"]}
        print(f"offline Pipeline.run, all at once, patience {patience}:",
              json.dumps(offline[patience]), flush=True)  # fmt: skip
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "serve_trickle.json").write_text(json.dumps(
            {"settings": vars(a) | {"engine": str(a.engine), "out": str(a.out)},
             "warm": warm, "rows": rows, "offline": offline}, indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
