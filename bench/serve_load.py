"""edge-serve under open-loop load, against the offline request-file run of the same requests.

edge-serve runs in a process of its own (``python -m edgeomni.runtime.serve.cli``); this
process sends streamed chat completions at Poisson arrival times, at each rate given, without
waiting for earlier ones (open loop), and times each request's first text delta and its end.
Then the same requests run through ``Pipeline.run`` (edge-infer's path) in this process once
the server has stopped, its engines loaded and warm, at the server's batch size: the offline
bound. Both are greedy with a fixed reply length, so both do the same
work.

    python bench/serve_load.py --engine ENG --rates 2 8 32 --requests 32 --out OUT
    python bench/serve_load.py --tiny --rates 4 16 --requests 24 --out /tmp/serve_load

``--tiny`` builds the tiny random Qwen3 (export/tiny.py) into a temp dir first, ``--tiny-omni``
the tiny Qwen3-Omni; ``--voice V`` asks for the reply spoken too (time to first audio and
audio-s/s; ``--frames`` codec frames a request, default 24). On a GPU, point ``--engine`` at a
cuda build (for example bench/gpu_omni.py's, made with ``--stop-after build``);
``--warm-cohorts`` sends 1, 2, .. batch-size requests at once before the timed runs (edge-serve
``--warmup``, auto on a GPU build, now does the same itself). Writes
OUT/serve_load.json (every request's times, the settings, the machine) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPTS = ["Hello! How are you today?", "Tell me a story about a fox.", "What is 2 + 2?",
           "Name three colours.", "Write a haiku about rain.", "Count from one to ten."]  # fmt: skip


def speech(frames: int) -> dict[str, int]:
    """The talker's settings for exactly ``frames`` codec frames a reply, greedy."""
    return {"talker_max_new_tokens": frames, "talker_min_new_tokens": frames, "talker_top_k": 1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    """Until the edge-serve at ``url`` answers /health with 200 (SystemExit naming ``log`` if
    its process ends or ``timeout`` seconds pass first)."""
    import httpx

    deadline = time.time() + timeout
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.time() > deadline:
            raise SystemExit(f"edge-serve did not start; see {log}")
        time.sleep(0.2)


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, round(q * (len(xs) - 1))))
    return xs[k]


async def one(
    client: Any, url: str, prompt: str, tokens: int, at: float, voice: str | None, frames: int
) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, at - time.perf_counter()))
    start = time.perf_counter()
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens, "min_tokens": tokens, "temperature": 0, "stream": True,
    }  # fmt: skip
    if voice is not None:  # the reply spoken too, a fixed number of frames
        body.update(modalities=["text", "audio"], audio={"voice": voice, "format": "pcm16"},
                    **speech(frames))  # fmt: skip
    first = first_audio = None
    audio_bytes = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return {"status": r.status_code, "start": start, "end": time.perf_counter()}
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            delta = json.loads(line[5:])["choices"][0]["delta"]
            if first is None and delta.get("content"):
                first = time.perf_counter()
            if delta.get("audio"):
                first_audio = first_audio or time.perf_counter()
                audio_bytes += len(base64.b64decode(delta["audio"]["data"]))
    end = time.perf_counter()
    return {"status": 200, "start": start, "first": first, "first_audio": first_audio,
            "end": end, "lateness": start - at, "audio_s": audio_bytes / 2 / 24000}  # fmt: skip


async def load(
    url: str, rate: float, n: int, tokens: int, seed: int, voice: str | None, frames: int
) -> list[dict[str, Any]]:
    import httpx

    rng = random.Random(seed)
    t0 = time.perf_counter() + 0.2
    times, t = [], t0
    for _ in range(n):
        times.append(t)
        t += 0.0 if rate == float("inf") else rng.expovariate(rate)
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        jobs = [one(client, url, PROMPTS[i % len(PROMPTS)], tokens, at, voice, frames)
                for i, at in enumerate(times)]  # fmt: skip
        return await asyncio.gather(*jobs)


