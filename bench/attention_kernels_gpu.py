"""edgeomni's CUDA C attention kernel (plugins/attention_cuda.py, the TensorRT plugin's kernel)
against ONNX Runtime's com.microsoft::GroupQueryAttention on the CUDA provider, at Qwen3-Omni's
attention shapes, in one run.

The ONNX Runtime side is what edgeomni's CUDA engines run: a one-node model holding the
edgeomni::CachedAttention op, lowered by edgeomni's own ONNX Runtime CUDA lowering (host-fed
``gqa_seqlens_k``/``gqa_total_length``), opened as an OrtEngine and bound through IOBinding with
the cache in place on the device, as runtime/engine.py does. Both sides run on the runtime's one
stream (runtime/memory.stream()) on the same inputs.

Times, per shape (float16, head size 128):
- device time: CUDA events around one call, after a spin kernel that keeps the GPU busy while
  the host queues the call, so the host's share (ORT's session overhead, Python's launch) is
  hidden; a warning says when queuing took longer than the spin;
- wall time: one call and a stream synchronisation, as a caller waits for it (ORT's host work
  included; the kernel's from Python here, which a TensorRT plugin does not pay).
The kernel is timed at each heads-per-block value its GQA group allows (a compile-time choice);
``ours`` is the default, ``best`` the fastest. The outputs are compared (max abs diff against
ORT, and against plugins.attention.reference on the first row), and the caches bit for bit.

    PYTHONPATH=... python3 bench/attention_kernels_gpu.py --out attention_kernels.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# (name, query heads, kv heads, capacity for decode)
MODELS = {
    "thinker": (32, 4, 4096),
    "talker": (16, 2, 4096),
    "code_predictor": (16, 8, 256),
}
HEAD_DIM = 128
DECODE_BATCHES = (1, 8, 32)
PREFILL_SEQ = 512

SPIN_SOURCE = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""


def cuda_check(result: Any, what: str) -> Any:
    """A cuda.bindings runtime call's value, or an error naming it."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err}")
    return rest[0] if len(rest) == 1 else (rest or None)


class Gpu:
    """The primary context (shared by ONNX Runtime, the runtime API and the driver API), the
    runtime's stream, events, and the spin kernel."""

    def __init__(self) -> None:
        from cuda.bindings import driver as cu
        from cuda.bindings import runtime as cudart

        from edgeomni.plugins import attention_cuda as ac
        from edgeomni.runtime.memory import stream

        self.cu, self.cudart, self.ac = cu, cudart, ac
        self.stream = stream()  # creates the primary context through the runtime API
        ac.check(cu.cuInit(0), "cuInit")
        device = ac.check(cu.cuDeviceGet(0), "cuDeviceGet")
        ac.check(cu.cuCtxSetCurrent(ac.check(cu.cuDevicePrimaryCtxRetain(device), "retain")),
                 "cuCtxSetCurrent")  # fmt: skip
        props = cuda_check(cudart.cudaGetDeviceProperties(0), "cudaGetDeviceProperties")
        self.name = props.name.decode(errors="replace").rstrip("\x00")
        self.arch = f"sm_{props.major}{props.minor}"
        self.driver = cuda_check(cudart.cudaDriverGetVersion(), "cudaDriverGetVersion")
        module = ac.check(cu.cuModuleLoadData(ac.compile_cubin(SPIN_SOURCE, self.arch)), "load")
        self.spin_fn = ac.check(cu.cuModuleGetFunction(module, b"spin"), "cuModuleGetFunction")
        self.start = cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")
        self.end = cuda_check(cudart.cudaEventCreate(), "cudaEventCreate")

    def sync(self) -> None:
        cuda_check(self.cudart.cudaStreamSynchronize(self.stream), "cudaStreamSynchronize")

    def spin(self, us: float) -> None:
        import ctypes

        ns = ctypes.c_uint64(int(us * 1000))
        args = (ctypes.c_void_p * 1)(ctypes.addressof(ns))
        self.ac.check(self.cu.cuLaunchKernel(self.spin_fn, 1, 1, 1, 1, 1, 1, 0, self.stream,
                                             ctypes.addressof(args), 0), "spin")  # fmt: skip

    def time(self, call: Callable[[], None], iters: int, warmup: int, spin_us: float) -> dict:
        """Device and wall microseconds per call (medians), and the host's queuing time."""
        cudart = self.cudart
        for _ in range(warmup):
            call()
        self.sync()
        device, queue, wall = [], [], []
        for _ in range(iters):
            self.spin(spin_us)
            cuda_check(cudart.cudaEventRecord(self.start, self.stream), "cudaEventRecord")
            t0 = time.perf_counter()
            call()
            queue.append((time.perf_counter() - t0) * 1e6)
            cuda_check(cudart.cudaEventRecord(self.end, self.stream), "cudaEventRecord")
            cuda_check(cudart.cudaEventSynchronize(self.end), "cudaEventSynchronize")
            ms = cuda_check(cudart.cudaEventElapsedTime(self.start, self.end), "elapsed")
            device.append(ms * 1000)
        for _ in range(iters):
            t0 = time.perf_counter()
            call()
            self.sync()
            wall.append((time.perf_counter() - t0) * 1e6)
        result = {
            "device_us": round(statistics.median(device), 2),
            "wall_us": round(statistics.median(wall), 2),
            "queue_us": round(statistics.median(queue), 2),
        }
        if result["queue_us"] > 0.8 * spin_us:
            print(f"  warning: queuing took {result['queue_us']} us, the spin {spin_us} us: "
                  "device time includes host time (raise --spin-us)", flush=True)  # fmt: skip
        return result


