"""Context reuse (the prefix cache, issue 54) on this CPU: time to first token / first audio with
the cache off and on, side by side in one run, per model.

Random-weight checkpoints (no download), built with edge-build (ONNX Runtime, CPU), cached in
``--work``:

- Qwen3 at 0.6B dimensions (bench/llm_decode_cpu.py's) and Qwen3.5 at 0.8B text dimensions
  (bench/qwen35_cpu.py's), fp32 or ``--precision int4`` (int4_rtn, the lm_head too, as
  bench/int4_cpu.py's "int4 g32"): ``--requests`` requests at batch 1, one after another, that
  share a system prompt of about ``--prompt-tokens`` tokens (real-ish English sentences
  repeated until the engine's tokenizer gives that many; the exact counts are reported) and
  differ in a short user message, greedy, ``--new-tokens`` tokens each. Time to first token
  (TTFT): the stage's ``prefill_ms``, and the wall from ``Pipeline.run`` to its first TextDelta.
- Qwen3-TTS 0.6B Base, voice clone (export/tiny_tts.py's checkpoint: Qwen3-TTS-12Hz-0.6B's
  dimensions, no qwen-tts needed; bench/qwen3_tts_checkpoints.py's maker needs upstream's
  reference venv): requests with the same ``ref_audio`` (qwen3_tts_checkpoints.reference_clip,
  written to a wav) and ``ref_text``, different target texts, greedy, ``--frames`` frames each.
  Time to first audio (TTFA): the vocoder stage's ``first_audio_ms``, and the wall from
  ``Pipeline.run`` to its first AudioChunk with samples.

Each side is a fresh Pipeline (``context_cache_mb=0`` against ``--cache-mb``) in this process,
its stages opened and ``--warmup`` requests that share nothing with the measured ones (as long,
as a user message alone; another clip and transcript) run first, so the engines' first calls
are not timed. Per side: the first measured request (cold: the cache holds nothing of its
prompt), the mean of the later ones (warm) and each request's own (Qwen3.5's rows resume only
at a boundary where its DeltaNet state was kept, so its second request may reuse little: the
warm mean blurs that), the ratio off / on, the prompt tokens, cached and computed, the cache's
hit rate, used MB and entries (warm-up excluded from its counters), the process's RSS after
the side and its peak so far. The sides' order is ``--order`` in the first repeat and swapped
in each next one; medians over ``--repeats``. The outputs (tokens, codes) of every request must
be equal off and on: the bench exits 1, saying where, when they are not.

    python bench/context_cache_cpu.py [--models qwen3,qwen35,tts] [--requests 4]
        [--prompt-tokens 500] [--new-tokens 2] [--frames 12] [--repeats 2] [--order off,on]
        [--cache-mb 1024] [--precision fp32|int4] [--threads N] [--layers N] [--size full|tiny]
        [--work DIR] [--rebuild] [--json FILE]

``--layers`` shrinks every model's decoder (the TTS talker; Qwen3.5 keeps at least 4: one
attention layer of four) and ``--size tiny`` takes the parity tests' tiny dimensions, to check
the script in a minute.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import qwen3_tts_cpu as tb  # noqa: E402 - one definition each (builds, request body, machine)
from llm_decode_cpu import QWEN3_06B  # noqa: E402
from qwen3_tts_checkpoints import SR, reference_clip  # noqa: E402
from qwen35_cpu import QWEN35_08B  # noqa: E402

MODELS = ("qwen3", "qwen35", "tts")
MARK = "bench_made.json"  # written last into a checkpoint folder: it is whole
SENTENCES = (
    "You are a helpful assistant that runs on a small computer at the edge of a network.",
    "Answer the user's questions briefly, clearly and politely, in plain English.",
    "If you do not know the answer to a question, say so instead of guessing.",
    "Keep every reply short, because the device has little memory and a slow processor.",
    "Numbers should be written as digits, and units should always be given with them.",
    "When the user asks for a list, give at most five items, one on each line.",
    "Never share private information about the user or about the people they mention.",
    "The weather, the time and the news are not known to you, so do not invent them.",
    "Speech models turn text into audio, and audio into text, on the same small board.",
    "Be friendly, but do not apologize more than once in a conversation.",
)
QUESTIONS = (
    "What is the capital of France?",
    "Give me three tips for saving power.",
    "How many minutes are there in a day?",
    "Say hello to my friend Anna, please.",
    "Which is larger, a cat or a mouse?",
    "Can you count from one to five?",
)
TEXTS = (
    "Good morning, the train to the city leaves from platform two in ten minutes.",
    "Please remember to water the plants on the balcony before you go to bed tonight.",
    "The quick brown fox jumps over the lazy dog, and then it runs into the forest.",
    "Our small board speaks these words with the voice of the reference clip.",
    "Thank you for calling, all of our operators are busy helping other customers.",
    "It will be sunny tomorrow, with a light wind from the west in the afternoon.",
)
WARMUP_REF_TEXT = "This other clip is only here to warm the engines up before the timing."


# -- checkpoints and engines (made once, cached in --work) ----------------------------------
def make(spec: dict[str, Any]) -> None:
    """The ``_make`` worker (a process of its own, so this one never loads torch): the
    checkpoint of ``spec["model"]`` at ``spec["size"]`` with ``spec["layers"]`` (None: the
    size's own) into ``spec["dir"]``."""
    path, model, size, layers = Path(spec["dir"]), spec["model"], spec["size"], spec["layers"]
    if model == "qwen3":
        if size == "full":
            from llm_decode_cpu import make_checkpoint

            make_checkpoint(path, layers or QWEN3_06B["num_hidden_layers"])
        else:
            from edgeomni.export.tiny import make_qwen3

            make_qwen3(path, **({"num_hidden_layers": layers} if layers else {}))
    elif model == "qwen35":
        if size == "full":
            from qwen35_cpu import make_checkpoint as make_qwen35

            make_qwen35(path, layers or QWEN35_08B["num_hidden_layers"])
        else:
            from edgeomni.export.families.qwen3_5.tiny import make_qwen3_5

            make_qwen3_5(path, **({"num_hidden_layers": layers} if layers else {}))
    else:
        from edgeomni.export.tiny_tts import make_checkpoint

        overrides = {"talker_config": {"num_hidden_layers": layers}} if layers else None
        make_checkpoint(path, "base", "0.6b" if size == "full" else "tiny", overrides=overrides)
    (path / MARK).write_text(json.dumps(spec) + "\n")


def checkpoint(args: argparse.Namespace, model: str, layers: int | None) -> Path:
    path = args.work / f"{model}-{args.size}-L{layers or 'all'}"
    if (path / MARK).is_file():
        return path
    shutil.rmtree(path, ignore_errors=True)  # a make cut short
    print(f"making the {model} checkpoint in {path} ...", file=sys.stderr, flush=True)
    spec = {"model": model, "size": args.size, "layers": layers, "dir": str(path)}
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "_make", json.dumps(spec)],
                   check=True, env=tb.reference_env(args.build_threads))  # fmt: skip
    return path


