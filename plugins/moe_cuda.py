"""The fused backend's kernels for edgeomni::MoE (plugins/moe.py: routed SwiGLU experts, the
Qwen3-Omni thinker's sparse blocks), compiled into plugins/decoder_cuda.py's module.

A plan's ``moe`` step (runtime/fused_spec.py) is three launches after the router's ``linear``
(the post-attention norm fused into it, as the dense MLP's gate/up):

1. ``moe_route``: a warp a token: the top-k of its router logits (ties to the lower expert, as
   moe.routing's stable sort of the probabilities), their softmax weights over all experts, and
   with ``normalize`` those renormalised to sum to 1;
2. ``moe_gate_up``: block (i, t * k + j) normalises token t's hidden state into shared memory
   and computes rows of silu(x . g) * (x . u) for its j-th expert (fc1's gate and up rows are
   interleaved: g0, u0, g1, u1, ...), a warp a row;
3. ``moe_down``: block (j, t) sums, a warp an output row, each slot's down projection of its
   activations times its routing weight, in slot order, plus a shared expert's output scaled by
   sigmoid of its gate where the layer has one (Qwen3-Omni's talker: the plan's ``linear``
   steps compute both before), and adds the sum into h.

A prefill of more slots (tokens x k) than experts, or a decode step of more than 4 slots an
expert (``grouped``), groups its slots by expert instead, so that each expert's rows are read
once a call rather than once a slot: ``moe_group`` (each expert's slots, in order), ``moe_norm`` (every token's normalised
state), ``moe_gate_up_grouped`` and ``moe_down_grouped`` (an expert's block computes its rows
for all its slots, the down projections into one row of sums a slot), ``moe_combine`` (each
token's weighted sum in slot order, the shared expert, into h). Every sum is made of the same
terms in the same order as the per-slot kernels' (a lane's strided terms, then warp_sum), so
both give the same bits, and a token's result does not depend on the tokens beside it. A call
of more than GROUP_TOKENS tokens runs in parts of that many. Sums are float32, weights read as
stored. Float16 prefills (``uses_gemm``) run the experts' products as tensor-core GEMMs
instead (``moe_gate_up_gemm``, ``moe_down_gemm``: plugins/decoder_gemm_cuda.py's tiles, a block
per tile of 64 of an expert's slots from ``moe_group``'s tile list); their inputs are rounded
to float16 as the dense layers' tensor cores round theirs, so those prefills are not the
per-slot kernels' bits.
"""

from __future__ import annotations

import numpy as np

from edgeomni.plugins import moe
from edgeomni.plugins.decoder_gemm_cuda import GEMM_K, GEMM_THREADS, GEMM_TILE

MOE_WARPS = 4  # warps a block of moe_gate_up and moe_down, a row each at a time
ROUTE_MAX_K = 32  # experts a token, at most (moe_route's shared list)
# the grouped kernels: rows a warp and slots a pass (MOE_SLOTS x MOE_ROWS sums a lane, two of
# them in moe_gate_up_grouped), and the tokens of one grouped part of a longer call (its
# scratch: the slots' down sums [GROUP_TOKENS * K, H] float32)
MOE_ROWS, MOE_SLOTS = 4, 8
GROUP_TOKENS = 512

