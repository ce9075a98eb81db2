"""The fused backend's MoE step (plugins/moe_cuda.py) alone on one GPU, at Qwen3-Omni's thinker
dimensions (hidden 2048, 128 experts, top 8, expert intermediate 768; float16 weights): device
time per call against the HBM bound, the bytes of the experts the call's tokens chose (each
chosen expert's gate/up and down rows read once) at the measured copy bandwidth. The kernels
read each token's experts for that token alone (no grouping by expert), so from a few tokens on
a call reads the same expert more than once; the bound does not. Prefills of more slots than
experts run grouped by expert too, and (float16) with the experts' products as tensor-core GEMMs
(``grouped_gemm``).

    python bench/moe_kernels_gpu.py [--tokens 1 4 16 32] [--repeats 200] [--out DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backend_pair import copy_bandwidth_gbs  # noqa: E402
from kernel_bench import KernelBench, parse, parser, write_result  # noqa: E402

HIDDEN, EXPERTS, TOP_K, INTER = 2048, 128, 8, 768


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 32, 128, 512, 2048])
    args = parse(p)

    from edgeomni.plugins import moe, moe_cuda
    from edgeomni.plugins.decoder_cuda import f32, i32, ptr

    bw = copy_bandwidth_gbs()
    bench = KernelBench()
    dev, rng = bench.dev, bench.rng

    fc1 = dev((rng.standard_normal((EXPERTS, 2 * INTER, HIDDEN)) * 0.02).astype(np.float16))
    fc2 = dev((rng.standard_normal((EXPERTS, HIDDEN, INTER)) * 0.02).astype(np.float16))
    nw = dev(np.ones(HIDDEN, np.float32))
    rows = []
    for t in args.tokens:
        router = (rng.standard_normal((t, EXPERTS)) * 2).astype(np.float32)
        h = dev(rng.standard_normal((t, HIDDEN)).astype(np.float32))
        r = dev(router)
        ids = dev(np.zeros((t, TOP_K), np.int32))
        w = dev(np.zeros((t, TOP_K), np.float32))
        act = dev(np.zeros((t * TOP_K, INTER), np.float32))
        route = [ptr(r.ptr), i32(EXPERTS), i32(TOP_K), i32(1), ptr(ids.ptr), ptr(w.ptr)]
        floats = [ptr(None), i32(0)]  # float16 experts: no int4 scales
        calls: list[tuple[str, tuple, list]] = []
        for name, shape in moe_cuda.launches(t, HIDDEN, INTER, TOP_K).items():
            calls.append((name, shape, {
                "moe_route": route,
                "moe_gate_up": [ptr(h.ptr), ptr(nw.ptr), f32(1e-6), ptr(fc1.ptr), ptr(ids.ptr),
                                i32(TOP_K), i32(HIDDEN), i32(INTER), ptr(act.ptr), *floats],
                "moe_down": [ptr(act.ptr), ptr(fc2.ptr), ptr(ids.ptr), ptr(w.ptr), i32(TOP_K),
                             i32(HIDDEN), i32(INTER), ptr(None), ptr(None), ptr(h.ptr),
                             *floats],
            }[name]))  # fmt: skip
        ways = {"per_slot": calls}
        if moe_cuda.grouped(t, TOP_K, EXPERTS):  # as the engine runs a prefill's
            part = min(t, moe_cuda.GROUP_TOKENS)
            offsets = dev(np.zeros(EXPERTS + 1, np.int32))
            order = dev(np.zeros(part * TOP_K, np.int32))
            xn = dev(np.zeros((part, HIDDEN), np.float32))
            d = dev(np.zeros((part * TOP_K, HIDDEN), np.float32))
            tiles = dev(np.zeros(moe_cuda.tiles_size(part * TOP_K, EXPERTS), np.int32))
            first = ("moe_route", moe_cuda.launches(t, HIDDEN, INTER, TOP_K)["moe_route"], route)
            # the experts' products by the SIMT grouped kernels, then (float16) as GEMMs
            for way, gemm in (("grouped", False), ("grouped_gemm", True)):
                if gemm and not moe_cuda.uses_gemm(True, "float16", HIDDEN, INTER):
                    continue
                table = [ptr(offsets.ptr), ptr(order.ptr)] + [ptr(tiles.ptr)] * gemm
                calls = [first]
                for t0 in range(0, t, moe_cuda.GROUP_TOKENS):
                    n = min(moe_cuda.GROUP_TOKENS, t - t0)
                    rows_at, slot_at = t0 * HIDDEN * 4, t0 * TOP_K * 4
                    products = {  # each: (the kernel's name, its arguments)
                        "gate_up": [ptr(xn.ptr), ptr(fc1.ptr), *table, i32(TOP_K), i32(HIDDEN),
                                    i32(INTER), ptr(act.ptr), *floats],
                        "down": [ptr(act.ptr), ptr(fc2.ptr), *table, i32(HIDDEN), i32(INTER),
                                 ptr(d.ptr), *floats],
                    }  # fmt: skip
                    args_of = {
                        "moe_group": [ptr(ids.ptr + slot_at), i32(n * TOP_K), i32(EXPERTS),
                                      ptr(offsets.ptr), ptr(order.ptr),
                                      ptr(tiles.ptr if gemm else None)],
                        "moe_norm": [ptr(h.ptr + rows_at), ptr(nw.ptr), f32(1e-6), i32(HIDDEN),
                                     ptr(xn.ptr)],
                        **{f"moe_{k}_{'gemm' if gemm else 'grouped'}": a
                           for k, a in products.items()},
                        "moe_combine": [ptr(d.ptr), ptr(w.ptr + slot_at), i32(TOP_K),
                                        i32(HIDDEN), ptr(None), ptr(None), ptr(h.ptr + rows_at)],
                    }  # fmt: skip
                    shapes = moe_cuda.launches(n, HIDDEN, INTER, TOP_K, EXPERTS, gemm=gemm)
                    calls += [(name, shapes[name], a) for name, a in args_of.items()]
                ways[way] = calls

        times = bench.alternating(ways, args.repeats)
        chosen = len(np.unique(moe.routing(router, top_k=TOP_K, normalize_routing=1)[0]))
        parts = -(-t // moe_cuda.GROUP_TOKENS)
        nbytes = chosen * 3 * INTER * HIDDEN * 2
        bound = nbytes / (bw * 1e9) * 1e3 if bw else None
        row: dict = {"tokens": t, "experts_chosen": chosen, "parts": parts,
                     "expert_bytes": nbytes, "hbm_bound_ms": bound and round(bound, 4)}  # fmt: skip
        for way, ms in times.items():
            row[f"{way}_ms"] = ms
            row[f"{way}_over_bound"] = bound and round(min(ms) / bound, 2)
        if "grouped" in times:
            row["per_slot_over_grouped"] = round(min(times["per_slot"]) / min(times["grouped"]), 2)
        if "grouped_gemm" in times:
            row["grouped_over_gemm"] = round(min(times["grouped"]) / min(times["grouped_gemm"]), 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_result(args.out, "moe_kernels_gpu", bw, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
