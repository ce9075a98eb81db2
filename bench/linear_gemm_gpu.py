"""The fused backend's prefill GEMM (plugins/decoder_gemm_cuda.py, ``linear_g*``) against the
tensor-core decode variant it replaces from GEMM_ROWS rows where its tiles fill the GPU
(``linear_m*32``, one block per 32 rows; ``engine_picks`` names the one the engine runs), on
one GPU, at a Qwen3-0.6B / Qwen3-TTS talker layer's matrices (hidden 1024): qkv with the input
norm (N 4096), o with the residual (K 2048), gate_up with the norm and SwiGLU (2 x 3072), down
with the residual (K 3072); float16 and int4 (groups of 32) weights. Device time
of one call of T rows, each way timed twice in alternation (the better counts), against the
compute bound (2 T N K flops at --peak-tflops, the data sheet's dense float16) and the HBM
bound (the weights once, x and the output, at the measured copy bandwidth).

    python bench/linear_gemm_gpu.py [--rows 64 256 1024 3200] [--repeats 50] [--out DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backend_pair import copy_bandwidth_gbs  # noqa: E402
from kernel_bench import KernelBench, parse, parser, write_result  # noqa: E402

HIDDEN, GROUP = 1024, 32
# name: K, N (SwiGLU: outputs), the epilogue
MATRICES = {
    "qkv": (HIDDEN, 4096, {"norm": True}),
    "o": (2048, HIDDEN, {"add": True}),
    "gate_up": (HIDDEN, 3072, {"norm": True, "swiglu": True}),
    "down": (3072, HIDDEN, {"add": True}),
}


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, nargs="+", default=[64, 256, 1024, 3200])
    p.add_argument("--peak-tflops", type=float, default=989.4,
                   help="dense float16 tensor-core peak (H100/H200 SXM data sheet)")
    args = parse(p)

    from edgeomni.plugins import decoder_gemm_cuda as gemm
    from edgeomni.plugins import decoder_linear_cuda as lc
    from edgeomni.plugins.decoder_cuda import f32, i32, i64, ptr
    from edgeomni.plugins.quant_linear import quantize_symmetric

    if min(args.rows) < gemm.GEMM_ROWS:
        p.error(f"--rows: calls under {gemm.GEMM_ROWS} rows run no GEMM")
    bw = copy_bandwidth_gbs()
    bench = KernelBench()
    dev, rng = bench.dev, bench.rng
    rows_out = []
    for name, (k, n, epi) in MATRICES.items():
        swiglu = bool(epi.get("swiglu"))
        wrows = 2 * n if swiglu else n
        w16 = (rng.standard_normal((wrows, k)) * 0.05).astype(np.float16)
        packed, scales = quantize_symmetric(w16.astype(np.float32).T, GROUP, np.float16)
        weights = {"float16": (dev(w16), None), "int4": (dev(packed.reshape(wrows, k // 2)),
                                                         dev(scales))}  # fmt: skip
        norm = dev(rng.standard_normal(k).astype(np.float32)) if epi.get("norm") else None
        for t in args.rows:
            x = dev(rng.standard_normal((t, k)).astype(np.float32))
            out = dev(np.zeros((t, n), np.float32))
            store = lc.STORE_ADD if epi.get("add") else lc.STORE_SET
            for kind, (w, s) in weights.items():
                int4 = kind == "int4"
                ways = {}
                for way, warps in (("gemm", None),
                                   ("mma32", lc.linear_warps(k, "float16", True, int4))):
                    plan = lc.linear_launch("float16", t, k, n, swiglu=swiglu, warps=warps,
                                            int4=int4, gemm_way=way == "gemm")  # fmt: skip
                    if way == "gemm" and not plan.name.startswith("linear_g"):
                        raise SystemExit(f"{name} at {t} rows does not run as a GEMM: "
                                         f"{plan.name}")  # fmt: skip
                    call = [ptr(x.ptr), ptr(None), i32(1), ptr(norm.ptr if norm else None),
                            f32(1e-6), ptr(w.ptr), i64(0), ptr(None), ptr(None), ptr(out.ptr),
                            i32(t), i32(k), i32(n), i32(store)]  # fmt: skip
                    if plan.scales:
                        call += [ptr(s.ptr if s else None), i32(GROUP if int4 else 0)]
                    ways[way] = [(plan.name, (plan.grid, plan.block, 0), call)]
                times = bench.alternating(ways, args.repeats)
                flops = 2.0 * t * wrows * k
                wbytes = w.nbytes + (s.nbytes if s else 0)
                moved = wbytes + x.nbytes + out.nbytes * (2 if store == lc.STORE_ADD else 1)
                row: dict = {"matrix": name, "weights": kind, "rows": t, "k": k, "n": n,
                             "gemm_kernel": ways["gemm"][0][0],
                             "engine_picks": lc.linear_launch("float16", t, k, n, swiglu=swiglu,
                                                              int4=int4).name,  # fmt: skip
                             "compute_bound_ms": round(flops / (args.peak_tflops * 1e12) * 1e3, 4),
                             "hbm_bound_ms": bw and round(moved / (bw * 1e9) * 1e3, 4)}  # fmt: skip
                for way, ms in times.items():
                    row[f"{way}_ms"] = ms
                    row[f"{way}_tflops"] = round(flops / (min(ms) * 1e-3) / 1e12, 1)
                row["mma32_over_gemm"] = round(min(times["mma32"]) / min(times["gemm"]), 2)
                rows_out.append(row)
                print(json.dumps(row), flush=True)
            del x, out
    write_result(args.out, "linear_gemm_gpu", bw, rows_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
