"""SnakeBeta's ops on this CPU: ONNX Runtime's CPU kernels for Sin against ops of one pass each
that it vectorizes and spreads over threads, on one and on all threads (issue 53).

The stateful vocoder's SnakeBeta (x + sin(a x)^2 / b, before every convolution of its decoder)
spends most of its time in ``Sin`` (docs/benchmarks.md, the vocoder's per-op kernel times).
Each op here runs alone on a tensor of the vocoder's largest activations ([1, 96, 48000]
float32: 25 frames at 24 kHz, 96 channels), the best of ``--repeats`` calls, with 1 and
``--threads`` intra-op threads: Sin, Relu and Sigmoid (one pass each), Mul (x * x) and the
SnakeBeta chain as the export writes it (Mul, Sin, Pow, Mul, Add).

    python bench/snake_cpu.py [--threads 2] [--repeats 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SHAPE = (1, 96, 48000)


def graph(op: str) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(SHAPE))
    inits = []
    if op == "SnakeBeta":
        rng = np.random.default_rng(1)
        alpha = np.exp(rng.normal(0, 0.1, (1, SHAPE[1], 1))).astype(np.float32)
        inv_beta = (1 / np.exp(rng.normal(0, 0.1, (1, SHAPE[1], 1)))).astype(np.float32)
        inits = [numpy_helper.from_array(alpha, "alpha"), numpy_helper.from_array(inv_beta, "ib"),
                 numpy_helper.from_array(np.array(2.0, np.float32), "two")]  # fmt: skip
        nodes = [helper.make_node("Mul", ["x", "alpha"], ["ax"]),
                 helper.make_node("Sin", ["ax"], ["s"]),
                 helper.make_node("Pow", ["s", "two"], ["s2"]),
                 helper.make_node("Mul", ["s2", "ib"], ["t"]),
                 helper.make_node("Add", ["x", "t"], ["y"])]  # fmt: skip
    elif op == "Mul":
        nodes = [helper.make_node("Mul", ["x", "x"], ["y"])]
    else:
        nodes = [helper.make_node(op, ["x"], ["y"])]
    g = helper.make_graph(nodes, op, [x], [y], initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def best_ms(model: bytes, threads: int, x: np.ndarray, repeats: int) -> float:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # the runtime's
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    sess.run(None, {"x": x})
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        sess.run(None, {"x": x})
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    rows: list[dict[str, Any]] = []
    for op in ("Sin", "Relu", "Sigmoid", "Mul", "SnakeBeta"):
        model = graph(op)
        times = {t: round(best_ms(model, t, x, args.repeats), 3) for t in (1, args.threads)}
        rows.append({"op": op, "ms_by_threads": times,
                     "ns_per_element": round(times[args.threads] * 1e6 / x.size, 3),
                     "speedup_on_threads": round(times[1] / times[args.threads], 2)})  # fmt: skip
        print(rows[-1], file=sys.stderr, flush=True)
    result = {"date": time.strftime("%Y-%m-%d"), "onnxruntime": ort.__version__,
              "shape": list(SHAPE), "threads": args.threads, "rows": rows}  # fmt: skip
    print(json.dumps(result, indent=2))
    print(f"\n| op | ms, 1 thread | ms, {args.threads} threads | ns an element | speed-up |")
    print("|---|---|---|---|---|")
    for r in rows:
        t = r["ms_by_threads"]
        print(f"| {r['op']} | {t[1]} | {t[args.threads]} | {r['ns_per_element']} | "
              f"{r['speedup_on_threads']}x |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
