"""Where one edge-infer run's time goes: host functions (cProfile) and, on a GPU, CUDA kernels.

Runs a request file (or one text prompt) through an engine dir twice, the first as a warm-up,
and profiles the second:

- host: the functions with the most time of their own (``--top`` rows), which is where the host
  work between engine calls goes (sampling, feeds, copies);
- ``--kernels`` (GPU engines): every CUDA kernel, ONNX Runtime's included (torch.profiler
  reads them through CUPTI), summed by name, with launches per decode step. CUDA graphs are
  turned off for this run so each kernel shows by itself; kernel times are the same either way.
  Then per engine: calls, kernels per call and GPU time per call (each call is waited for in
  this run, so every kernel is put down to the engine that launched it).
- ``--timeline`` (GPU engines): the run as it is served, CUDA graphs on and no call waited
  for, its kernels read from the profiler's trace (bench/timeline.py): per CUDA stream the time
  its kernels kept it busy, by kernel family; the time any stream was busy; the overlap of the
  streams (the vocoder on a stream of its own, ``--vocoder-threads``); and the time no kernel
  ran (the host's: Python, launches, waits), each per codec frame.

    python bench/profile_run.py ENGINE_DIR --prompt "Hello" [--speech] [--kernels]
    python bench/profile_run.py ENGINE_DIR --input-file requests.json --batch-size 4
    python bench/profile_run.py ENGINE_DIR --input-file tts.json --speech --timeline \
        [--vocoder-threads 1] [--code2wav-streaming windows] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import json
import pstats
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import timeline


def requests_from(args: argparse.Namespace) -> list[Any]:
    from edgeomni.runtime.requests import parse_request_file

    if args.input_file:
        body = json.loads(Path(args.input_file).read_text())
    else:
        message = {"role": "user", "content": [{"type": "text", "text": args.prompt}]}
        body = {"requests": [{"messages": [message]}]}
    body.update(json.loads(args.sampling))
    requests, _ = parse_request_file(body)
    return requests


def _ours(event: Any) -> bool:
    """per_engine_calls' own ranges, which the profiler also lists on the GPU's timeline."""
    return event.name.startswith("engine:")


def kernel_table(prof: Any, steps: int, top: int) -> list[str]:
    import torch

    time_us: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and not _ours(event):
            time_us[event.name[:100]] += event.device_time
            count[event.name[:100]] += 1
    launches = sum(count.values())
    lines = [
        f"CUDA kernels: {sum(time_us.values()) / 1e3:.1f} ms in {launches} launches "
        f"(~{launches / max(steps, 1):.0f} per decode step over {steps} steps)",
        "      ms  launches  kernel",
    ]
    for name, us in time_us.most_common(top):
        lines.append(f"{us / 1e3:8.2f}  {count[name]:8d}  {name}")
    return lines


@contextlib.contextmanager
def per_engine_calls(engine_dir: Path) -> Iterator[None]:
    """Brackets every engine call with a named profiler range and a device-wide sync, so each
    kernel can be put down to the engine whose call it ran in (by its start time)."""
    import torch
    from torch.profiler import record_function

    from edgeomni.runtime import engine as eng

    root = engine_dir if engine_dir.is_dir() else engine_dir.parent
    # an engine folder is named by the stage whose artifact it is (the root: "thinker", "llm")
    stages = json.loads((root / "multistage_config.json").read_text())["stages"]
    names = {(root / s["artifact"]).resolve(): s["id"] for s in stages}
    plain = eng.OrtBinding.run

    def run(self: Any, feeds: Any, *, graph: int | None = None, wait: bool = True) -> None:
        folder = Path(self._session._model_path).parent.resolve()
        name = names.get(folder, folder.name)
        with record_function(f"engine:{name}"):
            plain(self, feeds, graph=graph, wait=True)
            torch.cuda.synchronize()

    eng.OrtBinding.run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        eng.OrtBinding.run = plain  # type: ignore[method-assign]


def engine_table(prof: Any, top: int) -> list[str]:
    """Kernels and their GPU time per engine call, per engine; then each engine's ``top``
    kernels by GPU time, with launches per call."""
    import bisect

    import torch

    ranges = sorted(
        (e.time_range.start, e.time_range.end, e.name[len("engine:") :])
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("engine:")
    )
    starts = [r[0] for r in ranges]
    calls = collections.Counter(r[2] for r in ranges)
    kernels: collections.Counter[str] = collections.Counter()
    time_us: collections.Counter[str] = collections.Counter()
    each: dict[str, collections.Counter[tuple[str, str]]] = collections.defaultdict(
        collections.Counter
    )
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or _ours(e):
            continue
        i = bisect.bisect_right(starts, e.time_range.start) - 1
        name = ranges[i][2] if i >= 0 and e.time_range.start <= ranges[i][1] else "(outside)"
        kernels[name] += 1
        time_us[name] += e.device_time
        each[name][("us", e.name[:90])] += e.device_time
        each[name][("n", e.name[:90])] += 1
    lines = ["engine          calls  kernels/call  GPU us/call  GPU ms"]
    for name in sorted(kernels, key=lambda n: -time_us[n]):
        n = max(calls.get(name, 0), 1)
        lines.append(
            f"{name:14s} {calls.get(name, 0):6d} {kernels[name] / n:13.1f} "
            f"{time_us[name] / n:12.1f} {time_us[name] / 1e3:7.1f}"
        )
    for name in sorted(kernels, key=lambda n: -time_us[n]):
        n = max(calls.get(name, 0), 1)
        lines += ["", f"{name}: per call   us  launches  kernel"]
        rows = sorted(((k, v) for (kind, k), v in each[name].items() if kind == "us"),
                      key=lambda kv: -kv[1])[:top]  # fmt: skip
        for kernel, us in rows:
            lines.append(f"{'':14s} {us / n:8.1f} {each[name][('n', kernel)] / n:9.2f}  {kernel}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("engine", type=Path, help="engine dir (or its multistage_config.json)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--input-file", type=Path)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--sampling", default="{}", help="JSON merged into the request file's top")
    p.add_argument("--speech", action="store_true", help="also run the stages that make audio")
    p.add_argument("--kernels", action="store_true", help="CUDA kernels too (GPU engines)")
    p.add_argument("--timeline", action="store_true",
                   help="where the served run's time goes, CUDA graphs on (GPU engines)")
    p.add_argument("--vocoder-threads", type=int, help="edge-infer's --vocoder-threads")
    p.add_argument("--code2wav-streaming", choices=("stateful", "windows"))
    p.add_argument("--host-first-draw", action="store_true",
                   help="comparison only: a speech talker's first codes drawn on the host")
    p.add_argument("--out", type=Path, help="--timeline: writes timeline.json and the trace")
    p.add_argument("--top", type=int, default=25, help="rows per table")
    args = p.parse_args(argv)

    from edgeomni.runtime.engine import Engines
    from edgeomni.runtime.pipeline import Pipeline

    if args.kernels or args.timeline:
        import torch

        if not torch.cuda.is_available():
            print("profile_run: --kernels and --timeline need a CUDA GPU (and torch with CUDA)")
            return 2
    if args.kernels and args.timeline:
        print("profile_run: --kernels (graphs off, calls waited for) or --timeline, not both")
        return 2
    requests = requests_from(args)
    if args.host_first_draw:
        from edgeomni.runtime.speech.talker import SpeechTalker

        SpeechTalker.draw = lambda *a, **k: None  # type: ignore[method-assign]
    pipe = Pipeline(args.engine, engines=Engines(cuda_graphs=not args.kernels),
                    vocoder_threads=args.vocoder_threads,
                    code2wav_streaming=args.code2wav_streaming)  # fmt: skip
    wanted = None if args.speech else (pipe.text_terminals() or None)
    pipe.run(requests, batch_size=args.batch_size, requested=wanted)  # warm-up, loads engines
    if args.timeline:
        return timeline.profile(pipe, requests, args.batch_size, wanted, args.out)
    host = cProfile.Profile()
    if args.kernels:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with per_engine_calls(args.engine), profile(activities=activities) as prof:
            outcomes = pipe.run(requests, batch_size=args.batch_size, requested=wanted)
    host.enable()
    outcomes = pipe.run(requests, batch_size=args.batch_size, requested=wanted)
    host.disable()
    steps = timeline.steps_of(outcomes, ("decode_steps",))
    if steps is None:
        return 1
    for outcome in outcomes:
        print(json.dumps(outcome.entry["stages"]))
    print(f"\nhost: the {args.top} functions with the most time of their own")
    pstats.Stats(host, stream=sys.stdout).sort_stats("tottime").print_stats(args.top)
    if args.kernels:
        print("\n".join(kernel_table(prof, steps, args.top)))
        print("\nper engine (each call waited for, so its kernels are its own):")
        print("\n".join(engine_table(prof, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