SOURCE = r"""
// ---- MoE (plugins/moe_cuda.py) -------------------------------------------------------------
__device__ __forceinline__ float wload(const wt_t* p, long long i) {
#if W_HALF
    return h2f(p[i]);
#else
    return p[i];
#endif
}

// an expert matrix's weight i (row-major [E, rows, K]): as stored, or where scales are given
// (int4, float16 modules) (code - 8) * scale of codes two a byte, the lower index in the low
// nibble, and one float16 scale a row and group of 1 << shift of K (plugins/quant_moe.py)
struct MoeW {
    const wt_t* w;
    const half_t* s;
    int shift;
    __device__ __forceinline__ float at(long long i) const {
        if (!s) return wload(w, i);
        const unsigned char code = reinterpret_cast<const unsigned char*>(w)[i >> 1];
        return dequant4(code >> (4 * (int)(i & 1))) * h2f(s[i >> shift]);
    }
};

// 1 / rms of a token's row h [H], eps added, as moe_gate_up and moe_norm take it: the block's
// threads' strided squares, each warp's sum, the warps' sum (the same bits in both)
__device__ __forceinline__ float moe_rms_scale(const float* src, int H, float eps) {
    SHARED_BEGIN_INNER;
    SHARED(float, part, [32]);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    float ss = 0.f;
    for (int c = threadIdx.x; c < H; c += blockDim.x) ss += src[c] * src[c];
    ss = warp_sum(ss);
    if (lane == 0) part[warp] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < warps ? part[threadIdx.x] : 0.f;
        v = warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    return 1.0f / sqrtf(part[0] / (float)H + eps);
}

// one warp (32 threads) a token: ids [T, K] and weights [T, K] from logits [T, E]
extern "C" __global__ void moe_route(
    const float* __restrict__ logits, int E, int K, int normalize, int* __restrict__ ids,
    float* __restrict__ weights)
{
    SHARED_BEGIN;
    SHARED(int, chosen, [32]);
    GRID_LAUNCH();
    GRID_WAIT();
    const int t = blockIdx.x, lane = threadIdx.x & 31;
    const float* l = logits + (long long)t * E;
    float m = NEG_INF;
    for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float total = 0.f;
    for (int e = lane; e < E; e += 32) total += expf(l[e] - m);
    total = warp_sum(total);
    float kept = 0.f;
    for (int j = 0; j < K; ++j) {
        float best = NEG_INF, arg = (float)E;
        for (int e = lane; e < E; e += 32) {
            bool taken = false;
            for (int q = 0; q < j; ++q) taken = taken || chosen[q] == e;
            if (!taken && (l[e] > best || (l[e] == best && (float)e < arg))) {
                best = l[e];
                arg = (float)e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {  // the largest logit, the lower expert among equals
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const float oa = __shfl_xor_sync(0xffffffffu, arg, o);
            if (ob > best || (ob == best && oa < arg)) {
                best = ob;
                arg = oa;
            }
        }
        __syncwarp();
        if (lane == 0) chosen[j] = (int)arg;
        __syncwarp();
        const float p = expf(best - m) / total;
        kept += p;
        if (lane == 0) {
            ids[(long long)t * K + j] = (int)arg;
            weights[(long long)t * K + j] = p;
        }
    }
    __syncwarp();
    if (normalize && lane < K) weights[(long long)t * K + lane] /= kept;
}

// act [T * K, I]: silu(x . g_i) * (x . u_i) of each token's chosen experts, x = rmsnorm(h) * nw
extern "C" __global__ void moe_gate_up(
    const float* __restrict__ h, const float* __restrict__ nw, float eps,
    const wt_t* __restrict__ fc1, const int* __restrict__ ids, int K, int H, int I,
    float* __restrict__ act, const half_t* __restrict__ s1, int shift)
{
    DYNAMIC_SHARED(float, xs);
    const MoeW W{fc1, s1, shift};
    GRID_LAUNCH();
    GRID_WAIT();
    const int slot = blockIdx.y, t = slot / K;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const float* src = h + (long long)t * H;
    const float scale = moe_rms_scale(src, H, eps);
    for (int c = threadIdx.x; c < H; c += blockDim.x) xs[c] = src[c] * scale * nw[c];
    __syncthreads();
    const long long e = ids[slot];
    for (int i = blockIdx.x * warps + warp; i < I; i += gridDim.x * warps) {
        const long long g = (e * 2 * I + 2 * (long long)i) * H;
        float sg = 0.f, su = 0.f;
        for (int c = lane; c < H; c += 32) {
            sg += xs[c] * W.at(g + c);
            su += xs[c] * W.at(g + H + c);
        }
        sg = warp_sum(sg);
        su = warp_sum(su);
        if (lane == 0) act[(long long)slot * I + i] = sg / (1.f + expf(-sg)) * su;
    }
}

// h[t, j] += sum over token t's slots s (in order) of weights[t, s] * (act[t * K + s] . fc2[e_s, j]),
// plus sigmoid(gate[t]) * shared[t, j] where a shared expert's output is given (else nulls)
extern "C" __global__ void moe_down(
    const float* __restrict__ act, const wt_t* __restrict__ fc2, const int* __restrict__ ids,
    const float* __restrict__ weights, int K, int H, int I, const float* __restrict__ shared,
    const float* __restrict__ gate, float* h, const half_t* __restrict__ s2, int shift)
{
    GRID_LAUNCH();
    GRID_WAIT();
    const MoeW W{fc2, s2, shift};
    const int t = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int j = blockIdx.x * warps + warp; j < H; j += gridDim.x * warps) {
        float y = 0.f;
        for (int s = 0; s < K; ++s) {
            const long long slot = (long long)t * K + s;
            const long long w = ((long long)ids[slot] * H + j) * I;
            const float* a = act + slot * I;
            float d = 0.f;
            for (int c = lane; c < I; c += 32) d += a[c] * W.at(w + c);
            y += weights[slot] * warp_sum(d);
        }
        if (shared) y += shared[(long long)t * H + j] / (1.f + expf(-gate[t]));
        if (lane == 0) h[(long long)t * H + j] += y;
    }
}

// ---- grouped by expert (calls of more slots than experts) ------------------------------------
// offsets [E + 1] into order [S]: the call's slots (t * K + j) grouped by expert, ascending
// within one. One block, a thread an expert (E < blockDim.x <= 1024). With tiles (the GEMMs'
// list, plugins/decoder_gemm_cuda.py): tiles[0] tiles of G_TILE slots, tile i at tiles[1 + 2i]
// (its expert) and tiles[2 + 2i] (its first row within the expert's slots).
extern "C" __global__ void moe_group(const int* __restrict__ ids, int S, int E,
                                     int* __restrict__ offsets, int* __restrict__ order,
                                     int* __restrict__ tiles)
{
    SHARED_BEGIN;
    SHARED(int, start, [1025]);
    GRID_LAUNCH();
    GRID_WAIT();
    const int e = threadIdx.x;
    int n = 0;
    if (e < E)
        for (int s = 0; s < S; ++s) n += ids[s] == e;
    start[e + 1] = n;
    __syncthreads();
    if (e == 0) {
        start[0] = 0;
        for (int i = 0; i < E; ++i) start[i + 1] += start[i];
    }
    __syncthreads();
    if (e <= E) offsets[e] = start[e];
    if (tiles && e == 0) {
        int n = 0;
        for (int i = 0; i < E; ++i)
            for (int r = 0; r < start[i + 1] - start[i]; r += G_TILE) {
                tiles[1 + 2 * n] = i;
                tiles[2 + 2 * n] = r;
                ++n;
            }
        tiles[0] = n;
    }
    if (e < E) {
        int at = start[e];
        for (int s = 0; s < S; ++s)
            if (ids[s] == e) order[at++] = s;
    }
}

// xn [T, H] = rmsnorm(h) * nw, each token as moe_gate_up normalises it (a block of
// 32 * MOE_WARPS threads a token, the same sums in the same order)
extern "C" __global__ void moe_norm(const float* __restrict__ h, const float* __restrict__ nw,
                                    float eps, int H, float* __restrict__ xn)
{
    GRID_LAUNCH();
    GRID_WAIT();
    const int t = blockIdx.x;
    const float* src = h + (long long)t * H;
    const float scale = moe_rms_scale(src, H, eps);
    for (int c = threadIdx.x; c < H; c += blockDim.x) xn[(long long)t * H + c] = src[c] * scale * nw[c];
}

// moe_gate_up for expert blockIdx.y's slots: a warp MOE_ROWS rows (gate and up) over
// MOE_SLOTS slots at a time, so the expert's rows are read once a call, not once a slot; each
// sum is a lane's terms in moe_gate_up's order and its warp_sum (the same bits)
extern "C" __global__ void moe_gate_up_grouped(
    const float* __restrict__ xn, const wt_t* __restrict__ fc1, const int* __restrict__ offsets,
    const int* __restrict__ order, int K, int H, int I, float* __restrict__ act,
    const half_t* __restrict__ s1, int shift)
{
    GRID_LAUNCH();
    GRID_WAIT();
    const MoeW W{fc1, s1, shift};
    const int e = blockIdx.y, lo = offsets[e], hi = offsets[e + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int i0 = (blockIdx.x * warps + warp) * MOE_ROWS;
    if (lo == hi || i0 >= I) return;
    long long g[MOE_ROWS];
#pragma unroll
    for (int r = 0; r < MOE_ROWS; ++r)
        g[r] = ((long long)e * 2 * I + 2 * (long long)min(i0 + r, I - 1)) * H;
    for (int b = lo; b < hi; b += MOE_SLOTS) {
        const int n = min(MOE_SLOTS, hi - b);
        const float* x[MOE_SLOTS];
        float sg[MOE_SLOTS][MOE_ROWS], su[MOE_SLOTS][MOE_ROWS];
#pragma unroll
        for (int j = 0; j < MOE_SLOTS; ++j) {
            x[j] = xn + (long long)(order[b + min(j, n - 1)] / K) * H;
#pragma unroll
            for (int r = 0; r < MOE_ROWS; ++r) sg[j][r] = su[j][r] = 0.f;
        }
        // unrolled: a later pass's loads are issued before this one's products (each sum's
        // terms keep their order)
#pragma unroll 2
        for (int c = lane; c < H; c += 32) {
            float wg[MOE_ROWS], wu[MOE_ROWS];
#pragma unroll
            for (int r = 0; r < MOE_ROWS; ++r) {
                wg[r] = W.at(g[r] + c);
                wu[r] = W.at(g[r] + H + c);
            }
#pragma unroll
            for (int j = 0; j < MOE_SLOTS; ++j) {
                const float xv = x[j][c];
#pragma unroll
                for (int r = 0; r < MOE_ROWS; ++r) {
                    sg[j][r] += xv * wg[r];
                    su[j][r] += xv * wu[r];
                }
            }
        }
#pragma unroll
        for (int j = 0; j < MOE_SLOTS; ++j)
#pragma unroll
            for (int r = 0; r < MOE_ROWS; ++r) {
                const float a = warp_sum(sg[j][r]), u = warp_sum(su[j][r]);
                if (lane == 0 && j < n && i0 + r < I)
                    act[(long long)order[b + j] * I + i0 + r] = a / (1.f + expf(-a)) * u;
            }
    }
}

// each slot of expert blockIdx.y: d [S, H], its act row . fc2[e, j], a warp MOE_ROWS rows j over
// MOE_SLOTS slots at a time (moe_down's per-slot sums, in its order)
extern "C" __global__ void moe_down_grouped(
    const float* __restrict__ act, const wt_t* __restrict__ fc2, const int* __restrict__ offsets,
    const int* __restrict__ order, int H, int I, float* __restrict__ d,
    const half_t* __restrict__ s2, int shift)
{
    GRID_LAUNCH();
    GRID_WAIT();
    const MoeW W{fc2, s2, shift};
    const int e = blockIdx.y, lo = offsets[e], hi = offsets[e + 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int j0 = (blockIdx.x * warps + warp) * MOE_ROWS;
    if (lo == hi || j0 >= H) return;
    long long w[MOE_ROWS];
#pragma unroll
    for (int r = 0; r < MOE_ROWS; ++r) w[r] = ((long long)e * H + min(j0 + r, H - 1)) * I;
    for (int b = lo; b < hi; b += MOE_SLOTS) {
        const int n = min(MOE_SLOTS, hi - b);
        const float* a[MOE_SLOTS];
        float sum[MOE_SLOTS][MOE_ROWS];
#pragma unroll
        for (int j = 0; j < MOE_SLOTS; ++j) {
            a[j] = act + (long long)order[b + min(j, n - 1)] * I;
#pragma unroll
            for (int r = 0; r < MOE_ROWS; ++r) sum[j][r] = 0.f;
        }
#pragma unroll 4
        for (int c = lane; c < I; c += 32) {
            float wv[MOE_ROWS];
#pragma unroll
            for (int r = 0; r < MOE_ROWS; ++r) wv[r] = W.at(w[r] + c);
#pragma unroll
            for (int j = 0; j < MOE_SLOTS; ++j) {
                const float av = a[j][c];
#pragma unroll
                for (int r = 0; r < MOE_ROWS; ++r) sum[j][r] += av * wv[r];
            }
        }
#pragma unroll
        for (int j = 0; j < MOE_SLOTS; ++j)
#pragma unroll
            for (int r = 0; r < MOE_ROWS; ++r) {
                const float v = warp_sum(sum[j][r]);
                if (lane == 0 && j < n && j0 + r < H) d[(long long)order[b + j] * H + j0 + r] = v;
            }
    }
}

// h[t, j] += sum over t's slots s (in order) of weights[t, s] * d[t * K + s, j], plus
// sigmoid(gate[t]) * shared[t, j] where given: moe_down's sum from the grouped sums
extern "C" __global__ void moe_combine(
    const float* __restrict__ d, const float* __restrict__ weights, int K, int H,
    const float* __restrict__ shared, const float* __restrict__ gate, float* h)
{
    GRID_LAUNCH();
    GRID_WAIT();
    const int t = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= H) return;
    float y = 0.f;
    for (int s = 0; s < K; ++s) {
        const long long slot = (long long)t * K + s;
        y += weights[slot] * d[slot * H + j];
    }
    if (shared) y += shared[(long long)t * H + j] / (1.f + expf(-gate[t]));
    h[(long long)t * H + j] += y;
}
"""


