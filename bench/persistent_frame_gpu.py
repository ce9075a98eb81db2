"""What one persistent kernel a code-predictor frame could gain over a kernel a phase: a probe,
not the product (issue 55). Run it on the GPU machine:

    python bench/persistent_frame_gpu.py [--repeats 20] [--out DIR]

A frame of Qwen3-TTS 0.6B's code predictor at one row, reduced to what bounds it: 15 steps, each
5 layers of matrix-vector phases at its dimensions (qkv with the input norm, the attention
stood in for by a copy of q, o plus the residual, gate_up with the norm and SwiGLU, down plus
the residual), the step's head, and an argmax whose code's embedding is the next step's input:
27 dependent phases a step, 405 a frame, 2.42 GB of float16 weights streamed from HBM. The
same phases run three ways, from the same inputs:

- ``kernels``: a kernel a phase, each asking L2 for its own weights and then waiting for the
  one before (programmatic dependent launch), in one CUDA graph: how the fused engine runs;
- ``persistent``: one kernel of one block an SM (resident together) walking all 405 phases,
  a grid-wide barrier (an atomic count and generation in global memory) between phases;
- ``persistent+N``: the same, each block asking L2 for its share of the weights of the phase N
  ahead before it waits at the barrier, so that the barriers overlap the stream; ``2 an SM``:
  two blocks an SM (where they fit), twice the loads in flight.

Each prints its ms a frame, its fraction of the HBM bound (the weights over the measured copy
bandwidth), and the codes it drew and its last logits, which must equal the kernels' (the same
sums in the same order). ``barrier``: a kernel of 405 barriers and nothing else.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backend_pair import copy_bandwidth_gbs  # noqa: E402
from persistent_cuda import GRID_BARRIER  # noqa: E402

H, QKV, ATTN, INTER, VOCAB, LAYERS, STEPS = 1024, 4096, 2048, 3072, 2048, 5, 15
PHASES = 5 * LAYERS + 2  # a step's: 5 a layer, the head, the argmax and embedding
THREADS, WARPS = 256, 8

SOURCE = r"""
typedef unsigned short half_t;
#define THREADS 256
#define WARPS 8
#ifndef PROBE_HOST
__device__ __forceinline__ float h2f(half_t h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
#define GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define GRID_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" :::)
#define L2_PREFETCH(p, n) \
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(n) : "memory")
#define PK_PAUSE() __nanosleep(20)
#define LDCG(p) __ldcg(p)  // past L1: other blocks rewrote it since this SM last read it
#else
#define LDCG(p) (*(p))
#define GRID_WAIT()
#define GRID_LAUNCH()
#define L2_PREFETCH(p, n)
#define PK_PAUSE()
#endif

struct Frame {
    const half_t *wqkv, *wo, *wgu, *wd, *heads, *tables;  // [L, N, K] each; [STEPS, V, H]
    const float *norms, *final_norm;  // [L, 2, H], [H]
    float *h, *qkv, *attn, *act, *logits;
    int* ids;
    unsigned* bar;  // count, generation
    int H, QKV, A, I, V, L;
    float eps;
};

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// 1 / rms(h), the same sum in every block
__device__ float block_rms(const float* h, int n, float eps) {
    __shared__ float part[WARPS];
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += THREADS) { const float v = LDCG(h + i); s += v * v; }
    s = warp_sum(s);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < WARPS; ++w) t += part[w];
    __syncthreads();
    return 1.f / sqrtf(t / (float)n + eps);
}

// out[c] (= or +=) for the columns of this block's warps (c = vb * WARPS + warp, strided by the
// phase's blocks): W[c] . x (x times nw and scale where nw); with up: silu(gate) * (up . x)
__device__ void gemv(const half_t* W, const half_t* up, int K, int N, const float* x,
                     const float* nw, float scale, float* out, bool add, int vb, int nb) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int c = vb * WARPS + warp; c < N; c += nb * WARPS) {
        const half_t* row = W + (long long)c * K;
        const half_t* urow = up ? up + (long long)c * K : nullptr;
        float acc = 0.f, accu = 0.f;
#pragma unroll 4
        for (int k = lane * 8; k < K; k += 256) {
            uint4 wv = *reinterpret_cast<const uint4*>(row + k);
            uint4 uv = urow ? *reinterpret_cast<const uint4*>(urow + k) : wv;
            const half_t* we = reinterpret_cast<const half_t*>(&wv);
            const half_t* ue = reinterpret_cast<const half_t*>(&uv);
            const float4 x0 = LDCG(reinterpret_cast<const float4*>(x + k));
            const float4 x1 = LDCG(reinterpret_cast<const float4*>(x + k + 4));
            const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            for (int i = 0; i < 8; ++i) {
                const float xv = nw ? xs[i] * nw[k + i] * scale : xs[i];
                acc += xv * h2f(we[i]);
                if (urow) accu += xv * h2f(ue[i]);
            }
        }
        acc = warp_sum(acc);
        if (urow) accu = warp_sum(accu);
        if (lane == 0) {
            const float v = urow ? acc / (1.f + expf(-acc)) * accu : acc;
            out[c] = add ? LDCG(out + c) + v : v;
        }
    }
}

