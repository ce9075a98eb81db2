"""The fused backend's kernels for the Gated DeltaNet's two stateful ops (plugins/gated_delta.py:
``CausalConvState`` and ``GatedDeltaRule``, Qwen3.5's linear-attention layers), compiled into
plugins/decoder_cuda.py's module. Both take a call's rows right-padded to S tokens with their
``query_lens``, as the ops do, and update each row's state in place (the engine binds past and
present state to one buffer): one call serves prefill, decode and idle rows.

- ``conv_state``: a thread a (row, channel). Its K-1 past inputs and K weights sit in registers;
  it walks the row's S tokens (the depthwise causal conv, SiLU or none; pad positions computed
  as the op's reference computes them), then writes the K-1 inputs ending at the row's last
  valid token as its new state (query_lens 0: the state it read, unchanged).
- ``delta_rule``: a warp a row of a value head's state S [dv, dk] (V-major, as the op stores
  it). The rows of S update independently (S[v] = e^g S[v] + beta (v_t[v] - e^g S[v].k) k, and
  o[v] = scale S[v].q), so a warp holds its row in registers for all of the call's tokens: the
  state is read once and written once a call, whatever S. A warp normalises q and k itself
  (transformers' l2norm, eps 1e-6) and reduces the two dot products across its lanes; pad
  tokens' outputs are 0 (the reference's). Tokens run one after another: a prefill of S tokens
  is S dependent steps. A chunked variant (a chunk's triangular system of k_j.k_t products
  shared by a block's rows, float32 FMAs) took 1.7x this kernel's time at 1 x 512 tokens and
  2.2x at 4 x 512 on an H100 (docs/gpu-runs/2026-12-06-i55-lease3/gated.txt), and was dropped;
  what would beat it is the WY form on tensor cores.

Sums are float32 (the references' float64); the state is float32 as the op declares it.
"""

from __future__ import annotations

import math

CONV_MAX_K = 8  # the conv's kernel size, at most (Qwen3.5: 4)
DELTA_WARPS = 4  # state rows (warps) a block of delta_rule
DELTA_LANE = 8  # a row's entries a lane holds: dk at most 32 * DELTA_LANE (Qwen3.5: 128)

