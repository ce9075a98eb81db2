"""edge-serve --ray against edge-serve's own loop, same requests, same process: the cost of the
stage edges that cross deployments, and the throughput, on a CPU or on one GPU that the
deployments share (``--num-gpus F``: each group's replica asks Ray for F of a GPU; with
``--cluster-gpus 2 --num-gpus 1`` the ``two`` split puts each group on a GPU of its own).

Each setup serves the same greedy requests (fixed reply and speech lengths) through edge-serve's
``Server`` interface (what its HTTP side calls; HTTP itself is the same in both and left out):

- ``process``: edge-serve's own scheduler loop, every stage in this process;
- ``one``: ``--ray`` with every stage in one deployment (the default placement);
- ``two``: the thinker in one deployment, the talker and code2wav in another;
- ``three``: thinker, talker and code2wav each in a deployment of their own.

The Ray setups run on a local cluster this script starts (``--ray-cpus``, default 2), each
deployment one replica of half a CPU (and ``--num-gpus``). At each concurrency c the c requests are
submitted together, ``--repeats`` times after ``--warmup`` untimed runs; per request: the first text,
the first audio and the end, from its submission. The edge cost is (first audio p50 of a
setup - the process's) / the edges its requests cross, at c = 1.

    python bench/ray_serve.py --tiny-omni --concurrency 1 8 32 --out OUT
    python bench/ray_serve.py --engine ENG [--setups process two] ...
    python bench/ray_serve.py --engine ENG --num-gpus 0.3 --ray-cpus 8 --batch-size 32 ...

Writes OUT/ray_serve.json (every request's times, settings, machine) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
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

PROMPTS = ["Hello! How are you today?", "Tell me a story about a fox.", "What is 2 + 2?",
           "Name three colours.", "Write a haiku about rain.", "Count from one to ten."]  # fmt: skip
SPLITS = {
    "one": None,
    "two": [["thinker"], ["talker", "code2wav"]],
    "three": [["thinker"], ["talker"], ["code2wav"]],
}
EDGES = {"process": 0, "one": 0, "two": 1, "three": 2}


def body(n: int, tokens: int, frames: int) -> dict[str, Any]:
    return {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": frames,
            "talker_min_new_tokens": frames, "min_generate_length": tokens,
            "requests": [{"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                          "max_generate_length": tokens} for i in range(n)]}  # fmt: skip


async def batch(server: Any, requests: list) -> tuple[float, list[dict[str, float]]]:
    """The requests submitted together: the wall time, and each one's times (seconds)."""
    from edgeomni.runtime.events import AudioChunk, Failed, TextDelta
    from edgeomni.runtime.serve.server import DONE

    loop = asyncio.get_running_loop()
    start = time.perf_counter()

    async def one(request: Any) -> dict[str, float]:
        request = dataclasses.replace(request, index=server.next_index())
        t0 = time.perf_counter()
        pending = server.submit(request, loop, server.texts | server.audio)
        times: dict[str, float] = {}
        audio = 0
        while (event := await pending.events.get()) is not DONE:
            now = time.perf_counter() - t0
            if isinstance(event, TextDelta) and (event.text or event.token_ids):  # a token
                times.setdefault("first_text", now)
            elif isinstance(event, AudioChunk) and event.samples.size:
                times.setdefault("first_audio", now)
                audio += event.samples.size
                rate = event.sample_rate
            elif isinstance(event, Failed):
                raise RuntimeError(f"request {request.index} failed: {event.error}")
        times["end"] = time.perf_counter() - t0
        times["audio_s"] = audio / rate if audio else 0.0
        return times

    got = await asyncio.gather(*(one(r) for r in requests))
    return time.perf_counter() - start, list(got)


def serve_setup(name: str, engine: Path, batch_size: int, ray_cpus: int, gpus: float,
                cluster_gpus: int) -> Any:  # fmt: skip
    from edgeomni.runtime.engine import Engines
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.serve import placement as pl
    from edgeomni.runtime.serve.server import Server

    pipe = Pipeline(engine, engines=Engines(threads=1))
    if name == "process":
        server = Server(pipe, batch_size=batch_size, max_queue=64)
        pipe.open(set(pipe.graph.stage_ids))
        server.start()
        return server
    from edgeomni.runtime.serve.ray_app import RayServer

    split = SPLITS[name] or [list(pl.single(pipe.graph).groups[0].stages)]
    groups = [{"name": f"g{i}", "stages": s, "num_cpus": 0.5, "num_gpus": gpus}
              for i, s in enumerate(split)]  # fmt: skip
    if gpus:  # Ray is told of the GPUs rather than trusted to find them
        import ray

        if not ray.is_initialized():
            ray.init(num_cpus=ray_cpus, num_gpus=cluster_gpus, namespace="edgeomni",
                     log_to_driver=False)  # fmt: skip
    where = pl.parse({"groups": groups}, pipe.graph)
    server = RayServer(pipe, where, batch_size=batch_size, max_queue=64, num_cpus=ray_cpus,
                       engines={"threads": 1}, app=f"bench-{name}")  # fmt: skip
    server.start()
    return server