def engine(args: argparse.Namespace, ckpt: Path, limits: dict[str, Any]) -> tuple[Path, dict]:
    """edge-build of ``ckpt`` with ``limits`` (BuildArgs' fields) in a fresh process, once:
    rebuilt when the limits differ or with --rebuild; noted when the export code changed."""
    on = "-cuda" if limits.get("device") == "cuda" else ""
    path = ckpt.parent / f"{ckpt.name}-{args.precision}{on}-in{limits['max_input_len']}-engine"
    stamp_path = path / "bench_stamp.json"
    stamp = json.loads(stamp_path.read_text()) if stamp_path.is_file() else None
    fingerprint = tb.source_fingerprint()
    if stamp is not None and stamp["limits"] == limits and not args.rebuild:
        note = {} if stamp["source"] == fingerprint else {
            "note": "built by other export code than this checkout's (--rebuild)"}  # fmt: skip
        return path, {**stamp, **note, "cached": True}
    shutil.rmtree(path, ignore_errors=True)
    print(f"edge-build {ckpt.name} -> {path} ...", file=sys.stderr, flush=True)
    spec = {"ckpt": str(ckpt), "engine": str(path), "limits": limits}
    built = tb.worker(sys.executable, "_build", spec, args.build_threads, timeout=7200)
    if "error" in built:
        raise SystemExit(f"edge-build of {ckpt} failed: {built['error']}")
    stamp = {"limits": limits, "source": fingerprint, "build_s": built["seconds"],
             "disk_gib": tb.dir_gib(path), "date": time.strftime("%Y-%m-%d %H:%M")}  # fmt: skip
    stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
    return path, {**stamp, "cached": False}