def grouped(tokens: int, top_k: int, experts: int, prefill: bool = True) -> bool:
    """Whether a call of ``tokens`` tokens runs the grouped kernels: a prefill of more slots
    than experts, or a decode step of more than 4 slots an expert. In the Qwen3-Omni pipeline on
    the H100, grouped prefills brought first audio forward at 1 to 16 requests, while the
    talker's decode at 32 rows grouped was no faster (docs/benchmarks.md, kernels before their
    loops were unrolled; unrolled, the MoE step alone is 1.6x the per-slot one at 32 tokens and
    3.7-4.4x from 128): decode steps group from 4 slots an expert on until the pipeline says
    otherwise. Never for 1024 experts or more (``moe_group`` is one block, a thread an
    expert): those layers stay per slot."""
    slots = tokens * top_k
    return experts < 1024 and slots > (experts if prefill else 4 * experts)


def uses_gemm(prefill: bool, weights: str, hidden: int, intermediate: int) -> bool:
    """Whether a grouped call runs its experts' products as tensor-core GEMMs
    (``moe_gate_up_gemm``, ``moe_down_gemm``): float16 prefills whose K (hidden and
    intermediate) the GEMM's steps divide; decode steps keep the SIMT grouped kernels, whose
    sums are the per-slot kernels' bits. On an H100 at Qwen3-Omni's thinker's experts
    (docs/gpu-runs/2026-12-06-i55-lease3/moe.txt) the GEMMs took 1.24x less time than the
    grouped SIMT kernels at 32 tokens, 1.9x at 128 and 5x from 512."""
    return prefill and weights == "float16" and hidden % GEMM_K == 0 and intermediate % GEMM_K == 0


