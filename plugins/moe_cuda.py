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

Every token reads its own experts' rows (no grouping of tokens by expert yet): right for a
decode step's few tokens, not yet for prefills. Sums are float32, weights read as stored.
"""

from __future__ import annotations

import numpy as np

from edgeomni.plugins import moe

MOE_WARPS = 4  # warps a block of moe_gate_up and moe_down, a row each at a time
ROUTE_MAX_K = 32  # experts a token, at most (moe_route's shared list)

SOURCE = r"""
// ---- MoE (plugins/moe_cuda.py) -------------------------------------------------------------
__device__ __forceinline__ float wload(const wt_t* p, long long i) {
#if W_HALF
    return h2f(p[i]);
#else
    return p[i];
#endif
}

// one warp (32 threads) a token: ids [T, K] and weights [T, K] from logits [T, E]
extern "C" __global__ void moe_route(
    const float* __restrict__ logits, int E, int K, int normalize, int* __restrict__ ids,
    float* __restrict__ weights)
{
    __shared__ int chosen[32];
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
    float* __restrict__ act)
{
    DYNAMIC_SHARED(float, xs);
    __shared__ float part[32];
    GRID_LAUNCH();
    GRID_WAIT();
    const int slot = blockIdx.y, t = slot / K;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const float* src = h + (long long)t * H;
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
    const float scale = 1.0f / sqrtf(part[0] / (float)H + eps);
    for (int c = threadIdx.x; c < H; c += blockDim.x) xs[c] = src[c] * scale * nw[c];
    __syncthreads();
    const long long e = ids[slot];
    for (int i = blockIdx.x * warps + warp; i < I; i += gridDim.x * warps) {
        const wt_t* g = fc1 + (e * 2 * I + 2 * (long long)i) * H;
        float sg = 0.f, su = 0.f;
        for (int c = lane; c < H; c += 32) {
            sg += xs[c] * wload(g, c);
            su += xs[c] * wload(g, H + c);
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
    const float* __restrict__ gate, float* h)
{
    GRID_LAUNCH();
    GRID_WAIT();
    const int t = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int j = blockIdx.x * warps + warp; j < H; j += gridDim.x * warps) {
        float y = 0.f;
        for (int s = 0; s < K; ++s) {
            const long long slot = (long long)t * K + s;
            const wt_t* w = fc2 + ((long long)ids[slot] * H + j) * I;
            const float* a = act + slot * I;
            float d = 0.f;
            for (int c = lane; c < I; c += 32) d += a[c] * wload(w, c);
            y += weights[slot] * warp_sum(d);
        }
        if (shared) y += shared[(long long)t * H + j] / (1.f + expf(-gate[t]));
        if (lane == 0) h[(long long)t * H + j] += y;
    }
}
"""


def launches(tokens: int, hidden: int, intermediate: int, top_k: int) -> dict[str, tuple]:
    """Each kernel's (grid, block, dynamic shared bytes) for a call of ``tokens`` tokens."""
    rows = 32 * MOE_WARPS
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
