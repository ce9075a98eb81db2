"""Where a served run's time goes on the GPU, from the profiler's trace (bench/profile_run.py
--timeline): the run as it is served (CUDA graphs on, no call waited for), its kernels read from
torch.profiler's Chrome trace, where CUPTI lists each kernel a graph launched with its stream.

``summarize`` is the arithmetic (pure, tested in tests/test_timeline.py): per stream, the time
its kernels kept it busy (the union of their intervals) by kernel family; the time any stream
was busy; the overlap (what the streams' busy times add up to beyond that); and the time no
kernel ran, which is the host's (Python between calls, launches, the waits for results), each
also per decode step of the talker. ``gaps`` names where that time falls: the idle gaps by the
kernel that ended before each and the one that started after.

    python bench/timeline.py KERNELS.json.gz [--min-us 30] [--top 8]   # a saved run's gaps
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

RUN = "edgeomni:run"  # the profiled run's range
# ONNX Runtime's and cuDNN's kernels by what they compute (the fused engine's go by name)
FAMILIES = (("convolution", ("conv", "cudnn", "implicit_gemm", "winograd", "fft")),
            ("gemm", ("gemm", "cutlass", "xmma", "cublas", "gemv")),
            ("attention", ("attention", "fmha", "flash")),
            ("normalization", ("norm",)),
            ("reduce or softmax", ("reduce", "softmax", "topk", "argmax")))  # fmt: skip
# the fused module's kernels: a name's family is its name up to its rows variant
FUSED = re.compile(r"^(linear|qk_rope|rms_rows|add_into|frame_sum|half_to_float|float_to_half|"
                   r"topk|first_draw|moe|conv_state|delta_rule|"
                   r"edgeomni_cached_attention)")


def family(name: str) -> str:
    """A kernel's family: the fused module's by its name, ONNX Runtime's by what it does."""
    fused = FUSED.match(name)
    if fused:
        return "fused " + fused.group(1)
    low = name.lower()
    for label, keys in FAMILIES:
        if any(k in low for k in keys):
            return "onnxruntime " + label
    return "onnxruntime other"