def quant(args: argparse.Namespace) -> dict[str, Any]:
    return (
        {"quantization": "int4_rtn", "group_size": args.group_size}
        if args.precision == "int4"
        else {}
    )


# -- requests ---------------------------------------------------------------------------------
def system_prompt(encode: Callable[[str], list[int]], tokens: int, sentences: Sequence[str]) -> str:
    """The sentences, in turn, until the tokenizer gives at least ``tokens`` tokens."""
    text, i = "", 0
    while len(encode(text)) < tokens:
        text += ("" if not text else " ") + sentences[i % len(sentences)]
        i += 1
    return text


def llm_requests(engine_dir: Path, args: argparse.Namespace) -> tuple[list, list, dict]:
    """The warm-up and the measured requests, and their token counts."""
    from edgeomni.runtime.requests import parse_request_file
    from edgeomni.runtime.tokenizer import TextTokenizer

    tok = TextTokenizer(engine_dir)
    system = system_prompt(tok.encode, args.prompt_tokens, SENTENCES)
    # the warm-up: as long, but a user message alone, so that not even the template's head
    # (<|im_start|>system) is a block the measured requests could find
    other = system_prompt(tok.encode, args.prompt_tokens, SENTENCES[::-1])

    def messages(sys_text: str, i: int) -> list[dict[str, str]]:
        q = QUESTIONS[i % len(QUESTIONS)] + (
            f" ({i // len(QUESTIONS)})" if i >= len(QUESTIONS) else ""
        )
        return [{"role": "system", "content": sys_text}, {"role": "user", "content": q}]

    measured = [messages(system, i) for i in range(args.requests)]
    warm = [[{"role": "user", "content": f"{other} ({i})"}] for i in range(args.warmup)]
    body = {"temperature": 0, "max_generate_length": args.new_tokens,
            "requests": [{"messages": m} for m in warm + measured]}  # fmt: skip
    requests, _ = parse_request_file(body)
    ids = [tok.encode(tok.apply_chat_template(m, add_generation_prompt=True)) for m in measured]
    info = {"system_prompt_tokens": len(tok.encode(system)),
            "prompt_tokens": [len(x) for x in ids], "shared_prefix_tokens": common_prefix(ids),
            "system_prompt_chars": len(system)}  # fmt: skip
    return requests[: args.warmup], requests[args.warmup :], info


def common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    n = min(len(s) for s in seqs)
    for i in range(n):
        if len({s[i] for s in seqs}) > 1:
            return i
    return n


def tts_requests(args: argparse.Namespace) -> tuple[list, list, dict]:
    """The same clip and transcript with other texts; the warm-up: another clip and text."""
    import soundfile as sf

    from edgeomni.runtime.requests import parse_request_file

    ref, other = args.work / "ref.wav", args.work / "warmup_ref.wav"
    clip = reference_clip(args.ref_seconds)
    sf.write(ref, clip, SR, subtype="FLOAT")
    sf.write(other, clip[::-1] * 0.7, SR, subtype="FLOAT")
    body = tb.edgeomni_body(argparse.Namespace(frames=args.frames, sampled=False), ref)
    base = body.pop("requests")[0]

    def say(text: str, **extra: Any) -> dict[str, Any]:
        return {**base, "messages": [{"role": "assistant", "content": text}], **extra}

    n = len(TEXTS)
    measured = [
        say(TEXTS[i % n] + (f" Take {i // n}." if i >= n else "")) for i in range(args.requests)
    ]
    warm = [say(f"Warming up, take {i}.", ref_audio=str(other), ref_text=WARMUP_REF_TEXT)
            for i in range(args.warmup)]  # fmt: skip
    requests, _ = parse_request_file({**body, "requests": warm + measured})
    info = {"ref_seconds": round(len(clip) / SR, 3), "ref_text": tb.REF_TEXT,
            "frames": args.frames, "texts": [r["messages"][0]["content"] for r in measured]}  # fmt: skip
    return requests[: args.warmup], requests[args.warmup :], info