// the matrix phase p of a step reads: its weights, K, N (0: not a matrix phase)
__device__ const half_t* phase_matrix(const Frame& f, int step, int p, int* K, int* N,
                                      const half_t** up) {
    *up = nullptr;
    if (p == 5 * f.L) { *K = f.H; *N = f.V; return f.heads + (long long)step * f.V * f.H; }
    if (p > 5 * f.L) { *K = *N = 0; return nullptr; }
    const int l = p / 5, kind = p % 5;
    switch (kind) {
        case 0: *K = f.H; *N = f.QKV; return f.wqkv + (long long)l * f.QKV * f.H;
        case 2: *K = f.A; *N = f.H; return f.wo + (long long)l * f.H * f.A;
        case 3: {
            const half_t* w = f.wgu + (long long)l * 2 * f.I * f.H;
            *K = f.H; *N = f.I; *up = w + (long long)f.I * f.H; return w;
        }
        case 4: *K = f.I; *N = f.H; return f.wd + (long long)l * f.H * f.I;
        default: *K = *N = 0; return nullptr;
    }
}

// this block's rows of phase p's weights asked of L2 (rows of WARPS consecutive columns)
__device__ void prefetch_phase(const Frame& f, int step, int p, int vb, int nb) {
    if (threadIdx.x != 0) return;
    int K, N;
    const half_t* up;
    const half_t* w = phase_matrix(f, step, p, &K, &N, &up);
    if (!w) return;
    for (int c = vb * WARPS; c < N; c += nb * WARPS) {
        const int rows = N - c < WARPS ? N - c : WARPS;
        const unsigned bytes = (unsigned)rows * K * 2u;
        L2_PREFETCH(w + (long long)c * K, bytes);
        if (up) L2_PREFETCH(up + (long long)c * K, bytes);
    }
}

