"""The stateful vocoder (code2wav's step engine) on this CPU beside its compute bound.

Runs a built engine's ``code2wav_stream`` alone, one row, a chunk of ``--frames`` new frames
from a zero state (the runtime's chunks: 2 first, then doubling to 25), and counts what one
call computes from ONNX Runtime's own profile of it: each Conv's, ConvTranspose's, MatMul's
and Gemm's multiply-adds from the shapes it ran with (its output's size times its weight's
inputs per output). The bound is those FLOPs at the machine's measured fp32 peak: an ONNX
Runtime MatMul of 2048 x 2048 x 2048 with the same threads, in the same run. Convolutions are
most of the vocoder's time (docs/benchmarks.md), and compute, not bytes, bounds them: their
weights are read once a call, their activations many times.

    python bench/vocoder_cpu.py --engine ENG [--frames 2,25] [--threads 2] [--repeats 5]
        [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

COMPUTE = ("Conv", "ConvTranspose", "MatMul", "Gemm", "FusedConv", "FusedMatMul")


def session(path: Path, threads: int, profile: str | None = None, spin: bool = True) -> Any:
    """An ONNX Runtime CPU session as the runtime opens one (``spin`` False: its threads do
    not spin between calls, as for engines that take turns)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # the runtime's
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile:
        so.enable_profiling = True
        so.profile_file_prefix = profile
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def feeds(sess: Any, frames: int, groups: int) -> dict[str, np.ndarray]:
    """Random codes for one row, the state zeroed (a stream's start)."""
    rng = np.random.default_rng(0)
    out: dict[str, np.ndarray] = {}
    for i in sess.get_inputs():
        if i.name == "codes":
            out[i.name] = rng.integers(0, 1024, (1, groups, frames)).astype(np.int64)
        elif i.name == "chunk_lens":
            out[i.name] = np.array([frames], np.int64)
        else:
            shape = [d if isinstance(d, int) else 1 for d in i.shape]
            dtype = np.float32 if "float" in i.type else np.int64
            out[i.name] = np.zeros(shape, dtype)
    return out


def weight_dims(path: Path) -> dict[str, list[int]]:
    """Each compute node's weight shape, by node name (a profile's shapes leave initializers
    out)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    dims = {t.name: list(t.dims) for t in graph.initializer}
    return {n.name: dims[n.input[1]] for n in graph.node
            if n.op_type in COMPUTE and len(n.input) > 1 and n.input[1] in dims}  # fmt: skip


def macs(event: dict[str, Any], weights: dict[str, list[int]]) -> int:
    """Multiply-adds of one compute node: output elements times the weight's inputs per output
    (a convolution's in-channels / groups x kernel; a MatMul's K), from the shapes it ran with
    and its weight's."""
    args = event["args"]
    ins = [next(iter(x.values())) for x in args["input_type_shape"]]
    out = next(iter(args["output_type_shape"][0].values()))
    op = args["op_name"]
    w = weights.get(event["name"].removesuffix("_kernel_time"))
    if op in ("Conv", "FusedConv") and w:  # weight [O, I/g, k...]
        return int(np.prod(out)) * int(np.prod(w[1:]))
    if op == "ConvTranspose" and w:  # weight [I, O/g, k...]: each input feeds O/g x k outputs
        return int(np.prod(ins[0])) * int(np.prod(w[1:]))
    if op in ("MatMul", "Gemm", "FusedMatMul"):  # K: A's last axis
        return int(np.prod(out)) * int(ins[0][-1])
    raise ValueError(f"no weight shape for {op} node {event['name']}")


def profiled(path: Path, threads: int, frames: int, groups: int) -> dict[str, Any]:
    """One call's multiply-adds by op type and its kernels' time, from a profiled run."""
    with tempfile.TemporaryDirectory() as tmp:
        sess = session(path, threads, str(Path(tmp) / "prof"))
        f = feeds(sess, frames, groups)
        sess.run(None, f)  # the first run sets up; the second is the one counted
        sess.run(None, f)
        events = json.loads(Path(sess.end_profiling()).read_text())
    weights = weight_dims(path)
    work: Counter[str] = Counter()
    spent: Counter[str] = Counter()
    last = max(e["ts"] for e in events if e.get("name") == "model_run")
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or e["ts"] < last:
            continue
        op = e["args"]["op_name"]
        spent[op] += e["dur"]
        if op in COMPUTE:
            work[op] += macs(e, weights)
    return {"macs": dict(work), "kernel_us": dict(spent)}


def peak_gflops(threads: int) -> float:
    """fp32 GFLOP/s of a 2048^3 ONNX Runtime MatMul (the best of 5)."""
    from onnx import TensorProto, helper

    n = 2048
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], "mm",
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in ("a", "b")],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    sess.run(None, {"a": a, "b": a})
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        sess.run(None, {"a": a, "b": a})
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--engine", type=Path, required=True, help="an engine dir with code2wav_stream/")
    p.add_argument("--frames", default="2,25", help="chunk sizes (new frames a call)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    folder = args.engine / "code2wav_stream"
    cfg = json.loads((folder / "config.json").read_text())
    path = folder / cfg["engine"]
    groups = int(cfg.get("num_quantizers", 16))

    peaks = [peak_gflops(args.threads)]
    sess = session(path, args.threads)
    rows = []
    for frames in (int(x) for x in args.frames.split(",")):
        f = feeds(sess, frames, groups)
        for _ in range(2):
            sess.run(None, f)
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            sess.run(None, f)
            best = min(best, time.perf_counter() - start)
        prof = profiled(path, args.threads, frames, groups)
        flops = 2 * sum(prof["macs"].values())
        rows.append({"frames": frames, "ms": round(best * 1e3, 2),
                     "ms_per_frame": round(best * 1e3 / frames, 2),
                     "gflop_per_frame": round(flops / frames / 1e9, 3),
                     "gflops": round(flops / best / 1e9, 1), "macs_by_op": prof["macs"],
                     "kernel_ms_by_op": {k: round(v / 1e3, 2) for k, v in
                                         sorted(prof["kernel_us"].items(), key=lambda kv: -kv[1])}})  # fmt: skip
        print(rows[-1], file=sys.stderr, flush=True)
    peaks.append(peak_gflops(args.threads))
    peak = max(peaks)
    for r in rows:
        r["of_peak"] = round(r["gflops"] / peak, 3)
        r["bound_ms_per_frame"] = round(r["gflop_per_frame"] / peak * 1e3, 2)
    result = {"date": time.strftime("%Y-%m-%d"), "engine": str(args.engine),
              "threads": args.threads, "peak_gflops": round(peak, 1),
              "peak_probes_gflops": [round(x, 1) for x in peaks], "rows": rows}  # fmt: skip
    print(json.dumps(result, indent=2))
    print("\n| chunk frames | ms a call | ms a frame | GFLOP a frame | its bound, ms a frame | "
          "GFLOP/s | of the peak |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['frames']} | {r['ms']} | {r['ms_per_frame']} | {r['gflop_per_frame']} | "
              f"{r['bound_ms_per_frame']} | {r['gflops']} | {r['of_peak']:.1%} |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