def gpu_name() -> str | None:
    """The GPU's name and driver (nvidia-smi), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip() or None


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--engine", type=Path, help="an engine dir with thinker, talker, code2wav")
    p.add_argument("--tiny-omni", action="store_true", help="build the tiny Qwen3-Omni first")
    p.add_argument("--setups", nargs="+", default=["process", "one", "two", "three"],
                   choices=["process", *SPLITS])  # fmt: skip
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first, per concurrency")
    p.add_argument("--tokens", type=int, default=12, help="text tokens a reply")
    p.add_argument("--frames", type=int, default=16, help="codec frames a reply")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--ray-cpus", type=int, default=2)
    p.add_argument("--cluster-gpus", type=int, default=1,
                   help="the GPUs the local Ray cluster is given (with --num-gpus)")
    p.add_argument("--num-gpus", type=float, default=0.0,
                   help="each group's replica's share of a GPU (the engines built for cuda); "
                   "a setup's groups together at most --cluster-gpus")  # fmt: skip
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if (a.engine is None) == (not a.tiny_omni):
        p.error("give --engine ENG or --tiny-omni")
    engine = a.engine
    if a.tiny_omni:
        from edgeomni.builder.build import build
        from edgeomni.export.family import BuildArgs
        from edgeomni.export.tiny_omni import make_qwen3_omni

        work = Path(tempfile.mkdtemp(prefix="ray-bench-"))
        engine = work / "eng"
        build(make_qwen3_omni(work / "ckpt"), engine,
              BuildArgs(max_batch_size=a.batch_size, max_input_len=64,
                        max_kv_cache_capacity=128))  # fmt: skip
    from edgeomni.runtime.requests import parse_request_file

    rows, raw = [], []
    for setup in a.setups:
        started = time.perf_counter()
        server = serve_setup(setup, engine, a.batch_size, a.ray_cpus, a.num_gpus, a.cluster_gpus)
        ready_s = time.perf_counter() - started
        try:
            for c in a.concurrency:
                requests, _ = parse_request_file(body(c, a.tokens, a.frames))
                for _ in range(a.warmup):
                    asyncio.run(batch(server, requests))
                walls, times = [], []
                for _ in range(a.repeats):
                    wall, got = asyncio.run(batch(server, requests))
                    walls.append(wall)
                    times += got
                audio = sum(t["audio_s"] for t in times)
                row = {"setup": setup, "edges": EDGES[setup], "c": c, "ready_s": round(ready_s, 1),
                       "first_text_ms": round(p50([t["first_text"] for t in times
                                                   if "first_text" in t]) * 1e3, 1),
                       "first_audio_ms": round(p50([t["first_audio"] for t in times]) * 1e3, 1),
                       "end_ms": round(p50([t["end"] for t in times]) * 1e3, 1),
                       "requests_per_s": round(len(times) / sum(walls), 2),
                       "audio_s_per_s": round(audio / sum(walls), 2)}  # fmt: skip
                rows.append(row)
                raw.append({**row, "walls": walls, "times": times})
                print(json.dumps(row), flush=True)
        finally:
            server.stop()
    base = {r["c"]: r for r in rows if r["setup"] == "process"}
    print(
        "\n| setup | edges | c | first text p50 | first audio p50 | end p50 | req/s | "
        "audio-s/s | vs process (audio-s/s) |\n|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        ref = base.get(r["c"])
        ratio = f"{r['audio_s_per_s'] / ref['audio_s_per_s']:.2f}" if ref else "-"
        print(
            f"| {r['setup']} | {r['edges']} | {r['c']} | {r['first_text_ms']} ms | "
            f"{r['first_audio_ms']} ms | {r['end_ms']} ms | {r['requests_per_s']} | "
            f"{r['audio_s_per_s']} | {ratio} |"
        )
    for r in rows:
        ref = base.get(r["c"])
        if r["c"] == 1 and r["edges"] and ref:
            print(
                f"{r['setup']}: {(r['first_audio_ms'] - ref['first_audio_ms']) / r['edges']:.1f} "
                "ms of first audio per edge crossed (c=1, against the process)"
            )
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "ray_serve.json").write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(sys.argv),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores", "gpu": gpu_name(),
            "settings": vars(a) | {"engine": str(engine), "out": str(a.out)}, "rows": raw},
            indent=1, default=str) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