def tiles_size(slots: int, experts: int) -> int:
    """Ints of ``moe_group``'s tile list for a call of ``slots`` slots: the count, then two a
    tile, at most ceil(slots / GEMM_TILE) + experts tiles."""
    return 1 + 2 * (-(-slots // GEMM_TILE) + experts)


def launches(
    tokens: int, hidden: int, intermediate: int, top_k: int, experts: int = 0,
    gemm: bool = False, int4: bool = False,
) -> dict[str, tuple]:  # fmt: skip
    """Each kernel's (grid, block, dynamic shared bytes) for a call of ``tokens`` tokens, in
    launch order; with ``experts`` (where ``grouped`` says so), the grouped kernels' (a part of
    at most GROUP_TOKENS tokens: a longer call runs them on its tokens in parts); with ``gemm``
    (``uses_gemm``), the experts' products as GEMMs, a block per tile of the tile list (``int4``:
    the GEMMs of int4 experts; the SIMT kernels take int4 experts as they are)."""
    rows = 32 * MOE_WARPS
    if experts:
        if experts >= 1024:
            raise ValueError(f"moe_group takes fewer than 1024 experts, not {experts}")
        per_block = MOE_WARPS * MOE_ROWS
        tiles = (tiles_size(tokens * top_k, experts) - 1) // 2
        q4 = "_q4" if int4 else ""
        products = {
            "moe_gate_up_gemm" + q4: ((-(-intermediate // (GEMM_TILE // 2)), tiles), GEMM_THREADS,
                                      0),
            "moe_down_gemm" + q4: ((-(-hidden // GEMM_TILE), tiles), GEMM_THREADS, 0),
        } if gemm else {
            "moe_gate_up_grouped": ((-(-intermediate // per_block), experts), rows, 0),
            "moe_down_grouped": ((-(-hidden // per_block), experts), rows, 0),
        }  # fmt: skip
        return {
            "moe_route": ((tokens,), 32, 0),
            "moe_group": ((1,), -(-(experts + 1) // 32) * 32, 0),
            "moe_norm": ((tokens,), rows, 0),
            **products,
            "moe_combine": ((-(-hidden // 256), tokens), 256, 0),
        }
    return {
        "moe_route": ((tokens,), 32, 0),
        "moe_gate_up": ((-(-intermediate // MOE_WARPS), tokens * top_k), rows, 4 * hidden),
        "moe_down": ((-(-hidden // MOE_WARPS), tokens), rows, 0),
    }


def reference(
    h: np.ndarray, norm_w: np.ndarray, eps: float, router: np.ndarray, fc1: np.ndarray,
    fc2: np.ndarray, *, top_k: int, normalize: int, shared: np.ndarray | None = None,
    gate: np.ndarray | None = None,
) -> np.ndarray:  # fmt: skip
    """What the three kernels leave in h [T, H] (float64): h + the op's output for rmsnorm(h)
    * norm_w, given the router's logits [T, E] (+ sigmoid(gate [T, 1]) * shared [T, H])."""
    x = h.astype(np.float64)
    xn = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * norm_w
    y = moe.reference(xn, router.astype(np.float64), fc1.astype(np.float64),
                      fc2.astype(np.float64), top_k=top_k, normalize_routing=normalize)  # fmt: skip
    if shared is not None and gate is not None:
        y = y + shared.astype(np.float64) / (1.0 + np.exp(-gate.astype(np.float64).reshape(-1, 1)))
    return x + y