def summary(rows: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == 200]
    ttft = [(r["first"] - r["start"]) * 1e3 for r in ok if r.get("first")]
    e2e = [(r["end"] - r["start"]) * 1e3 for r in ok]
    span = max(r["end"] for r in ok) - min(r["start"] for r in ok) if ok else float("nan")
    ttfa = [(r["first_audio"] - r["start"]) * 1e3 for r in ok if r.get("first_audio")]
    audio = sum(r.get("audio_s", 0.0) for r in ok)
    spoken = {"ttfa_p50_ms": round(percentile(ttfa, 0.5), 1),
              "ttfa_p99_ms": round(percentile(ttfa, 0.99), 1),
              "audio_s_per_s": round(audio / span, 2)} if ttfa else {}  # fmt: skip
    return {
        **spoken,
        "requests": len(rows), "ok": len(ok),
        "ttft_p50_ms": round(percentile(ttft, 0.5), 1), "ttft_p99_ms": round(percentile(ttft, 0.99), 1),
        "e2e_p50_ms": round(percentile(e2e, 0.5), 1), "e2e_p99_ms": round(percentile(e2e, 0.99), 1),
        "requests_per_s": round(len(ok) / span, 2), "tokens_per_s": round(len(ok) * tokens / span, 1),
        "max_lateness_ms": round(max((r.get("lateness", 0) for r in rows), default=0) * 1e3, 1),
    }  # fmt: skip


