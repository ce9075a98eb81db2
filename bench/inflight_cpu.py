"""In-flight batching against fixed cohorts, side by side on this CPU, on a request file of
mixed prompt and output lengths (16 to 256 tokens out).

Builds random-weight checkpoints (no download): a small Qwen3 (hidden 512, 8 layers, Qwen3's
151936-token vocabulary) and bench/omni_cpu.py's small Qwen3-Omni (``omni``: its thinker
answers in text; ``omni-speech``: the reply is also spoken, SPEECH_FRAMES frames each, through
the talker, code predictor and code2wav), then runs the same 32 requests through edge-infer's pipeline with ``--batching
inflight`` and ``--batching cohort`` in one process, and prints requests/s, tokens/s and
p50/p95 latency (every request arrives at t = 0; its latency is when its Finished event came)
and the ratios (of the medians). Every request generates exactly its length (min_generate_length = max), so
both modes do the same work; greedy tokens are compared between the modes.

``--baseline DIR``: also run both modes of another checkout of edgeomni (for example the commit
before a change, ``git worktree add DIR <commit>``; it must have ``--batching`` and events) on
the same engines, in subprocesses that import edgeomni from DIR, and print each mode's
throughput over the baseline's: the check that a change costs no speed.

    python bench/inflight_cpu.py [--work DIR] [--requests 32] [--batch-size 8]
        [--models qwen3,omni,omni-speech] [--baseline DIR] [--repeats 3]

Each mode runs in a fresh process, the modes in turn, ``--repeats`` times; the run of median
wall time is reported with every run's tokens/s (this 2-core machine's run-to-run spread is
wide).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SMALL_QWEN3 = dict(
    vocab_size=151936, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=4, head_dim=64, max_position_embeddings=4096,
    tie_word_embeddings=True, initializer_range=0.02,
)  # fmt: skip
WORDS = "edge devices run small fast models with predictable memory and honest errors " * 30


SPEECH_FRAMES = 24  # codec frames per request in the speech runs (1.9 s of audio)


def request_file(n: int, seed: int = 0, speech: bool = False) -> dict:
    """n requests: prompts of 4 to 20 words (about 30 to 110 tokens of the tiny tokenizer),
    outputs of 16 to 256 tokens, each exact; ``speech``: each reply also spoken, greedy, in
    exactly SPEECH_FRAMES frames."""
    rng = np.random.default_rng(seed)
    words = WORDS.split()
    out = rng.integers(16, 257, n)
    out[:2] = (16, 256)  # both ends of the range
    lengths = rng.integers(4, 21, n)
    body = {
        "top_k": 1,
        "requests": [
            {"messages": [{"role": "user", "content": " ".join(words[: int(w)])}],
             "max_generate_length": int(k), "min_generate_length": int(k)}
            for w, k in zip(lengths, out, strict=True)
        ],
    }  # fmt: skip
    if speech:  # the last code drawn gets no frame
        body.update(talker_top_k=1, talker_max_new_tokens=SPEECH_FRAMES + 1,
                    talker_min_new_tokens=SPEECH_FRAMES + 1)  # fmt: skip
    return body


def build(model: str, work: Path, batch: int) -> Path:
    from edgeomni.builder.build import build as edge_build
    from edgeomni.export.family import BuildArgs

    model = "omni" if model == "omni-speech" else model  # the same engines, spoken
    ckpt, engine = work / model, work / f"{model}-engine-b{batch}"
    if not (ckpt / "config.json").is_file():
        if model == "qwen3":
            from edgeomni.export.tiny import make_qwen3

            make_qwen3(ckpt, **SMALL_QWEN3)
        else:
            sys.path.insert(0, str(Path(__file__).parent))
            from omni_cpu import SIZES

            from edgeomni.export.tiny_omni import make_qwen3_omni

            make_qwen3_omni(ckpt, sizes=SIZES["small"])
    if not (engine / "multistage_config.json").is_file():
        edge_build(ckpt, engine, BuildArgs(batch, 128, 384))
    return engine


def measure(engine: Path, body: dict, batch: int, batching: str) -> dict:
    """One run of the request file: throughput, latency and each request's tokens."""
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    pipe = Pipeline(engine, batching=batching)
    requests, _ = parse_request_file(body)
    warm, _ = parse_request_file({**body, "requests": body["requests"][:1]})
    # the text model's reply only, as edge-infer without audio out; speech: every terminal
    text = None if "talker_max_new_tokens" in body else pipe.text_terminals()
    pipe.run(warm, batch_size=1, requested=text)  # load the engines
    finished: dict[int, float] = {}
    start = time.perf_counter()

    def listen(event: object) -> None:
        if type(event).__name__ == "Finished":  # runtime.events.Finished
            finished[event.index] = time.perf_counter() - start  # type: ignore[attr-defined]

    outcomes = pipe.run(requests, batch_size=batch, requested=text, listener=listen)
    wall = time.perf_counter() - start
    failed = [(o.entry["request_idx"], o.entry["error"]) for o in outcomes if not o.entry["ok"]]
    if failed:
        raise SystemExit(f"{batching}: requests failed: {failed}")
    stage = next(iter(outcomes[0].entry["stages"]))
    tokens = [o.entry["stages"][stage]["output_tokens"] for o in outcomes]
    latency = [finished.get(i, wall) for i in range(len(outcomes))]
    total = sum(len(t) for t in tokens)
    audio_s = sum(len(o.audio) / o.sample_rate for o in outcomes if o.audio is not None)
    if text is None:  # the codes join the tokens compared between the modes
        tokens = [t + o.codes.reshape(-1).tolist() for t, o in zip(tokens, outcomes, strict=True)]
    return {
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(outcomes) / wall, 3),
        "tokens_per_s": round(total / wall, 1),
        **({"audio_s_per_s": round(audio_s / wall, 3)} if audio_s else {}),
        "latency_p50_s": round(float(np.percentile(latency, 50)), 3),
        "latency_p95_s": round(float(np.percentile(latency, 95)), 3),
        "tokens": tokens,
    }