def ort_engine(hq: int, hkv: int, work: Path, device: str = "cuda") -> tuple[Any, dict]:
    """A one-node CachedAttention model lowered by edgeomni's CUDA lowering, as an OrtEngine
    (and the lowering's options)."""
    import onnx
    from onnx import TensorProto, helper

    from edgeomni.builder.onnxruntime import cuda_lowering
    from edgeomni.plugins import lower_model
    from edgeomni.plugins.attention import DOMAIN, OP_TYPE
    from edgeomni.runtime.engine import OrtEngine

    f16, i32 = TensorProto.FLOAT16, TensorProto.INT32
    inputs = [
        helper.make_tensor_value_info("q", f16, ["batch", "seq", hq * HEAD_DIM]),
        helper.make_tensor_value_info("k", f16, ["batch", "seq", hkv * HEAD_DIM]),
        helper.make_tensor_value_info("v", f16, ["batch", "seq", hkv * HEAD_DIM]),
        helper.make_tensor_value_info("past_key", f16, ["batch", hkv, "capacity", HEAD_DIM]),
        helper.make_tensor_value_info("past_value", f16, ["batch", hkv, "capacity", HEAD_DIM]),
        helper.make_tensor_value_info("past_lens", i32, ["batch"]),
        helper.make_tensor_value_info("query_lens", i32, ["batch"]),
    ]
    outputs = [
        helper.make_tensor_value_info("out", f16, ["batch", "seq", hq * HEAD_DIM]),
        helper.make_tensor_value_info("present_key", f16, ["batch", hkv, "capacity", HEAD_DIM]),
        helper.make_tensor_value_info("present_value", f16, ["batch", hkv, "capacity", HEAD_DIM]),
    ]
    node = helper.make_node(
        OP_TYPE, [i.name for i in inputs], [o.name for o in outputs], name="attention",
        domain=DOMAIN, num_heads=hq, kv_num_heads=hkv,
    )  # fmt: skip
    graph = helper.make_graph([node], "attention", inputs, outputs)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(DOMAIN, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    options = cuda_lowering(model)
    # cuda_lowering reads the float type off the weights; this one-node model has none, and a
    # float16 decoder's attention lowers to GroupQueryAttention
    options["plain_attention"] = False
    lower_model(model, "onnxruntime", options)
    ops = [n.op_type for n in model.graph.node]
    assert "GroupQueryAttention" in ops, ops
    path = work / f"gqa_{hq}_{hkv}.onnx"
    onnx.save(model, str(path))
    return OrtEngine(path, device=device), options


def run_shape(gpu: Gpu, model: str, hq: int, hkv: int, batch: int, seq: int, capacity: int,
              engine: Any, args: argparse.Namespace, kernels: dict) -> dict:  # fmt: skip
    from edgeomni.plugins import attention_cuda as ac
    from edgeomni.plugins.attention import reference
    from edgeomni.runtime.memory import DeviceArray

    rng = np.random.default_rng(batch * 1000 + seq)
    decode = seq == 1
    # decode: pasts around C/2, a little ragged; prefill: an empty cache
    past = np.array([capacity // 2 - 3 * b if decode else 0 for b in range(batch)], np.int32)
    fresh = np.full(batch, seq, np.int32)
    host = {
        "q": rng.standard_normal((batch, seq, hq * HEAD_DIM)).astype(np.float16),
        "k": rng.standard_normal((batch, seq, hkv * HEAD_DIM)).astype(np.float16),
        "v": rng.standard_normal((batch, seq, hkv * HEAD_DIM)).astype(np.float16),
    }
    cache_shape = (batch, hkv, capacity, HEAD_DIM)
    cache_k = rng.standard_normal(cache_shape).astype(np.float16)
    cache_v = rng.standard_normal(cache_shape).astype(np.float16)
    dev = {n: DeviceArray.zeros(a.shape, a.dtype) for n, a in host.items()}
    for n, a in host.items():
        dev[n].upload(a)
    lens = {"past_lens": DeviceArray.zeros((batch,), np.int32),
            "query_lens": DeviceArray.zeros((batch,), np.int32)}  # fmt: skip
    lens["past_lens"].upload(past)
    lens["query_lens"].upload(fresh)
    sides = {}
    for side in ("ort", "ours"):
        sides[side] = {
            "key": DeviceArray.zeros(cache_shape, np.float16),
            "value": DeviceArray.zeros(cache_shape, np.float16),
            "out": DeviceArray.zeros(host["q"].shape, np.float16),
        }

    def reset() -> None:
        for bufs in sides.values():
            bufs["key"].upload(cache_k)
            bufs["value"].upload(cache_v)

    # ONNX Runtime: the engine's binding, the cache bound in place, lengths fed from the host
    ort = sides["ort"]
    binding = engine.binding()
    for n in ("q", "k", "v"):
        binding.bind_input(n, dev[n])
    capacity = int(ort["key"].shape[2])  # [B, Hkv, capacity, D]
    binding.bind_in_place("past_key", "present_key", ort["key"], capacity)
    binding.bind_in_place("past_value", "present_value", ort["value"], capacity)
    binding.bind_output("out", ort["out"])
    # the binding derives GroupQueryAttention's own length inputs from these
    feeds = {"past_lens": past, "query_lens": fresh}

    def call_ort() -> None:
        binding.run(feeds, wait=False)

    ours = sides["ours"]

    def call_ours(kernel: ac.CudaAttention) -> Callable[[], None]:
        def call() -> None:
            kernel.launch(
                dev["q"].ptr, dev["k"].ptr, dev["v"].ptr, ours["key"].ptr, ours["value"].ptr,
                lens["past_lens"].ptr, lens["query_lens"].ptr, ours["out"].ptr,
                batch=batch, seq=seq, capacity=capacity, stream=gpu.stream,
            )  # fmt: skip

        return call

    # agreement: one call each from the same cache
    reset()
    gpu.sync()
    call_ort()
    default = kernels[(hq, hkv, 0)]
    call_ours(default)()
    gpu.sync()
    out_ort, out_ours = ort["out"].download(), ours["out"].download()
    diff = float(np.abs(out_ort.astype(np.float32) - out_ours.astype(np.float32)).max())
    cache_equal = all(
        np.array_equal(ort[n].download().view(np.uint16), ours[n].download().view(np.uint16))
        for n in ("key", "value")
    )
    ref, _, _ = reference(
        *(host[n][:1].astype(np.float64) for n in ("q", "k", "v")),
        cache_k[:1].astype(np.float64), cache_v[:1].astype(np.float64), past[:1], fresh[:1],
        num_heads=hq, kv_num_heads=hkv,
    )  # fmt: skip
    diff_ref = float(np.abs(out_ours[:1].astype(np.float64) - ref).max())
    diff_ort_ref = float(np.abs(out_ort[:1].astype(np.float64) - ref).max())

    row: dict[str, Any] = {
        "model": model, "heads": hq, "kv_heads": hkv, "batch": batch, "seq": seq,
        "capacity": capacity, "past": int(past.max()),
        "max_abs_diff_vs_ort": diff, "max_abs_diff_vs_reference_row0": diff_ref,
        "ort_max_abs_diff_vs_reference_row0": diff_ort_ref, "cache_equal": cache_equal,
    }  # fmt: skip
    timing = {"ort": gpu.time(call_ort, args.iters, args.warmup, args.spin_us)}
    for (h, kv, hb), kernel in kernels.items():
        if (h, kv) == (hq, hkv):
            timing[f"hb{kernel.config.block_heads}" + ("*" if hb == 0 else "")] = gpu.time(
                call_ours(kernel), args.iters, args.warmup, args.spin_us
            )
    reset()
    row["timing"] = timing
    mine = {k: v for k, v in timing.items() if k != "ort"}
    row["ours_default"] = next(v for k, v in mine.items() if k.endswith("*"))
    best_key = min(mine, key=lambda k: mine[k]["device_us"])
    row["best_heads_per_block"] = int(best_key.strip("hb*"))
    row["ours_best"] = mine[best_key]
    row["ort"] = timing["ort"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument(
        "--spin-us",
        type=float,
        default=300.0,
        help="GPU busy time queued before each timed call, hiding host time",
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=list(DECODE_BATCHES))
    parser.add_argument("--prefill", type=int, default=PREFILL_SEQ,
                        help="prefill length (B=1, empty cache; 0: none)")  # fmt: skip
    parser.add_argument("--heads-per-block", nargs="+", type=int, default=[1, 2, 4, 8],
                        help="kernel variants to time besides the default")  # fmt: skip
    args = parser.parse_args(argv)

    import onnxruntime

    from edgeomni.plugins import attention_cuda as ac

    gpu = Gpu()
    print(f"GPU {gpu.name} ({gpu.arch}), driver {gpu.driver}, onnxruntime "
          f"{onnxruntime.__version__}", flush=True)  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            hq, hkv, capacity = MODELS[model]
            engine, options = ort_engine(hq, hkv, Path(tmp))
            default_hb = ac.default_heads_per_block(hq // hkv)
            kernels: dict[tuple[int, int, int], ac.CudaAttention] = {}
            for hb in [0, *args.heads_per_block]:
                if hb and ((hq // hkv) % hb or hb == default_hb):
                    continue  # not a divisor of the group, or the default again
                cfg = ac.KernelConfig(hq, hkv, HEAD_DIM, "float16", heads_per_block=hb)
                kernels[(hq, hkv, hb)] = ac.CudaAttention(cfg)
            regs = {k[2]: v.registers() for k, v in kernels.items()}
            shapes = [(b, 1, capacity) for b in args.batches]
            if args.prefill:
                shapes.append((1, min(args.prefill, capacity), capacity))
            for batch, seq, cap in shapes:
                print(f"{model} {hq}/{hkv} B={batch} S={seq} C={cap} ...", flush=True)
                row = run_shape(gpu, model, hq, hkv, batch, seq, cap, engine, args, kernels)
                row["registers"] = regs
                row["lowering"] = {k: v for k, v in options.items() if k != "onnxruntime"}
                rows.append(row)
                print(f"  ort {row['ort']['device_us']} us, ours {row['ours_default']['device_us']}"
                      f" us (best hb{row['best_heads_per_block']}: "
                      f"{row['ours_best']['device_us']} us); max |ours - ort| "
                      f"{row['max_abs_diff_vs_ort']:.2e}, cache equal {row['cache_equal']}",
                      flush=True)  # fmt: skip
            for kernel in kernels.values():
                kernel.close()

    header = (f"{'model':<15}{'B':>4}{'S':>5}{'C':>6} | {'ORT dev':>8}{'ours dev':>9}{'best':>11}"
              f"{'ours/ORT':>9} | {'ORT wall':>9}{'ours wall':>10} | {'|diff|':>8} cache")  # fmt: skip
    print("\n" + header + "\n" + "-" * len(header))
    for r in rows:
        ratio = r["ours_default"]["device_us"] / r["ort"]["device_us"]
        best = f"{r['ours_best']['device_us']:.1f}/hb{r['best_heads_per_block']}"
        print(f"{r['model']:<15}{r['batch']:>4}{r['seq']:>5}{r['capacity']:>6} | "
              f"{r['ort']['device_us']:>8.1f}{r['ours_default']['device_us']:>9.1f}{best:>11}"
              f"{ratio:>9.2f} | {r['ort']['wall_us']:>9.1f}{r['ours_default']['wall_us']:>10.1f} | "
              f"{r['max_abs_diff_vs_ort']:>8.1e} {'ok' if r['cache_equal'] else 'DIFF'}")  # fmt: skip
    print("device: CUDA events, host hidden by a spin kernel (microseconds, medians); "
          "ours/ORT < 1: the kernel is faster. hb: heads per block.")  # fmt: skip
    result = {
        "gpu": gpu.name, "arch": gpu.arch, "driver": gpu.driver,
        "onnxruntime": onnxruntime.__version__, "python": platform.python_version(),
        "iters": args.iters, "spin_us": args.spin_us, "head_dim": HEAD_DIM, "dtype": "float16",
        "rows": rows,
    }  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    bad = [r for r in rows if not r["cache_equal"] or r["max_abs_diff_vs_ort"] > 2e-2]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
