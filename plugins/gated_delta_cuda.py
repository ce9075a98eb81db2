"""The fused backend's kernels for Qwen3.5's layers beyond a Qwen3 layer's, compiled into
plugins/decoder_cuda.py's module, in the layout of the plan's steps (builder/fused_delta.py):
the Gated DeltaNet's two stateful ops (plugins/gated_delta.py: ``CausalConvState`` and
``GatedDeltaRule``), its output's per-head norm times silu(z) (``gated_norm``), and the gated
attention's output gate (``attn_gate``). The two state kernels take a call's rows
right-padded to S tokens with their ``query_lens``, as the ops do, and update each row's state
in place (the engine binds past and present state to one buffer): one call serves prefill,
decode and idle rows. They read the in_proj's product (``mix``) where it lies: the conv its
first columns, the rule its gates' inputs from its last ones.

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
  what would beat it is the WY form on tensor cores. Each warp computes its head's two gates
  for a token from mix (beta = sigmoid(b), g = a_neg * softplus(a + dt_bias)).
- ``gated_norm``: a warp a (token, value head): the head's RMS, then times its weight and
  silu(z), into the attention buffer's type for the o-projection.
- ``attn_gate``: a thread a value of the attention's output, times sigmoid of its gate.

Their kernel cases run against the numpy references here and in plugins/gated_delta.py, on the
CPU and the GPU; a Qwen3.5 engine built fused equals its plan's reference on an H100
(tests/test_fused_gpu.py, docs/gpu-runs/2026-12-06-i55-lease5/).
Sums are float32 (the references' float64); the state is float32 as the op declares it.
"""

from __future__ import annotations

import math

import numpy as np

CONV_MAX_K = 8  # the conv's kernel size, at most (Qwen3.5: 4)
DELTA_WARPS = 4  # state rows (warps) a block of delta_rule
DELTA_LANE = 8  # a row's entries a lane holds: dk at most 32 * DELTA_LANE (Qwen3.5: 128)

SOURCE = r"""
// ---- Gated DeltaNet's state ops (plugins/gated_delta_cuda.py) -----------------------------
#if A_HALF
__device__ __forceinline__ float from_at(at_t a) { return h2f(a); }
#else
__device__ __forceinline__ float from_at(at_t a) { return a; }
#endif

// x [B, S, C] float32, a token's channels xs floats after the one before's (the in_proj's
// mix: its conv channels first), w [C, K], state [B, C, K-1] in the cache's type (in place,
// as the ONNX build declares it), y [B, S, C] float32
extern "C" __global__ void conv_state(
    const float* __restrict__ x, const wt_t* __restrict__ w, at_t* state,
    const int* __restrict__ query_lens, int S, int C, int xs, int K, int silu, float* y) {
    GRID_LAUNCH();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (c >= C) return;
    float wc[CONV_MAX_K], past[CONV_MAX_K], win[CONV_MAX_K];
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) wc[j] = j < K ? w2f(w[(long long)c * K + j]) : 0.f;
    GRID_WAIT();
    at_t* st = state + ((long long)b * C + c) * (K - 1);
#pragma unroll
    for (int j = 0; j < CONV_MAX_K; ++j) past[j] = win[j] = j < K - 1 ? from_at(st[j]) : 0.f;
    const long long row = (long long)b * S * C + c, xrow = (long long)b * S * xs + c;
    for (int t = 0; t < S; ++t) {  // win[0..K-1]: the inputs t .. t+K-1 of concat(past, x)
        const float xt = x[xrow + (long long)t * xs];
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
        st[j] = to_at(i < K - 1 ? past[i] : x[xrow + (long long)(i - (K - 1)) * xs]);
    }
}

// a token's key head of k and q (``kt``, ``qt``: its dk entries): a lane's DELTA_LANE entries
// of each, L2-normalised where l2 (transformers' l2norm: x / sqrt(sum(x^2) + 1e-6))
__device__ __forceinline__ void load_qk(const float* qt, const float* kt, int dk, int l2,
                                        int lane, float* kv, float* qv) {
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

// qkv [B, S, qs]: a token's q [Hk*dk], k [Hk*dk] and v [Hv*dv] side by side (the conv's
// output); mix [B, S, ms] float32: a token's beta inputs at columns beta_at .. + Hv, its
// decay inputs a after them (the in_proj's last columns): beta = sigmoid(b), g = a_neg *
// softplus(a + dt_bias) (a + dt_bias itself above ``threshold``, as torch's softplus);
// state [B, Hv, dv, dk] float32 (in place); o [B, S, Hv*dv]. A warp a state row: grid
// (dv / DELTA_WARPS, Hv, B)
extern "C" __global__ void __launch_bounds__(32 * DELTA_WARPS) delta_rule(
    const float* __restrict__ qkv, int qs, const float* __restrict__ mix, int ms, int beta_at,
    const float* __restrict__ dt_bias, const float* __restrict__ a_neg, float threshold,
    float* state, const int* __restrict__ query_lens, int S, int Hk, int Hv, int dk, int dv,
    int l2, float scale, float* o) {
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
        const float* qt = qkv + tok * qs + (long long)hk * dk;
        load_qk(qt, qt + (long long)Hk * dk, dk, l2, lane, kv, qv);
        const float* gates = mix + tok * ms + beta_at;
        const float x = gates[Hv + h] + dt_bias[h];
        const float soft = x > threshold ? x : log1pf(expf(x));
        const float decay = expf(a_neg[h] * soft), rate = 1.f / (1.f + expf(-gates[h]));
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < DELTA_LANE; ++i) { s[i] *= decay; dot += s[i] * kv[i]; }
        const float vt = qkv[tok * qs + 2LL * Hk * dk + (long long)h * dv + r];
        const float delta = rate * (vt - warp_sum(dot));
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

// attn [T, Hv*dv] (the cache's type) = each head of o [T, Hv*dv] (the rule's output, float32)
// RMS-normed, times w [dv] and silu(z), z a token's columns z_at .. of mix [T, ms] (the
// in_proj's): a warp a (token, head)
extern "C" __global__ void __launch_bounds__(32 * DELTA_WARPS) gated_norm(
    const float* __restrict__ o, const float* __restrict__ mix, int ms, int z_at,
    const float* __restrict__ w, float eps, int T, int Hv, int dv, at_t* attn) {
    GRID_LAUNCH();
    GRID_WAIT();
    const int lane = threadIdx.x & 31;
    const long long unit = (long long)blockIdx.x * DELTA_WARPS + (threadIdx.x >> 5);
    if (unit >= (long long)T * Hv) return;  // a whole warp
    const long long t = unit / Hv, at = t * Hv * dv + (unit % Hv) * dv;
    const float* zt = mix + t * ms + z_at + (unit % Hv) * dv;
    float v[DELTA_LANE], ss = 0.f;
#pragma unroll
    for (int i = 0; i < DELTA_LANE; ++i) {
        const int e = lane + 32 * i;
        v[i] = e < dv ? o[at + e] : 0.f;
        ss += v[i] * v[i];
    }
    const float scale = 1.f / sqrtf(warp_sum(ss) / (float)dv + eps);
#pragma unroll
    for (int i = 0; i < DELTA_LANE; ++i) {
        const int e = lane + 32 * i;
        if (e < dv) {
            const float z = zt[e];
            attn[at + e] = to_at(v[i] * scale * w[e] * (z / (1.f + expf(-z))));
        }
    }
}

// Qwen3.5's gated attention: attn [T, heads*d] (the cache's type) times sigmoid of each head's
// gate, the d values after its q in the gated qkv product [T, qs] (float32): a thread a value
extern "C" __global__ void attn_gate(at_t* attn, const float* __restrict__ qkv, int qs, int T,
                                     int heads, int d) {
    GRID_LAUNCH();
    GRID_WAIT();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long width = (long long)heads * d;
    if (i >= T * width) return;
    const long long t = i / width, c = i % width;
    const float g = qkv[t * qs + (c / d) * 2 * d + d + c % d];
    attn[i] = to_at(from_at(attn[i]) / (1.f + expf(-g)));
}

"""


