"""The fused backend's Gated DeltaNet state kernels (plugins/gated_delta_cuda.py) alone on one
GPU, at Qwen3.5 0.8B's linear-attention dimensions (16 key and 16 value heads of 128, conv
kernel 4 over 6144 channels; bench/qwen35_cpu.py's config): device time of one layer's
``conv_state`` + ``delta_rule`` call of B rows of S tokens, against the HBM bound, the bytes a
call must move at the measured copy bandwidth (the recurrent state read and written, the conv
state, the call's inputs and outputs), laid out as the fused plan lays them: the conv reads the
first columns of the in_proj's mix, the rule reads q, k and v side by side in the conv's
output and computes its gates from mix's last columns. No ONNX Runtime side: its
GatedDeltaNet runs inside a whole layer's graph. Each way is timed twice in alternation (the better of the two counts).

    python bench/gated_delta_gpu.py [--calls 1x1 8x1 32x1 1x512 4x512] [--repeats 50] [--out DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backend_pair import copy_bandwidth_gbs  # noqa: E402
from kernel_bench import KernelBench, parse, parser, write_result  # noqa: E402

HK, HV, DK, DV, KERNEL = 16, 16, 128, 128, 4
CHANNELS = 2 * HK * DK + HV * DV  # the conv runs over q, k and v together
MIX = CHANNELS + HV * DV + 2 * HV  # the in_proj's columns: the conv's, z, beta's, the decay's


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--calls", nargs="+", default=["1x1", "8x1", "32x1", "1x512", "4x512"],
                   help="rows x tokens of a call")
    args = parse(p)

    from edgeomni.plugins import gated_delta_cuda as gdc
    from edgeomni.plugins.decoder_cuda import f32, i32, ptr

    bw = copy_bandwidth_gbs()
    bench = KernelBench()
    dev, rng = bench.dev, bench.rng

    w = dev((rng.standard_normal((CHANNELS, KERNEL)) * 0.3).astype(np.float16))
    rows = []
    for call in args.calls:
        b, s = (int(x) for x in call.split("x"))
        mix = dev(rng.standard_normal((b, s, MIX)).astype(np.float32))
        y = dev(rng.standard_normal((b, s, CHANNELS)).astype(np.float32))
        conv = dev(rng.standard_normal((b, CHANNELS, KERNEL - 1)).astype(np.float16))
        lens = dev(np.full(b, s, np.int32))
        state = dev((rng.standard_normal((b, HV, DV, DK)) * 0.1).astype(np.float32))
        dt_bias = dev(rng.uniform(-1, 1, HV).astype(np.float32))
        a_neg = dev(-rng.uniform(0.01, 0.1, HV).astype(np.float32))
        o = dev(np.zeros((b, s, HV * DV), np.float32))
        row = CHANNELS * 4
        cgrid, cblock = gdc.conv_launch(b, CHANNELS, KERNEL)
        rgrid, rblock = gdc.rule_launch(b, HK, HV, DK, DV)
        conv_args = [ptr(mix.ptr), ptr(w.ptr), ptr(conv.ptr), ptr(lens.ptr), i32(s),
                     i32(CHANNELS), i32(MIX), i32(KERNEL), i32(1), ptr(y.ptr)]  # fmt: skip
        rule_args = [ptr(y.ptr), i32(CHANNELS), ptr(mix.ptr), i32(MIX),
                     i32(CHANNELS + HV * DV), ptr(dt_bias.ptr), ptr(a_neg.ptr), f32(20.0),
                     ptr(state.ptr), ptr(lens.ptr), i32(s), i32(HK), i32(HV), i32(DK), i32(DV),
                     i32(1), f32(gdc.rule_scale(0.0, DK)), ptr(o.ptr)]  # fmt: skip
        ways = {"conv_state": [("conv_state", (cgrid, cblock, 0), conv_args)],
                "delta_rule": [("delta_rule", (rgrid, rblock, 0), rule_args)]}

        times = bench.alternating(ways, args.repeats)
        moved = {  # bytes a call must move at least
            "conv_state": 2 * b * s * row + 2 * conv.nbytes + w.nbytes,
            "delta_rule": 2 * state.nbytes + y.nbytes + o.nbytes + b * s * 2 * HV * 4,
        }
        out: dict = {"rows": b, "tokens": s}
        for way, ms in times.items():
            bound = moved[way] / (bw * 1e9) * 1e3 if bw else None
            out[f"{way}_ms"] = ms
            out[f"{way}_bytes"] = moved[way]
            out[f"{way}_hbm_bound_ms"] = bound and round(bound, 4)
            out[f"{way}_over_bound"] = bound and round(min(ms) / bound, 2)
        rows.append(out)
        print(json.dumps(out), flush=True)
    write_result(args.out, "gated_delta_gpu", bw, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
