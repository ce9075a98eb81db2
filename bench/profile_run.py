"""Where one edge-infer run's time goes: host functions (cProfile) and, on a GPU, CUDA kernels.

Runs a request file (or one text prompt) through an engine dir twice, the first as a warm-up,
and profiles the second:

- host: the functions with the most time of their own (``--top`` rows), which is where the host
  work between engine calls goes (sampling, feeds, copies);
- ``--kernels`` (GPU engines): every CUDA kernel, ONNX Runtime's included (torch.profiler
  reads them through CUPTI), summed by name, with launches per decode step. CUDA graphs are
  turned off for this run so each kernel shows by itself; kernel times are the same either way.

    python bench/profile_run.py ENGINE_DIR --prompt "Hello" [--speech] [--kernels]
    python bench/profile_run.py ENGINE_DIR --input-file requests.json --batch-size 4
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import pstats
import sys
from pathlib import Path
from typing import Any


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


def kernel_table(prof: Any, steps: int, top: int) -> list[str]:
    import torch

    time_us: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
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
    p.add_argument("--top", type=int, default=25, help="rows per table")
    args = p.parse_args(argv)

    from edgeomni.runtime.pipeline import Pipeline

    if args.kernels:
        import torch

        if not torch.cuda.is_available():
            print("profile_run: --kernels needs a CUDA GPU (and torch built with CUDA)")
            return 2
    requests = requests_from(args)
    pipe = Pipeline(args.engine, cuda_graphs=not args.kernels)
    wanted = None if args.speech else (pipe.text_terminals() or None)
    pipe.run(requests, batch_size=args.batch_size, requested=wanted)  # warm-up, loads engines
    host = cProfile.Profile()
    if args.kernels:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            outcomes = pipe.run(requests, batch_size=args.batch_size, requested=wanted)
    host.enable()
    outcomes = pipe.run(requests, batch_size=args.batch_size, requested=wanted)
    host.disable()
    steps = 0
    for outcome in outcomes:
        if not outcome.entry["ok"]:
            print(f"request {outcome.entry['request_idx']} failed: {outcome.entry['error']}")
            return 1
        for report in outcome.entry["stages"].values():
            steps = max(steps, int(report.get("decode_steps", 0)))
        print(json.dumps(outcome.entry["stages"]))
    print(f"\nhost: the {args.top} functions with the most time of their own")
    pstats.Stats(host, stream=sys.stdout).sort_stats("tottime").print_stats(args.top)
    if args.kernels:
        print("\n".join(kernel_table(prof, steps, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