DELTA_STEPS = ("delta_conv", "delta_rule", "gated_norm")  # a DeltaNet layer's plan steps


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


def norm_launch(tokens: int, num_v_heads: int, dv: int) -> tuple[tuple[int], int]:
    """``gated_norm``'s (grid, block): a warp a token's value head."""
    if dv > 32 * DELTA_LANE:
        raise ValueError(f"gated_norm takes value heads of at most {32 * DELTA_LANE}, not {dv}")
    return (-(-tokens * num_v_heads // DELTA_WARPS),), 32 * DELTA_WARPS


def gate_launch(tokens: int, heads: int, head_dim: int) -> tuple[tuple[int], int]:
    """``attn_gate``'s (grid, block): a thread a value of the attention's output."""
    return (-(-tokens * heads * head_dim // 256),), 256


def gates_reference(mix: np.ndarray, beta_at: int, num_v_heads: int, dt_bias: np.ndarray,
                    a_neg: np.ndarray, threshold: float | None) -> tuple[np.ndarray, np.ndarray]:
    """``delta_rule``'s two gates (g, beta) [T, Hv] in float64 from mix [T, columns], b its
    columns from ``beta_at`` and a the Hv after them: beta = sigmoid(b), g = a_neg *
    softplus(a + dt_bias) (a + dt_bias itself above ``threshold``, as torch's softplus)."""
    hv, mix = num_v_heads, mix.astype(np.float64)
    b, a = mix[:, beta_at : beta_at + hv], mix[:, beta_at + hv : beta_at + 2 * hv]
    x = a + dt_bias
    soft = np.logaddexp(0.0, x)
    if threshold is not None:
        soft = np.where(x > threshold, x, soft)
    return a_neg * soft, 1.0 / (1.0 + np.exp(-b))


def gated_norm_reference(o: np.ndarray, z: np.ndarray, weight: np.ndarray, dv: int,
                         eps: float) -> np.ndarray:
    """``gated_norm`` in float64: each head of o [T, Hv*dv] RMS-normed times weight [dv] and
    silu(z) (z [T, Hv*dv])."""
    heads, z = o.astype(np.float64).reshape(-1, dv), z.astype(np.float64).reshape(-1, dv)
    normed = heads / np.sqrt((heads * heads).mean(-1, keepdims=True) + eps) * weight
    return (normed * z / (1.0 + np.exp(-z))).reshape(o.shape)


def rule_threshold(threshold: float | None) -> float:
    """The plan's ``softplus_threshold`` as the kernel takes it (None, a softplus with none: a
    threshold its comparison never passes)."""
    return 3.4e38 if threshold is None else float(threshold)


def rule_scale(scale: float, dk: int) -> float:
    """The op's ``scale`` attribute as the kernel takes it (0: 1/sqrt(dk))."""
    return scale or 1.0 / math.sqrt(dk)