__device__ void phase(const Frame& f, int step, int p, int vb, int nb) {
    const int tid = vb * THREADS + threadIdx.x, all = nb * THREADS;
    if (p > 5 * f.L) {  // the argmax of the logits (every block), its code's embedding
        __shared__ float best[WARPS];
        __shared__ int at[WARPS];
        float v = -3.4e38f;
        int id = 0;
        for (int i = threadIdx.x; i < f.V; i += THREADS) {
            const float l = LDCG(f.logits + i);
            if (l > v) { v = l; id = i; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, v, o);
            const int oi = __shfl_xor_sync(0xffffffffu, id, o);
            if (ov > v || (ov == v && oi < id)) { v = ov; id = oi; }
        }
        if ((threadIdx.x & 31) == 0) { best[threadIdx.x >> 5] = v; at[threadIdx.x >> 5] = id; }
        __syncthreads();
        v = best[0]; id = at[0];
        for (int w = 1; w < WARPS; ++w)
            if (best[w] > v || (best[w] == v && at[w] < id)) { v = best[w]; id = at[w]; }
        const half_t* e = f.tables + ((long long)step * f.V + id) * f.H;
        for (int i = tid; i < f.H; i += all) f.h[i] = h2f(e[i]);
        if (tid == 0) f.ids[step] = id;
        return;
    }
    if (p == 5 * f.L) {  // the head, of the final norm
        gemv(f.heads + (long long)step * f.V * f.H, nullptr, f.H, f.V, f.h, f.final_norm,
             block_rms(f.h, f.H, f.eps), f.logits, false, vb, nb);
        return;
    }
    const int l = p / 5, kind = p % 5;
    const float* nw = f.norms + (long long)l * 2 * f.H;
    int K, N;
    const half_t* up;
    const half_t* w = phase_matrix(f, step, p, &K, &N, &up);
    switch (kind) {
        case 0: gemv(w, nullptr, K, N, f.h, nw, block_rms(f.h, f.H, f.eps), f.qkv, false, vb, nb);
                break;
        case 1: for (int i = tid; i < f.A; i += all) f.attn[i] = LDCG(f.qkv + i);  // attention's
                break;
        case 2: gemv(w, nullptr, K, N, f.attn, nullptr, 1.f, f.h, true, vb, nb); break;
        case 3: gemv(w, up, K, N, f.h, nw + f.H, block_rms(f.h, f.H, f.eps), f.act, false, vb, nb);
                break;
        default: gemv(w, nullptr, K, N, f.act, nullptr, 1.f, f.h, true, vb, nb); break;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) phase_kernel(Frame f, int step, int p) {
    GRID_LAUNCH();
    prefetch_phase(f, step, p, blockIdx.x, gridDim.x);
    GRID_WAIT();
    phase(f, step, p, blockIdx.x, gridDim.x);
}

GRID_BARRIER
extern "C" __global__ void __launch_bounds__(THREADS) frame_persistent(Frame f, int steps,
                                                                       int ahead) {
    const int phases = 5 * f.L + 2;
    for (int s = 0; s < steps; ++s)
        for (int p = 0; p < phases; ++p) {
            phase(f, s, p, blockIdx.x, gridDim.x);
            if (ahead) {
                const int q = s * phases + p + ahead;
                if (q < steps * phases) prefetch_phase(f, q / phases, q % phases, blockIdx.x,
                                                       gridDim.x);
            }
            grid_barrier(f.bar);
        }
}

extern "C" __global__ void __launch_bounds__(THREADS) barriers_only(unsigned* bar, int n) {
    for (int i = 0; i < n; ++i) grid_barrier(bar);
}
"""


class FrameArgs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "wqkv", "wo", "wgu", "wd", "heads", "tables", "norms", "final_norm", "h", "qkv", "attn",
        "act", "logits", "ids", "bar")] + [(name, ctypes.c_int) for name in (
        "H", "QKV", "A", "I", "V", "L")] + [("eps", ctypes.c_float)]  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--ahead", type=int, nargs="+", default=[1, 2])
    p.add_argument("--reverse", action="store_true",
                   help="time the ways in the other order (the barrier still last)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()

    from edgeomni.plugins import attention_cuda as ac
    from edgeomni.plugins import decoder_cuda as dc
    from edgeomni.runtime import memory
    from edgeomni.runtime.memory import DeviceArray

    cu = ac._driver()
    stream = memory.stream(0)
    cu_stream = ac.stream_handle(stream)
    cudart = memory._cudart()
    major, minor = dc.compute_capability()
    source = SOURCE.replace("GRID_BARRIER\n", GRID_BARRIER)  # the interpreter's barrier
    module = ac.check(cu.cuModuleLoadData(dc.cubin(source, f"sm_{major}{minor}")), "load")
    fn = {n: ac.check(cu.cuModuleGetFunction(module, n.encode()), n)
          for n in ("phase_kernel", "frame_persistent", "barriers_only")}  # fmt: skip
    device = ac.check(cu.cuCtxGetDevice(), "device")
    sms = ac.check(cu.cuDeviceGetAttribute(
        cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device), "SMs")
    resident = ac.check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        fn["frame_persistent"], THREADS, 0), "occupancy")  # fmt: skip
    if resident < 1:
        raise SystemExit("frame_persistent: no block fits an SM")
    rng = np.random.default_rng(0)

    def dev(shape: tuple[int, ...], dtype, scale: float) -> DeviceArray:  # noqa: ANN001
        buf = DeviceArray.zeros(shape, dtype)
        buf.upload((rng.standard_normal(shape) * scale).astype(dtype))
        return buf

    w = {"wqkv": dev((LAYERS, QKV, H), np.float16, 0.03),
         "wo": dev((LAYERS, H, ATTN), np.float16, 0.02),
         "wgu": dev((LAYERS, 2 * INTER, H), np.float16, 0.03),
         "wd": dev((LAYERS, H, INTER), np.float16, 0.02),
         "heads": dev((STEPS, VOCAB, H), np.float16, 0.03),
         "tables": dev((STEPS, VOCAB, H), np.float16, 1.0),
         "norms": dev((LAYERS, 2, H), np.float32, 0.1),
         "final_norm": dev((H,), np.float32, 0.1)}  # fmt: skip
    h0 = (rng.standard_normal(H)).astype(np.float32)
    act = {"h": DeviceArray.zeros((H,), np.float32), "qkv": DeviceArray.zeros((QKV,), np.float32),
           "attn": DeviceArray.zeros((ATTN,), np.float32),
           "act": DeviceArray.zeros((INTER,), np.float32),
           "logits": DeviceArray.zeros((VOCAB,), np.float32),
           "ids": DeviceArray.zeros((STEPS,), np.int32), "bar": DeviceArray.zeros((2,), np.int32)}
    frame = FrameArgs(*(w[k].ptr for k in ("wqkv", "wo", "wgu", "wd", "heads", "tables", "norms",
                                           "final_norm")),
                      *(act[k].ptr for k in ("h", "qkv", "attn", "act", "logits", "ids", "bar")),
                      H, QKV, ATTN, INTER, VOCAB, LAYERS, 1e-6)  # fmt: skip
    weight_bytes = STEPS * (LAYERS * (QKV * H + H * ATTN + 2 * INTER * H + H * INTER)
                            + VOCAB * H + H) * 2  # fmt: skip

    def launch(name: str, grid: int, values: list, overlap: bool = False) -> None:  # noqa: ANN001
        ac.launch_kernel(fn[name], (grid,), THREADS, 0, cu_stream, values, overlap=overlap,
                         what=name)  # fmt: skip

    persistent_grid = sms  # one block an SM: all resident, whatever the occupancy
    kernel_grid = sms * min(resident, 4)
    ways = {"kernels": lambda: [launch("phase_kernel", kernel_grid, [
                frame, ctypes.c_int(s), ctypes.c_int(q)], overlap=True)
                for s in range(STEPS) for q in range(PHASES)],
            "persistent": lambda: launch("frame_persistent", persistent_grid, [
                frame, ctypes.c_int(STEPS), ctypes.c_int(0)])}  # fmt: skip
    for n in args.ahead:
        ways[f"persistent+{n}"] = lambda n=n: launch("frame_persistent", persistent_grid, [
            frame, ctypes.c_int(STEPS), ctypes.c_int(n)])  # fmt: skip
    if resident >= 2:  # two blocks an SM: twice the loads in flight, twice the barrier's arrivals
        for n in (0, *args.ahead):
            ways[f"persistent+{n}, 2 an SM"] = lambda n=n: launch(
                "frame_persistent", 2 * sms, [frame, ctypes.c_int(STEPS), ctypes.c_int(n)])
    bar_ptr = ctypes.c_void_p(act["bar"].ptr)
    ways["barrier"] = lambda: launch("barriers_only", persistent_grid, [
        bar_ptr, ctypes.c_int(STEPS * PHASES)])  # fmt: skip

    def graph_of(queue) -> object:  # noqa: ANN001
        mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        memory._check(cudart.cudaStreamBeginCapture(stream, mode), "capture")
        try:
            queue()
        finally:
            graph = memory._check(cudart.cudaStreamEndCapture(stream), "end capture")
        return memory._check(cudart.cudaGraphInstantiate(graph, 0), "instantiate")

    def run(replay) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
        """The codes a frame drew, and its last step's logits."""
        act["h"].upload(h0)
        memory._check(cudart.cudaGraphLaunch(replay, stream), "launch")
        memory.synchronize(0)
        return act["ids"].download(), act["logits"].download()

    order = [n for n in ways if n != "barrier"]
    order = [*(reversed(order) if args.reverse else order), "barrier"]
    bw = copy_bandwidth_gbs()
    bound_ms = weight_bytes / (bw * 1e9) * 1e3
    rows, got = [], {}
    for name in order:
        replay = graph_of(ways[name])
        ids, logits = run(replay)
        start = memory._check(cudart.cudaEventCreate(), "event")
        end = memory._check(cudart.cudaEventCreate(), "event")
        memory._check(cudart.cudaEventRecord(start, stream), "record")
        for _ in range(args.repeats):
            memory._check(cudart.cudaGraphLaunch(replay, stream), "launch")
        memory._check(cudart.cudaEventRecord(end, stream), "record")
        memory._check(cudart.cudaEventSynchronize(end), "sync")
        ms = memory._check(cudart.cudaEventElapsedTime(start, end), "elapsed") / args.repeats
        row = {"way": name, "frame_ms": round(ms, 4)}
        if name == "barrier":
            row["us_a_barrier"] = round(ms * 1e3 / (STEPS * PHASES), 3)
        else:
            got[name] = (ids, logits)
            row.update(hbm_bound_ms=round(bound_ms, 4), of_bound=round(bound_ms / ms, 3))
        rows.append(row)
    truth = got["kernels"]  # what each way must reach: the kernels' codes and logits
    for row in rows:
        if row["way"] in got:
            ids, logits = got[row["way"]]
            row.update(same_codes=bool(np.array_equal(ids, truth[0])),
                       logits_max_diff=float(np.abs(logits - truth[1]).max()),
                       codes=ids.tolist()[:5])  # fmt: skip
        print(json.dumps(row), flush=True)
    result = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "host": platform.node(), "sms": sms, "blocks_resident_per_sm": resident,
              "kernel_grid": kernel_grid, "persistent_grid": persistent_grid,
              "copy_bandwidth_gbs": round(bw, 1), "weight_bytes": weight_bytes, "rows": rows}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "persistent_frame_gpu.json").write_text(json.dumps(result, indent=1))
    return 0 if all(r.get("same_codes", True) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
