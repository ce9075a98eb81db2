"""GPU probe: fp16 matrix products at decode shapes on ONNX Runtime's CUDA provider, replayed as
CUDA graphs. MatMul(X, W[K,N]) (the exporter's layout) against Gemm(X, W[N,K], transB=1) and
com.microsoft::FusedMatMul(X[M,1,K], W[N,K], transB=1): does the weight layout change what a
small decode product costs? 16 independent products a graph (distinct weights, more than L2
holds); prints us per product and the bandwidth that implies.

    python bench/probes/matmul_layouts.py        (needs onnxruntime-gpu and a GPU)
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

COPIES = 16
KINDS = ("matmul", "matmul3", "gemm", "fused")
SHAPES = ((1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024), (1024, 2048), (2048, 4096),
          (4096, 2048))  # fmt: skip


def model(kind: str, m: int, k: int, n: int) -> tuple[onnx.ModelProto, list[int]]:
    nodes, inits, outs = [], [], []
    xshape = [m, 1, k] if kind in ("fused", "matmul3") else [m, k]
    for i in range(COPIES):
        w = (np.random.default_rng(i).standard_normal((k, n)) * 0.02).astype(np.float16)
        plain = kind.startswith("matmul")
        inits.append(numpy_helper.from_array(w if plain else np.ascontiguousarray(w.T), f"w{i}"))
        if plain:
            nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]))
        elif kind == "gemm":
            nodes.append(helper.make_node("Gemm", ["x", f"w{i}"], [f"y{i}"], transB=1))
        else:
            nodes.append(helper.make_node("FusedMatMul", ["x", f"w{i}"], [f"y{i}"],
                                          domain="com.microsoft", transB=1))  # fmt: skip
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT16, [*xshape[:-1], n]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, xshape)
    graph = helper.make_graph(nodes, "probe", [x], outs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    made = helper.make_model(graph, opset_imports=opsets)
    made.ir_version = 8
    return made, xshape


def bench(kind: str, m: int, k: int, n: int, reps: int = 200) -> tuple[float, np.ndarray]:
    """Seconds per product, and the first product's output."""
    made, xshape = model(kind, m, k, n)
    providers = [("CUDAExecutionProvider", {"enable_cuda_graph": "1"})]
    session = ort.InferenceSession(made.SerializeToString(), providers=providers)
    data = (np.random.default_rng(99).standard_normal(xshape) * 0.5).astype(np.float16)
    x = ort.OrtValue.ortvalue_from_numpy(data, "cuda", 0)
    ys = [ort.OrtValue.ortvalue_from_shape_and_type([*xshape[:-1], n], np.float16, "cuda", 0)
          for _ in range(COPIES)]  # fmt: skip
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", x)
    for i, y in enumerate(ys):
        binding.bind_ortvalue_output(f"y{i}", y)
    for _ in range(5):  # the first run captures the graph
        session.run_with_iobinding(binding)
    start = time.perf_counter()
    for _ in range(reps):
        session.run_with_iobinding(binding)
    return (time.perf_counter() - start) / reps / COPIES, ys[0].numpy().reshape(m, n)


def main() -> None:
    print("onnxruntime", ort.__version__)
    print(f"{'M':>3} {'K':>5} {'N':>5} | " + " | ".join(f"{kind:>20}" for kind in KINDS))
    for k, n in SHAPES:
        for m in (1, 8, 32):
            cells, ref = [], None
            for kind in KINDS:
                seconds, y = bench(kind, m, k, n)
                ref = y if ref is None else ref
                err = float(np.abs(y.astype(np.float32) - ref.astype(np.float32)).max())
                tbs = k * n * 2 / seconds / 1e12
                cells.append(f"{seconds * 1e6:5.1f}us {tbs:4.2f}TB/s {err:.0e}".rjust(20))
            print(f"{m:>3} {k:>5} {n:>5} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