def request_file(count: int, tokens: int, voice: str | None, frames: int) -> list[Any]:
    """The load's requests as the request file gives them to ``Pipeline.run``: the same
    prompts, lengths and voice as the HTTP bodies."""
    from edgeomni.runtime.requests import parse_request_file

    reqs = [{"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]}
            for i in range(count)]  # fmt: skip
    body: dict[str, Any] = {"requests": reqs, "max_generate_length": tokens,
                            "min_generate_length": tokens, "temperature": 0.0}  # fmt: skip
    if voice is not None:
        body.update(voice=voice, **speech(frames))
    return parse_request_file(body)[0]


def offline(
    engine: Path, n: int, tokens: int, batch: int, threads: int | None, voice: str | None,
    frames: int, patience: int,
) -> dict[str, Any]:
    """The same requests through Pipeline.run (edge-infer's path, in-flight batching) in this
    process, after the engines are loaded and warm: the offline bound."""
    from edgeomni.runtime.engine import Engines
    from edgeomni.runtime.pipeline import Pipeline

    def requests(count: int) -> list[Any]:
        return request_file(count, tokens, voice, frames)

    pipe = Pipeline(engine, engines=Engines(threads=threads), patience=patience)
    text = None if voice is not None else pipe.text_terminals()
    pipe.run(requests(batch), batch_size=batch, requested=text)  # loads and warms the engines
    start = time.perf_counter()
    outcomes = pipe.run(requests(n), batch_size=batch, requested=text)
    wall = time.perf_counter() - start
    assert all(o.entry["ok"] for o in outcomes)
    out = {"wall_s": round(wall, 3), "requests_per_s": round(n / wall, 2),
           "tokens_per_s": round(n * tokens / wall, 1)}  # fmt: skip
    if voice is not None:
        audio = sum(o.audio.size / o.sample_rate for o in outcomes if o.audio is not None)
        out["audio_s_per_s"] = round(audio / wall, 2)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--engine", type=Path)
    src.add_argument("--tiny", action="store_true", help="build the tiny random Qwen3 first")
    src.add_argument("--tiny-omni", action="store_true",
                     help="build the tiny random Qwen3-Omni first (with --voice: speech)")  # fmt: skip
    p.add_argument("--voice", help="ask for the reply spoken too (an omni graph's voice): time "
                   "to first audio and audio-s/s")  # fmt: skip
    p.add_argument("--frames", type=int, default=24, help="with --voice: codec frames a "
                   "reply (exact; 12.5 a second of audio)")  # fmt: skip
    p.add_argument("--rates", type=float, nargs="+", default=[2.0, 8.0, 32.0],
                   help="arrivals per second (inf: all at once, the server's saturated "
                   "throughput)")  # fmt: skip
    p.add_argument("--requests", type=int, default=32, help="per rate")
    p.add_argument("--tokens", type=int, default=24, help="reply tokens a request (exact)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, help="the server's CPU threads per engine")
    p.add_argument("--stage-patience", type=int, default=16,
                   help="the server's (and the offline run's) --stage-patience")  # fmt: skip
    p.add_argument("--warm-cohorts", action="store_true",
                   help="warm the server up with every batch size from 1 up, each all at once "
                   "(a GPU build then has its CUDA graphs captured before the timed runs)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="serve-load-"))
    engine = a.engine
    if a.tiny or a.tiny_omni:
        from edgeomni.builder.build import build
        from edgeomni.export.family import BuildArgs
        from edgeomni.export.tiny import make_qwen3
        from edgeomni.export.tiny_omni import make_qwen3_omni

        engine = work / "eng"
        ckpt = (make_qwen3 if a.tiny else make_qwen3_omni)(work / "ckpt")
        build(ckpt, engine, BuildArgs(max_batch_size=a.batch_size, max_input_len=64,
                                      max_kv_cache_capacity=256))  # fmt: skip
    port = free_port()
    cmd = [sys.executable, "-m", "edgeomni.runtime.serve.cli", "--config", str(engine),
           "--port", str(port), "--batch-size", str(a.batch_size),
           "--max-queue", str(max(a.requests, 1)), "--max-tokens", str(a.tokens),
           "--stage-patience", str(a.stage_patience)]  # fmt: skip
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    log = (a.out / "server.log").open("w")
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server, a.out / "server.log")
        # warm-up: a full batch at once (a GPU build captures its graphs), then a trickle;
        # --warm-cohorts: every batch size from 1 up, each all at once
        for k in range(1, a.batch_size + 1) if a.warm_cohorts else [a.batch_size]:
            asyncio.run(load(url, float("inf"), k, a.tokens, a.seed, a.voice, a.frames))
        asyncio.run(load(url, 4.0, 4, a.tokens, a.seed, a.voice, a.frames))
        runs = {}
        for rate in a.rates:
            rows = asyncio.run(load(url, rate, a.requests, a.tokens, a.seed, a.voice, a.frames))
            runs[str(rate)] = {"summary": summary(rows, a.tokens), "requests": rows}
            print(f"rate {rate}/s: {json.dumps(runs[str(rate)]['summary'])}", flush=True)
    finally:
        server.terminate()
        server.wait(60)
        log.close()
    base = offline(engine, a.requests, a.tokens, a.batch_size, a.threads, a.voice, a.frames,
                   a.stage_patience)
    print(f"offline (Pipeline.run, engines warm): {json.dumps(base)}")
    print(
        "\n| rate /s | ok | TTFT p50 / p99 ms | first audio p50 / p99 ms | e2e p50 / p99 ms | "
        "req/s | tok/s | audio-s/s | tok/s (audio-s/s) vs offline |\n|---|---|---|---|---|---|---|---|---|"
    )
    for rate, run in runs.items():
        s = run["summary"]
        speech = "audio_s_per_s" in s and "audio_s_per_s" in base
        ratio = (s["audio_s_per_s"] / base["audio_s_per_s"] if speech
                 else s["tokens_per_s"] / base["tokens_per_s"])  # fmt: skip
        print(
            f"| {rate} | {s['ok']}/{s['requests']} | {s['ttft_p50_ms']} / {s['ttft_p99_ms']} | "
            f"{s.get('ttfa_p50_ms', '-')} / {s.get('ttfa_p99_ms', '-')} | "
            f"{s['e2e_p50_ms']} / {s['e2e_p99_ms']} | {s['requests_per_s']} | "
            f"{s['tokens_per_s']} | {s.get('audio_s_per_s', '-')} | {ratio:.2f}x |"
        )
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.platform(),
              "cpus": os.cpu_count(), "engine": str(engine), "server_command": " ".join(cmd),
              "settings": vars(a) | {"engine": str(engine), "out": str(a.out)},
              "runs": runs, "offline": base}  # fmt: skip
    (a.out / "serve_load.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