def isolated(engine: Path, body: dict, batch: int, mode: str, repo: Path | None = None) -> dict:
    """``measure`` in a fresh process (each mode starts from the same state), importing
    edgeomni from ``repo`` when given (another checkout, the baseline)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = [str(Path(__file__).parent)]
        if repo is not None:
            os.symlink(repo.resolve(), Path(tmp) / "edgeomni")
            paths.insert(0, tmp)
        (Path(tmp) / "body.json").write_text(json.dumps(body))
        code = (
            f"import sys, json, pathlib; sys.path[:0] = {paths!r}\n"
            "import edgeomni.runtime.pipeline as p\n"
            f"assert {repo is None!r} or p.__file__.startswith({tmp!r}), p.__file__\n"
            "from inflight_cpu import measure\n"
            f"body = json.loads(pathlib.Path({str(Path(tmp) / 'body.json')!r}).read_text())\n"
            f"r = measure(pathlib.Path({str(engine)!r}), body, {batch}, {mode!r})\n"
            "print(json.dumps(r))\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=False)  # fmt: skip
        if out.returncode:
            raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])


def median_run(tries: list[dict]) -> dict:
    """The run of median wall time, with every run's tokens/s beside it (the spread)."""
    ordered = sorted(tries, key=lambda t: t["wall_s"])
    mid = dict(ordered[len(ordered) // 2])
    mid["tokens_per_s_runs"] = [t["tokens_per_s"] for t in tries]
    return mid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edgeomni-bench")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--models", default="qwen3,omni")
    ap.add_argument("--baseline", type=Path, help="another checkout: its two modes too")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each mode (the median)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    report: dict = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "requests": args.requests,
        "batch_size": args.batch_size,
        "output_tokens": sum(
            r["max_generate_length"] for r in request_file(args.requests)["requests"]
        ),
        "speech_frames": SPEECH_FRAMES,
        "models": {},
    }
    for model in args.models.split(","):
        body = request_file(args.requests, speech=model == "omni-speech")
        engine = build(model, args.work, args.batch_size)
        modes = [("inflight", None), ("cohort", None)]
        if args.baseline is not None:
            modes += [("inflight", args.baseline), ("cohort", args.baseline)]
        tries: dict[str, list[dict]] = {}
        for _ in range(args.repeats):  # the modes in turn, so drifts of the machine hit all
            for mode, repo in modes:
                name = mode if repo is None else f"baseline_{mode}"
                tries.setdefault(name, []).append(
                    isolated(engine, body, args.batch_size, mode, repo)
                )
        runs = {name: median_run(t) for name, t in tries.items()}
        same = all(t["tokens"] == runs["cohort"]["tokens"] for ts in tries.values() for t in ts)
        row = {mode: {k: v for k, v in r.items() if k != "tokens"} for mode, r in runs.items()}
        row["same_tokens"] = same
        inflight, cohort = runs["inflight"], runs["cohort"]
        row["inflight_over_cohort"] = {
            "throughput": round(inflight["tokens_per_s"] / cohort["tokens_per_s"], 2),
            "latency_p50": round(inflight["latency_p50_s"] / cohort["latency_p50_s"], 2),
            "latency_p95": round(inflight["latency_p95_s"] / cohort["latency_p95_s"], 2),
        }
        for mode in ("inflight", "cohort"):  # this checkout over the baseline, mode by mode
            if f"baseline_{mode}" in runs:
                row[f"{mode}_over_baseline"] = round(
                    runs[mode]["tokens_per_s"] / runs[f"baseline_{mode}"]["tokens_per_s"], 2
                )
        report["models"][model] = row
        print(json.dumps({model: row}, indent=2), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
