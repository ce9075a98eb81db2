"""What bounds int4 decode on this CPU: ONNX Runtime's MatMulNBits alone, at one row, over a
stack of a 0.6B decoder's linear layers (Qwen3-0.6B's and Qwen3-TTS 0.6B's talker shapes: 28
layers of qkv 1024x4096, o 2048x1024, gate_up 1024x6144, down 3072x1024, each weight its own,
275 MB at group 32, nothing cached between calls), for each group size, accuracy level and
thread count, beside the read bandwidth probed in the same run (bench/llm_decode_cpu.py's
probes, before and after).

A decode step of an int4 engine cannot read its weights faster than this kernel does; the
fraction of the bandwidth bound it reaches is the ceiling of the step's.

``--openvino PYTHON``: the same models run by OpenVINO's CPU plugin too (its ONNX reader takes
com.microsoft::MatMulNBits), in PYTHON, an interpreter with ``openvino`` installed (it is no
dependency of edgeomni's): the alternative kernel a user could install, measured beside.

    python bench/nbits_cpu.py [--group-sizes 32,128] [--levels 0,4] [--threads 1,2]
        [--repeats 15] [--openvino PYTHON] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from llm_decode_cpu import read_bandwidth_gbs  # noqa: E402

SHAPES = ((1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024))  # (K, N) of a layer
LAYERS = 28


def stack(block: int, level: int) -> tuple[bytes, int]:
    """The model (every layer's four MatMulNBits, random codes and scales) and its weight bytes."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, total = [], [], 0
    for layer in range(LAYERS):
        for j, (k, n) in enumerate(SHAPES):
            codes = rng.integers(0, 255, (n, k // block, block // 2), dtype=np.uint8)
            scales = (rng.random(n * (k // block), dtype=np.float32) * 0.01).astype(np.float32)
            name = f"w{layer}_{j}"
            inits += [numpy_helper.from_array(codes, name), numpy_helper.from_array(scales, name + "_s")]
            total += codes.nbytes + scales.nbytes
            nodes.append(helper.make_node(
                "MatMulNBits", [f"x{k}", name, name + "_s"], [f"y{layer}_{j}"],
                domain="com.microsoft", K=k, N=n, bits=4, block_size=block, accuracy_level=level))  # fmt: skip
    widths = sorted({k for k, _ in SHAPES})
    graph = helper.make_graph(
        nodes, "nbits",
        [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, k]) for k in widths],
        [helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None) for n in nodes],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])  # fmt: skip
    return model.SerializeToString(), total


def timed(model: bytes, threads: int, repeats: int) -> float:
    """The best of ``repeats`` runs (seconds), after three warm-up runs."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.random.default_rng(1).standard_normal(i.shape).astype(np.float32)
             for i in sess.get_inputs()}  # fmt: skip
    for _ in range(3):
        sess.run(None, feeds)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        sess.run(None, feeds)
        best = min(best, time.perf_counter() - start)
    return best


OPENVINO = """
import sys, time, json, numpy as np, openvino as ov
path, threads, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
core = ov.Core()
model = core.compile_model(core.read_model(path), "CPU",
                           {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"})
req = model.create_infer_request()
feeds = {p.get_any_name(): np.random.default_rng(1).standard_normal(
    [d.get_length() for d in p.get_partial_shape()]).astype(np.float32) for p in model.inputs}
for _ in range(3):
    req.infer(feeds)
best = float("inf")
for _ in range(repeats):
    start = time.perf_counter(); req.infer(feeds); best = min(best, time.perf_counter() - start)
print(json.dumps({"seconds": best, "openvino": ov.__version__}))
"""


def openvino_seconds(python: str, model: bytes, threads: int, repeats: int) -> dict[str, Any]:
    """The best run of ``model`` under OpenVINO's CPU plugin, in ``python``'s process."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "nbits.onnx"
        path.write_bytes(model)
        out = subprocess.run([python, "-c", OPENVINO, str(path), str(threads), str(repeats)],
                             capture_output=True, text=True, check=False)  # fmt: skip
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--group-sizes", default="32,128")
    p.add_argument("--levels", default="0,4", help="MatMulNBits accuracy levels")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--openvino", metavar="PYTHON", help="an interpreter with openvino")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    import onnxruntime

    probes = [read_bandwidth_gbs() for _ in range(2)]
    rows: list[dict[str, Any]] = []
    for block in (int(x) for x in args.group_sizes.split(",")):
        for level in (int(x) for x in args.levels.split(",")):
            model, total = stack(block, level)
            for threads in (int(x) for x in args.threads.split(",")):
                seconds = timed(model, threads, args.repeats)
                rows.append({"runtime": "onnxruntime", "group_size": block,
                             "accuracy_level": level, "threads": threads,
                             "weight_mb": round(total / 1e6, 1), "ms": round(seconds * 1e3, 2),
                             "gbs": round(total / seconds / 1e9, 1)})  # fmt: skip
                print(rows[-1], file=sys.stderr, flush=True)
                if args.openvino and level == 0:  # OpenVINO picks its own compute precision
                    got = openvino_seconds(args.openvino, model, threads, args.repeats)
                    row = {**rows[-1], "runtime": "openvino", "accuracy_level": None}
                    if "error" in got:
                        row.update(ms=None, gbs=None, error=got["error"])
                    else:
                        row.update(ms=round(got["seconds"] * 1e3, 2), version=got["openvino"],
                                   gbs=round(total / got["seconds"] / 1e9, 1))  # fmt: skip
                    rows.append(row)
                    print(rows[-1], file=sys.stderr, flush=True)
    probes += [read_bandwidth_gbs() for _ in range(2)]
    best = max(max(x.values()) for x in probes)
    for r in rows:
        r["of_bandwidth"] = round(r["gbs"] / best, 3) if r["gbs"] else None
    result = {"date": time.strftime("%Y-%m-%d"), "onnxruntime": onnxruntime.__version__,
              "best_read_bandwidth_gbs": round(best, 2),
              "bandwidth_probes_gbs": [{k: round(v, 1) for k, v in x.items()} for x in probes],
              "rows": rows}  # fmt: skip
    print(json.dumps(result, indent=2))
    print("\n| runtime | group | accuracy level | threads | ms (28 layers) | GB/s | of the bandwidth |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        share = f"{r['of_bandwidth']:.1%}" if r["of_bandwidth"] else r.get("error", "-")
        print(f"| {r['runtime']} | {r['group_size']} | {r['accuracy_level'] if r['accuracy_level'] is not None else '-'} | "
              f"{r['threads']} | {r['ms']} | {r['gbs']} | {share} |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
