"""What the fused kernels' micro-benchmarks share (bench/moe_kernels_gpu.py,
bench/gated_delta_gpu.py): one float16 module of plugins/decoder_cuda.py's kernels on device 0's
stream, host arrays put on the device, and a list of launches timed as the wall of a Python loop
over them (a call under ~10 us measures its launches)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A micro-benchmark's flags: its own, then --repeats and --out (``parse``)."""
    return argparse.ArgumentParser(description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def parse(p: argparse.ArgumentParser) -> argparse.Namespace:
    p.add_argument("--repeats", type=int, default=50, help="calls a timing")
    p.add_argument("--out", type=Path, help="writes OUT/<bench>.json")
    return p.parse_args()


class KernelBench:
    """The kernels, the stream, and ``rng``'s arrays on the device; the copy bandwidth."""

    def __init__(self) -> None:
        from edgeomni.plugins import attention_cuda as ac
        from edgeomni.plugins import decoder_cuda as dc
        from edgeomni.runtime import memory

        self.memory = memory
        self.kernels = dc.DecoderKernels(dc.Variant("float16", "float16"))
        self.stream = ac.stream_handle(memory.stream(0))
        self.rng = np.random.default_rng(0)

    def dev(self, a: np.ndarray) -> Any:
        """``a`` copied into a new device buffer."""
        d = self.memory.DeviceArray.zeros(a.shape, a.dtype)
        d.upload(a)
        return d

    def once(self, calls: list[tuple[str, tuple, list]]) -> None:
        """Each (kernel, (grid, block, dynamic shared bytes), arguments), in order."""
        for name, (grid, block, shared), args in calls:
            self.kernels.launch(name, grid, block, args, shared=shared, stream=self.stream)

    def timed(self, calls: list[tuple[str, tuple, list]], repeats: int) -> float:
        """Milliseconds a pass over ``calls``: one untimed, then ``repeats`` back to back."""
        self.once(calls)
        self.memory.synchronize(0)
        start = time.perf_counter()
        for _ in range(repeats):
            self.once(calls)
        self.memory.synchronize(0)
        return (time.perf_counter() - start) / repeats * 1e3

    def alternating(self, ways: dict[str, list], repeats: int, turns: int = 2
                    ) -> dict[str, list[float]]:  # fmt: skip
        """Each way's ``timed`` milliseconds, ``turns`` times, the ways in turn (a, b, a, b)."""
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(turns):
            for way, calls in ways.items():
                times[way].append(round(self.timed(calls, repeats), 4))
        return times


def write_result(out: Path | None, name: str, bandwidth_gbs: float | None, rows: list) -> None:
    """OUT/<name>.json: the date, the command, the copy bandwidth and the rows."""
    if out is None:
        return
    result = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "copy_bandwidth_gbs": bandwidth_gbs, "rows": rows}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