SOURCE = r"""
// ---- Gated DeltaNet's state ops (plugins/gated_delta_cuda.py) -----------------------------
// x [B, S, C] float32, w [C, K], state [B, C, K-1] float32 (in place), y [B, S, C] float32
extern "C" __global__ void conv_state(
    const float* __restrict__ x, const wt_t* __restrict__ w, float* state,
    const int* __restrict__ query_lens, int S, int C, int K, int silu, float* y) {
    GRID_LAUNCH();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (c >= C) return;
    float wc[CONV_MAX_K], past[CONV_MAX_K], win[CONV_MAX_K];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) wc[j] = j < K ? w2f(w[(long long)c * K + j]) : 0.f;
    GRID_WAIT();
    float* st = state + ((long long)b * C + c) * (K - 1);
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) past[j] = win[j] = j < K - 1 ? st[j] : 0.f;
    const long long row = (long long)b * S * C + c;
    for (int t = 0; t < S; ++t) {  // win[0..K-1]: the inputs t .. t+K-1 of concat(past, x)
        const float xt = x[row + (long long)t * C];
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < CONV_MAX_K; ++j) {
            if (j == K - 1) win[j] = xt;
            if (j < K) acc += win[j] * wc[j];
        }
        y[row + (long long)t * C] = silu ? acc / (1.f + expf(-acc)) : acc;
#pragma unroll
        for (int j = 0; j + 1 < CONV_MAX_K; ++j) win[j] = win[j + 1];
    }
    const int q = query_lens[b];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) {  // the new state: inputs q .. q+K-2
        if (j >= K - 1) break;
        const int i = q + j;
        st[j] = i < K - 1 ? past[i] : x[row + (long long)(i - (K - 1)) * C];
    }
}

// key head ``head`` (a token's, [token * Hk + hk]) of k and q [.., dk]: a lane's DELTA_LANE
// entries of each, L2-normalised where l2 (transformers' l2norm: x / sqrt(sum(x^2) + 1e-6))
__device__ __forceinline__ void load_qk(const float* q, const float* k, long long head, int dk,
                                        int l2, int lane, float* kv, float* qv) {
    const float* kt = k + head * dk;
    const float* qt = q + head * dk;
    float kk = 0.f, qq = 0.f;
#pragma unroll
    for (int i = 0; i < DELTA_LANE; ++i) {
        const int e = lane + 32 * i;
        kv[i] = e < dk ? kt[e] : 0.f;
        qv[i] = e < dk ? qt[e] : 0.f;
        kk += kv[i] * kv[i];
        qq += qv[i] * qv[i];
    }
    if (l2) {
        const float rk = 1.f / sqrtf(warp_sum(kk) + 1e-6f);
        const float rq = 1.f / sqrtf(warp_sum(qq) + 1e-6f);
#pragma unroll
        for (int i = 0; i < DELTA_LANE; ++i) { kv[i] *= rk; qv[i] *= rq; }
    }
}

// q, k [B, S, Hk*dk], v [B, S, Hv*dv], g, beta [B, S, Hv] float32; state [B, Hv, dv, dk]
// float32 (in place); o [B, S, Hv*dv]. A warp a state row: grid (dv / DELTA_WARPS, Hv, B)
extern "C" __global__ void __launch_bounds__(32 * DELTA_WARPS) delta_rule(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float* state,
    const int* __restrict__ query_lens, int S, int Hk, int Hv, int dk, int dv, int l2,
    float scale, float* o) {
    GRID_LAUNCH();
    GRID_WAIT();
    const int lane = threadIdx.x & 31, r = blockIdx.x * DELTA_WARPS + (threadIdx.x >> 5);
    const int h = blockIdx.y, b = blockIdx.z, hk = h / (Hv / Hk);
    if (r >= dv) return;  // a whole warp
    float s[DELTA_LANE];
    float* st = state + (((long long)b * Hv + h) * dv + r) * dk;
#pragma unroll
    for (int i = 0; i < DELTA_LANE; ++i) s[i] = lane + 32 * i < dk ? st[lane + 32 * i] : 0.f;
    const int n = query_lens[b];
    for (int t = 0; t < S; ++t) {
        const long long tok = (long long)b * S + t;
        const long long at = tok * Hv * dv + (long long)h * dv + r;
        if (t >= n) {  // a pad token: its output is the reference's 0, the state untouched
            if (lane == 0) o[at] = 0.f;
            continue;
        }
        float kv[DELTA_LANE], qv[DELTA_LANE];
        load_qk(q, k, tok * Hk + hk, dk, l2, lane, kv, qv);
        const long long gh = tok * Hv + h;
        const float decay = expf(g[gh]), rate = beta[gh];
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < DELTA_LANE; ++i) { s[i] *= decay; dot += s[i] * kv[i]; }
        const float delta = rate * (v[at] - warp_sum(dot));
        float out = 0.f;
#pragma unroll
        for (int i = 0; i < DELTA_LANE; ++i) { s[i] += delta * kv[i]; out += s[i] * qv[i]; }
        out = warp_sum(out);
        if (lane == 0) o[at] = scale * out;
    }
#pragma unroll
    for (int i = 0; i < DELTA_LANE; ++i)
        if (lane + 32 * i < dk) st[lane + 32 * i] = s[i];
}

"""


def conv_launch(rows: int, channels: int, kernel_size: int) -> tuple[tuple[int, int], int]:
    """``conv_state``'s (grid, block) for a call of ``rows`` rows."""
    if not 2 <= kernel_size <= CONV_MAX_K:
        raise ValueError(f"conv_state takes kernel sizes 2..{CONV_MAX_K}, not {kernel_size}")
    return (-(-channels // 128), rows), 128


def rule_launch(rows: int, num_k_heads: int, num_v_heads: int, dk: int, dv: int
                ) -> tuple[tuple[int, int, int], int]:  # fmt: skip
    """``delta_rule``'s (grid, block) for a call of ``rows`` rows."""
    if dk > 32 * DELTA_LANE:
        raise ValueError(f"delta_rule takes key heads of at most {32 * DELTA_LANE}, not {dk}")
    if num_v_heads % num_k_heads:
        raise ValueError(f"{num_v_heads} value heads are not a multiple of {num_k_heads}")
    return (-(-dv // DELTA_WARPS), num_v_heads, rows), 32 * DELTA_WARPS


def rule_scale(scale: float, dk: int) -> float:
    """The op's ``scale`` attribute as the kernel takes it (0: 1/sqrt(dk))."""
    return scale or 1.0 / math.sqrt(dk)

