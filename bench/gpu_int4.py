"""int4 weights on one GPU: edgeomni's float16 engine against its int4 engines (ONNX Runtime CUDA
provider, MatMulNBits with float16 activations), Qwen3-0.6B dimensions, in one run.

Builds the random-weight checkpoint of bench/llm_decode_cpu.py three ways (--device cuda --dtype
float16; the same with --quantization int4_rtn at group 32 and at group 128, the lm_head int4
too), times greedy decode at each batch size through edge-infer's pipeline, and prints each
engine's weight bytes, step time and the ratio to float16. Run it on the GPU machine:

    python bench/gpu_int4.py --batch 1 8 [--layers 28] [--new-tokens 64] [--out DIR]
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpu_llm import copy_bandwidth_gbs, edgeomni_step  # noqa: E402
from llm_decode_cpu import decode_parser, make_checkpoint  # noqa: E402

BUILDS = {
    "fp16": {},
    "int4 g32": {"quantization": "int4_rtn", "group_size": 32},
    "int4 g128": {"quantization": "int4_rtn", "group_size": 128},
}


def main() -> int:
    p = decode_parser(__doc__, "edgeomni-gpu", batch=True)
    p.add_argument("--out", type=Path, help="write gpu_int4.json here")
    args = p.parse_args()

    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    ckpt = args.work / f"qwen3-0.6b-L{args.layers}"
    make_checkpoint(ckpt, args.layers)
    engines, build_s = {}, {}
    for name, quant in BUILDS.items():
        engine = args.work / f"cuda-L{args.layers}-{name.replace(' ', '-')}"
        start = time.perf_counter()
        if not (engine / "multistage_config.json").is_file():
            limits = BuildArgs(max(args.batch), 256, 512, device="cuda", dtype="float16", **quant)
            build(ckpt, engine, limits)  # type: ignore[arg-type]
        engines[name], build_s[name] = engine, round(time.perf_counter() - start, 1)
    bw = copy_bandwidth_gbs()
    rows = []
    for batch in args.batch:
        steps = {}
        for name, engine in engines.items():
            step, prompt, in_engine = edgeomni_step(engine, batch, args.new_tokens, args.repeats)
            steps[name] = step
            weights = sum(f.stat().st_size for f in engine.glob("llm.onnx*"))
            rows.append({
                "batch": batch, "engine": name, "weights_gb": round(weights / 1e9, 3),
                "weights_vs_fp16": None, "step_ms": round(step, 3),
                "engine_ms": round(in_engine, 3), "tok_s": round(batch * 1e3 / step, 1),
                "speedup_vs_fp16": round(steps["fp16"] / step, 2),
                "weight_read_bound_ms": round(weights / (bw * 1e9) * 1e3, 3),
            })  # fmt: skip
    fp16 = next(r["weights_gb"] for r in rows if r["engine"] == "fp16")
    for r in rows:
        r["weights_vs_fp16"] = round(r["weights_gb"] / fp16, 3)
    import onnxruntime
    import torch

    result = {
        "date": time.strftime("%Y-%m-%d"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "gpu": torch.cuda.get_device_name(0),
        "onnxruntime": onnxruntime.__version__,
        "layers": args.layers,
        "new_tokens": args.new_tokens,
        "copy_bandwidth_gbs": round(bw, 1),
        "build_s": build_s,
        "rows": rows,
    }
    print(json.dumps(result, indent=2))
    print("\n| batch | engine | weights GB | vs fp16 | step ms | in engine ms | tok/s | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['engine']} | {r['weights_gb']} | {r['weights_vs_fp16']}x | "
              f"{r['step_ms']} | {r['engine_ms']} | {r['tok_s']} | {r['speedup_vs_fp16']}x |")  # fmt: skip
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_int4.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