def union(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(kernels: Sequence[dict[str, Any]], start: float, duration: float, steps: int
              ) -> dict[str, Any]:  # fmt: skip
    """``kernels``: trace events (``ts``, ``dur`` in us, ``name``, ``args.stream``) of the run
    that started at ``start`` and took ``duration`` us, over ``steps`` decode steps."""
    inside = [k for k in kernels if start <= k["ts"] < start + duration]
    streams: dict[Any, list[dict[str, Any]]] = {}
    for k in inside:
        streams.setdefault(k.get("args", {}).get("stream"), []).append(k)
    per_step = max(steps, 1)
    out_streams = []
    for stream, ks in sorted(streams.items(), key=lambda kv: -sum(k["dur"] for k in kv[1])):
        families: dict[str, float] = {}
        for k in ks:
            families[family(k["name"])] = families.get(family(k["name"]), 0.0) + k["dur"]
        busy = union((k["ts"], k["ts"] + k["dur"]) for k in ks)
        out_streams.append({
            "stream": stream, "kernels": len(ks), "busy_ms": round(busy / 1e3, 3),
            "busy_ms_per_step": round(busy / 1e3 / per_step, 4),
            "families_ms": {f: round(us / 1e3, 3)
                            for f, us in sorted(families.items(), key=lambda kv: -kv[1])},
        })  # fmt: skip
    any_busy = union((k["ts"], k["ts"] + k["dur"]) for k in inside)
    overlap = sum(s["busy_ms"] for s in out_streams) * 1e3 - any_busy
    idle = duration - any_busy
    return {
        "wall_ms": round(duration / 1e3, 3), "steps": steps,
        "wall_ms_per_step": round(duration / 1e3 / per_step, 4),
        "gpu_busy_ms": round(any_busy / 1e3, 3),
        "gpu_busy_fraction": round(any_busy / duration, 4) if duration else None,
        "overlap_ms": round(overlap / 1e3, 3),
        "no_kernel_ms": round(idle / 1e3, 3),
        "no_kernel_ms_per_step": round(idle / 1e3 / per_step, 4),
        "streams": out_streams,
        "gaps": gaps(inside),
    }  # fmt: skip


def gaps(kernels: Sequence[dict[str, Any]], min_us: float = 30.0) -> list[dict[str, Any]]:
    """The times no kernel ran for at least ``min_us``, summed by the kernel that ended last
    before each and the one that started it (their names up to 40 characters), largest
    first: where the host kept the device waiting, and between which of its calls."""
    by: dict[tuple[str, str], list[float]] = {}
    ordered = sorted(kernels, key=lambda k: k["ts"])
    if not ordered:
        return []
    end, last = ordered[0]["ts"] + ordered[0]["dur"], ordered[0]["name"]
    for k in ordered[1:]:
        idle = k["ts"] - end
        if idle >= min_us:
            by.setdefault((last[:40], k["name"][:40]), []).append(idle)
        if k["ts"] + k["dur"] > end:
            end, last = k["ts"] + k["dur"], k["name"]
    rows = [{"after": a, "before": b, "count": len(v), "idle_ms": round(sum(v) / 1e3, 3)}
            for (a, b), v in by.items()]  # fmt: skip
    return sorted(rows, key=lambda r: -r["idle_ms"])


def gap_lines(rows: Sequence[dict[str, Any]], top: int = 8) -> list[str]:
    return [f"    {r['idle_ms']:10.3f} ms  {r['count']:4d} gaps  after {r['after']}, "
            f"before {r['before']}" for r in rows[:top]]  # fmt: skip


def lines(summary: dict[str, Any], top: int = 8) -> list[str]:
    s = summary
    out = [f"run: {s['wall_ms']} ms over {s['steps']} steps ({s['wall_ms_per_step']} ms a step); "
           f"a kernel ran {s['gpu_busy_ms']} ms ({100 * (s['gpu_busy_fraction'] or 0):.1f}%), "
           f"streams overlapped {s['overlap_ms']} ms, no kernel {s['no_kernel_ms']} ms "
           f"({s['no_kernel_ms_per_step']} ms a step)"]  # fmt: skip
    for st in s["streams"]:
        out.append(f"stream {st['stream']}: {st['kernels']} kernels, busy {st['busy_ms']} ms "
                   f"({st['busy_ms_per_step']} ms a step)")  # fmt: skip
        for fam, ms in list(st["families_ms"].items())[:top]:
            out.append(f"    {ms:10.3f} ms  {fam}")
    if s.get("gaps"):
        out.append("no kernel for 30 us or more, by the kernels around it:")
        out += gap_lines(s["gaps"], top)
    return out


def steps_of(outcomes: Sequence[Any], keys: Sequence[str]) -> int | None:
    """The most steps a stage of these outcomes reports (the first of ``keys`` it has); None,
    after printing its error, where a request failed."""
    steps = 0
    for outcome in outcomes:
        if not outcome.entry["ok"]:
            print(f"request {outcome.entry['request_idx']} failed: {outcome.entry['error']}")
            return None
        for report in outcome.entry["stages"].values():
            given = next((report[k] for k in keys if k in report), 0)
            steps = max(steps, int(given or 0))
    return steps


def profile(pipe: Any, requests: list[Any], batch_size: int, wanted: Any, out: Path | None
            ) -> int:  # fmt: skip
    """Profile one more run of ``requests`` (the pipeline is warm) and print where its time
    went; ``out``: timeline.json and the gzipped trace there."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof, record_function(RUN):
        outcomes = pipe.run(requests, batch_size=batch_size, requested=wanted)
    steps = steps_of(outcomes, ("frames", "decode_steps"))
    if steps is None:
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    run = next(e for e in events if e.get("name") == RUN and e.get("ph") == "X"
               and e.get("cat") == "user_annotation")  # the host's range, not the GPU's copy
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    summary = summarize(kernels, float(run["ts"]), float(run["dur"]), steps)
    print("\n".join(lines(summary)))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "timeline.json").write_text(json.dumps(summary, indent=2) + "\n")
        with gzip.open(out / "kernels.json.gz", "wt") as f:  # the kernels, not the whole trace
            json.dump([{k: e.get(k) for k in ("name", "ts", "dur", "args")} for e in kernels], f)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description="A saved run's idle gaps (its kernels.json.gz).")
    p.add_argument("kernels", type=Path)
    p.add_argument("--min-us", type=float, default=30.0)
    p.add_argument("--top", type=int, default=8)
    args = p.parse_args()
    with gzip.open(args.kernels, "rt") as f:
        kernels = json.load(f)
    rows = gaps(kernels, args.min_us)
    print(f"{args.kernels}: {sum(r['idle_ms'] for r in rows):.3f} ms with no kernel for "
          f"{args.min_us:g} us or more, in {sum(r['count'] for r in rows)} gaps")
    print("\n".join(gap_lines(rows, args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