# -- one side ---------------------------------------------------------------------------------
def rss_mb() -> tuple[float, float]:
    """The process's resident memory now and its peak so far, MB."""
    now = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            now = int(line.split()[1]) / 1024
    return round(now, 1), round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def run_one(pipe: Any, request: Any, audio: bool) -> dict[str, Any]:
    """One request alone: its wall, the wall to its first text (audio) event, what the stages
    report, and its output (tokens, or codes)."""
    from edgeomni.runtime.events import AudioChunk, TextDelta

    first: list[float] = []
    start = time.perf_counter()

    def listen(event: object) -> None:
        if audio:
            arrived = isinstance(event, AudioChunk) and bool(event.samples.size)
        else:
            arrived = isinstance(event, TextDelta) and bool(event.token_ids or event.text)
        if arrived and not first:
            first.append(time.perf_counter() - start)

    (out,) = pipe.run([request], batch_size=1, listener=listen)
    wall = time.perf_counter() - start
    entry = out.entry
    if not entry.get("ok"):
        raise SystemExit(f"a request failed: {entry.get('error')}")
    stages = entry["stages"]
    row: dict[str, Any] = {"wall_ms": round(wall * 1e3, 3),
                           "first_event_ms": round(first[0] * 1e3, 3) if first else None}  # fmt: skip
    if audio:
        talker = next(d for d in stages.values() if "talker_ms" in d)
        vocoder = next(d for d in stages.values() if "first_audio_ms" in d)
        row.update(ttf_ms=vocoder["first_audio_ms"], prefill_ms=talker.get("prefill_ms"),
                   prompt_tokens=talker.get("prompt_tokens"),
                   cached_tokens=talker.get("cached_tokens"),
                   output=[list(map(int, f)) for f in out.codes],
                   # what the cache can save before the first frame: the clip's encoders and
                   # the talker's prefill; the vocoder's reference prompt (prompt_cached)
                   encode_ms=round(sum(d.get("encode_ms", 0.0) for d in stages.values()), 3),
                   vocoder_prompt_cached=any(d.get("prompt_cached") for d in stages.values()))  # fmt: skip
    else:
        llm = next(d for d in stages.values() if "output_tokens" in d)
        row.update(ttf_ms=llm["prefill_ms"], prefill_ms=llm["prefill_ms"],
                   prompt_tokens=llm["prompt_tokens"], cached_tokens=llm.get("cached_tokens"),
                   output=list(llm["output_tokens"]))  # fmt: skip
    row["stages"] = stages
    return row


COUNTERS = ("lookups", "hits", "cached_tokens", "computed_tokens", "stored", "stored_bytes")


def cache_since(after: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    """The cache's as_dict() now, its stage counters less those of ``before`` (the warm-up)."""
    out = {k: after[k] for k in ("budget_mb", "used_mb", "entries", "evicted")}
    out["stages"] = {}
    for name, s in after["stages"].items():
        b = (before or {}).get("stages", {}).get(name, {})
        d = {k: s[k] - b.get(k, 0) for k in COUNTERS}
        total = d["cached_tokens"] + d["computed_tokens"]
        d["token_hit_rate"] = round(d["cached_tokens"] / total, 4) if total else None
        out["stages"][name] = d
    return out


def run_side(engine_dir: Path, cache_mb: int, warmup: list, measured: list,
             args: argparse.Namespace, audio: bool) -> dict[str, Any]:  # fmt: skip
    """A fresh Pipeline with the cache's budget ``cache_mb`` (0: off): its stages opened, the
    warm-up requests, then the measured ones in turn."""
    from edgeomni.runtime.engine import Engines
    from edgeomni.runtime.pipeline import Pipeline

    pipe = Pipeline(engine_dir, engines=Engines(threads=args.threads), context_cache_mb=cache_mb)
    state = pipe.admit(0, measured[0])
    if isinstance(state, str):
        raise SystemExit(f"the graph cannot serve the request: {state}")
    pipe.open(set(state.plan.stages))
    cache = getattr(pipe, "context_cache", None)
    if (cache is None) != (cache_mb == 0):
        raise SystemExit(f"context_cache_mb={cache_mb}, but pipe.context_cache is {cache!r}")
    for request in warmup:
        run_one(pipe, request, audio)
    before = cache.as_dict() if cache is not None else None
    rows = [run_one(pipe, request, audio) for request in measured]
    now, peak = rss_mb()
    side: dict[str, Any] = {
        "cache": cache_since(cache.as_dict(), before) if cache is not None else None,
        "rss_mb": now, "peak_rss_mb": peak, "requests": rows,
    }  # fmt: skip
    del pipe, cache
    gc.collect()
    return side


def summarize(side: dict[str, Any]) -> dict[str, Any]:
    rows = side["requests"]

    def warm(key: str) -> float | None:
        xs = [r[key] for r in rows[1:] if r[key] is not None]
        return round(statistics.fmean(xs), 3) if xs else None

    cached = [r["cached_tokens"] or 0 for r in rows]
    prompt = [r["prompt_tokens"] for r in rows]
    cache = side["cache"] or {}
    return {
        "cold_ms": rows[0]["ttf_ms"], "warm_ms": warm("ttf_ms"),
        "cold_prefill_ms": rows[0]["prefill_ms"], "warm_prefill_ms": warm("prefill_ms"),
        "cold_encode_ms": rows[0].get("encode_ms"),
        "warm_encode_ms": warm("encode_ms") if "encode_ms" in rows[0] else None,
        "cold_first_event_ms": rows[0]["first_event_ms"], "warm_first_event_ms": warm("first_event_ms"),
        "prompt_tokens": prompt, "cached_tokens": cached,
        "computed_tokens": [p - c if p is not None else None for p, c in zip(prompt, cached, strict=True)],
        "cache_used_mb": cache.get("used_mb"), "cache_entries": cache.get("entries"),
        "cache_evicted": cache.get("evicted"),
        "ms_per_request": [r["ttf_ms"] for r in rows],
        "token_hit_rate": {n: s["token_hit_rate"] for n, s in cache.get("stages", {}).items()},
        # parts that cache whole values (the clone encoders): hits of lookups
        "hits": {n: f"{s['hits']}/{s['lookups']}" for n, s in cache.get("stages", {}).items()},
        "rss_mb": side["rss_mb"], "peak_rss_mb": side["peak_rss_mb"],
    }  # fmt: skip


def median(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 3) if vals else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


# -- a model: off against on ------------------------------------------------------------------
def compare(args: argparse.Namespace, model: str) -> tuple[dict[str, Any], list[str]]:
    """Both sides, ``args.repeats`` times, the order swapped each time; the summary and the
    requests whose outputs differ off and on."""
    audio = model == "tts"
    layers = args.layers
    if model == "qwen35" and layers is not None:
        layers = max(layers, 4)
    ckpt = checkpoint(args, model, layers)
    if audio:
        limits: dict[str, Any] = {**tb.LIMITS, **quant(args)}
    else:
        length = max(1024, args.prompt_tokens + 256)
        limits = {"max_batch_size": 1, "max_input_len": length,
                  "max_kv_cache_capacity": length + 64, **quant(args)}  # fmt: skip
    if args.device == "cuda":  # float16 on the GPU, as the GPU benches build
        limits.update(device="cuda", dtype="float16")
    engine_dir, build = engine(args, ckpt, limits)
    warmup, measured, info = tts_requests(args) if audio else llm_requests(engine_dir, args)
    order = [s.strip() for s in args.order.split(",")]
    budgets = {"off": 0, "on": args.cache_mb}
    repeats: list[dict[str, Any]] = []
    mismatches: list[str] = []
    for r in range(args.repeats):
        sides = order if r % 2 == 0 else order[::-1]
        runs = {}
        for name in sides:
            print(
                f"{model} repeat {r + 1}/{args.repeats}: cache {name} ...",
                file=sys.stderr,
                flush=True,
            )
            runs[name] = run_side(engine_dir, budgets[name], warmup, measured, args, audio)
            s = summarize(runs[name])
            print(f"  cold {s['cold_ms']} ms, warm {s['warm_ms']} ms, cached {s['cached_tokens']}",
                  file=sys.stderr, flush=True)  # fmt: skip
        for i, (a, b) in enumerate(
            zip(runs["off"]["requests"], runs["on"]["requests"], strict=True)
        ):
            if a["output"] != b["output"]:
                first = next((j for j, (x, y) in enumerate(zip(a["output"], b["output"], strict=False))
                              if x != y), min(len(a["output"]), len(b["output"])))  # fmt: skip
                mismatches.append(f"{model} repeat {r + 1} request {i}: output differs off vs on "
                                  f"from {'frame' if audio else 'token'} {first}")  # fmt: skip
                print(f"!!! {mismatches[-1]}", file=sys.stderr, flush=True)
        repeats.append({"order": sides, "sides": runs})
    summary: dict[str, Any] = {}
    for name in ("off", "on"):
        per = [summarize(rep["sides"][name]) for rep in repeats]
        summary[name] = {**per[-1], **{k: median([p[k] for p in per]) for k in (
            "cold_ms", "warm_ms", "cold_first_event_ms", "warm_first_event_ms", "cold_prefill_ms",
            "warm_prefill_ms", "cold_encode_ms", "warm_encode_ms")}}  # fmt: skip
        summary[name]["ms_per_request"] = [  # each request's median over the repeats
            median([p["ms_per_request"][i] for p in per]) for i in range(len(measured))
        ]
        summary[name]["cold_ms_runs"] = [p["cold_ms"] for p in per]
        summary[name]["warm_ms_runs"] = [p["warm_ms"] for p in per]
    off, on = summary["off"], summary["on"]
    summary["off_over_on"] = {k: ratio(off[k], on[k]) for k in (
        "cold_ms", "warm_ms", "cold_first_event_ms", "warm_first_event_ms")}  # fmt: skip
    summary["outputs_equal"] = not mismatches
    for rep in repeats:  # the raw rows keep no outputs but their lengths (the check is above)
        for side in rep["sides"].values():
            for row in side["requests"]:
                row["output_length"] = len(row.pop("output"))
    result = {"checkpoint": str(ckpt), "layers": layers, "engine": str(engine_dir),
              "build": build, "requests_info": info, "summary": summary,
              "repeats": repeats}  # fmt: skip
    if args.size == "full" and model != "tts":
        dims = QWEN3_06B if model == "qwen3" else QWEN35_08B
        result["dims"] = {**dims, "num_hidden_layers": layers or dims["num_hidden_layers"]}
    return result, mismatches


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| model | cache | prompt tok | shared tok | cold ms | warm ms | ms per request "
        "| cold wall-to-first ms | warm wall-to-first ms | cached tok per request | hit rate "
        "| cache MB | entries | RSS MB | outputs equal |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, res in results.items():
        s, info = res["summary"], res["requests_info"]
        kind = "TTFA" if model == "tts" else "TTFT"
        shared = info.get("shared_prefix_tokens", "-")
        for name in ("off", "on"):
            x = s[name]
            rate = ", ".join(
                f"{k} {v}" if v is not None else f"{k} {x['hits'][k]} hits"
                for k, v in x["token_hit_rate"].items()
            )
            lines.append(
                f"| {model} ({kind}) | {name} | {x['prompt_tokens'][0]} | {shared} | {x['cold_ms']} | "
                f"{x['warm_ms']} | {'/'.join(map(str, x['ms_per_request']))} | "
                f"{_dash(x['cold_first_event_ms'])} | {_dash(x['warm_first_event_ms'])} | "
                f"{'/'.join(map(str, x['cached_tokens']))} | {rate or '-'} | "
                f"{x['cache_used_mb'] if x['cache_used_mb'] is not None else '-'} | "
                f"{x['cache_entries'] if x['cache_entries'] is not None else '-'} | "
                f"{x['rss_mb']} | {'yes' if s['outputs_equal'] else 'NO'} |"
            )
        q = s["off_over_on"]
        lines.append(f"| {model} | off / on | | | {q['cold_ms']}x | {q['warm_ms']}x | | "
                     f"{_dash(q['cold_first_event_ms'], 'x')} | "
                     f"{_dash(q['warm_first_event_ms'], 'x')} | | | | | | |")  # fmt: skip
    for model, res in results.items():
        if model == "tts":
            for name in ("off", "on"):
                x = res["summary"][name]
                lines.append(f"tts {name}: before the first frame, encoders cold {x['cold_encode_ms']} "
                             f"warm {x['warm_encode_ms']} ms, talker prefill cold "
                             f"{x['cold_prefill_ms']} warm {x['warm_prefill_ms']} ms")  # fmt: skip
    return "\n".join(lines)


def _dash(value: Any, unit: str = "") -> str:
    """A figure, or "-" where the run gives none (random weights' text may give no delta
    before the reply ends: TTFT is then the prefill's)."""
    return "-" if value is None else f"{value}{unit}"


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "_make":  # the checkpoint maker's process
        make(json.loads(sys.argv[2]))
        return 0
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--models", default=",".join(MODELS), help="of qwen3, qwen35, tts")
    p.add_argument("--requests", type=int, default=4, help="measured requests a side (>= 2)")
    p.add_argument("--warmup", type=int, default=1, help="requests sharing nothing, run first")
    p.add_argument("--prompt-tokens", type=int, default=500, help="the shared system prompt")
    p.add_argument("--new-tokens", type=int, default=2, help="generated tokens a request")
    p.add_argument("--frames", type=int, default=12, help="tts: codec frames a request")
    p.add_argument("--ref-seconds", type=float, default=5.0, help="tts: the reference clip")
    p.add_argument("--repeats", type=int, default=2, help="off and on each time (the median)")
    p.add_argument("--order", default="off,on", choices=("off,on", "on,off"),
                   help="the sides' order in the first repeat (swapped in each next one)")
    p.add_argument("--cache-mb", type=int, default=1024, help="the on side's budget (MiB)")
    p.add_argument("--precision", default="fp32", choices=("fp32", "int4"),
                   help="int4: int4_rtn decoders (the lm_head too; the TTS vocoder stays float)")
    p.add_argument("--group-size", type=int, default=32, choices=(32, 64, 128))
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: float16 engines on the GPU (onnxruntime-gpu's CUDA provider)")
    p.add_argument("--threads", type=int, help="ONNX Runtime threads an engine (default: ORT's)")
    p.add_argument("--build-threads", type=int, default=2, help="the makers' and builds' threads")
    p.add_argument("--layers", type=int, help="decoder layers (default: the models' own)")
    p.add_argument(
        "--size",
        default="full",
        choices=("full", "tiny"),
        help="full: the real dimensions; tiny: the parity tests' (a quick check)",
    )
    p.add_argument("--work", type=Path, default=Path("/tmp/edgeomni-cache-bench"))
    p.add_argument("--rebuild", action="store_true", help="rebuild the engines")
    p.add_argument("--json", type=Path, help="also write the raw results here")
    args = p.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if unknown := sorted(set(models) - set(MODELS)):
        p.error(f"--models: unknown {', '.join(unknown)} (of {', '.join(MODELS)})")
    if args.requests < 2:
        p.error("--requests: at least 2 (the first is cold, the others warm)")
    if args.cache_mb < 1:
        p.error("--cache-mb: at least 1 (the off side is 0)")
    args.work.mkdir(parents=True, exist_ok=True)

    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join([sys.executable, *sys.argv]),
        "machine": {**tb.machine(), "python": sys.version.split()[0]},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "models": {},
    }  # fmt: skip
    mismatches: list[str] = []
    for model in models:
        report["models"][model], bad = compare(args, model)
        mismatches += bad
    md = table(report["models"])
    kind = args.precision if args.device == "cpu" else "float16, cuda"
    print(f"\ncontext cache off vs on ({args.cache_mb} MiB), {kind}, size {args.size}, "
          f"{args.requests} requests a side at batch 1 (cold: the first; warm: the mean of the "
          f"others), median of {args.repeats}; TTFT: prefill_ms; TTFA: first_audio_ms\n")  # fmt: skip
    print(md)
    for model, res in report["models"].items():
        info = res["requests_info"]
        if "system_prompt_tokens" in info:
            print(f"{model}: system prompt {info['system_prompt_tokens']} tokens, prompts "
                  f"{info['prompt_tokens']} tokens, shared prefix {info['shared_prefix_tokens']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    if mismatches:
        print("\nOUTPUTS DIFFER WITH THE CACHE ON:\n" + "\n".join(mismatches), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
