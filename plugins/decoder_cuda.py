"""CUDA C kernels for a dense Qwen3-style decoder step, compiled by NVRTC at load time.

The fused backend (runtime/fused_engine.py) runs each layer of a ``decoder.CausalLM`` as five
launches of these kernels and the attention kernel of plugins/attention_cuda.py:

1. ``linear`` with the input norm: ``qkv = rmsnorm(h) @ Wqkv^T`` (the norm's row scale comes
   from the same pass over ``h`` that feeds the dot products: no normed copy is written);
2. ``qk_rope``: q/k RMSNorm per head, rotary (1-D or interleaved MRoPE), q, k and v in the cache's
   type, ready for the attention kernel, which writes the new keys and values into the cache in
   place and attends;
3. ``linear`` with the residual: ``h += attn @ Wo^T``;
4. ``linear`` with the post-attention norm and SwiGLU: ``act = silu(gate) * up``, gate and up
   rows of the packed matrix read by the same warp;
5. ``linear`` with the residual: ``h += act @ Wdown^T``.

The last norm and the LM head are one more ``linear`` over each row's ``last_indices`` position,
and ``topk_chunks`` + ``topk_merge`` reduce the logits to each row's top K on the device.

``linear`` is a GEMV for a few rows: one warp an output column, each lane 16 bytes of the
weight row at a time, every row of the block (R of them: 1, 2, 4, 8 or 16) multiplied with it,
so a weight byte is read once per R rows. Activations are float32 (the residual stream, q/k
before rotary, SwiGLU's output); weights are float16 or float32, read as stored; accumulation
is float32. Each kernel has a numpy ``*_reference`` here giving its meaning.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.plugins import attention_cuda as ac

ROWS = (1, 2, 4, 8, 16)  # rows per block of ``linear`` variants
WARPS = 8  # output columns per block of ``linear``
TOPK_CHUNK = 4096  # logits per block of the top-K's first pass
TOPK_MAX = 256
MAX_HEAD_DIM = 512


@dataclass(frozen=True)
class Variant:
    """What is baked into one compiled module: the weights' and the attention's float types."""

    weights: str = "float16"  # "float16" or "float32"
    attention: str = "float16"  # q, k, v, the cache and the attention output

    def __post_init__(self) -> None:
        for name in (self.weights, self.attention):
            if name not in ac.DTYPES:
                raise ValueError(f"dtype {name!r}: the kernels have {', '.join(ac.DTYPES)}")

    def source(self) -> str:
        defines = {"W_HALF": int(self.weights == "float16"),
                   "A_HALF": int(self.attention == "float16"), "WARPS": WARPS,
                   "TOPK_CHUNK": TOPK_CHUNK, "TOPK_MAX": TOPK_MAX}  # fmt: skip
        head = "// edgeomni fused decoder kernels (plugins/decoder_cuda.py)\n"
        return head + "".join(f"#define {k} {v}\n" for k, v in defines.items()) + _BODY


def linear_name(rows: int, half_input: bool) -> str:
    return f"linear_{'h' if half_input else 'f'}{rows}"


def rows_variant(rows: int) -> int:
    """The ``linear`` variant for a call of ``rows`` rows: the smallest R >= rows, at most 16
    (more rows run as several blocks along y)."""
    return next((r for r in ROWS if r >= rows), ROWS[-1])


_BODY = r"""
typedef unsigned short half_t;
#define NEG_INF __int_as_float(0xff800000)
#ifndef DECODER_HOST_EMULATION  // tests/test_fused_kernels_host.py defines these for g++
__device__ __forceinline__ float h2f(half_t h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ half_t f2h(float f) {
    half_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
#define DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif
#if W_HALF
typedef half_t wt_t;
#define WVEC 8
#else
typedef float wt_t;
#define WVEC 4
#endif
#if A_HALF
typedef half_t at_t;
__device__ __forceinline__ at_t to_at(float f) { return f2h(f); }
#else
typedef float at_t;
__device__ __forceinline__ at_t to_at(float f) { return f; }
#endif

__device__ __forceinline__ void load_w(const wt_t* p, float* out) {
    uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
#if W_HALF
    const half_t* e = reinterpret_cast<const half_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = h2f(e[i]);
#else
    const float* e = reinterpret_cast<const float*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = e[i];
#endif
}

template <bool XHALF>
__device__ __forceinline__ void load_x(const void* base, long long at, float* out) {
    if (XHALF) {
        const half_t* p = reinterpret_cast<const half_t*>(base) + at;
#pragma unroll
        for (int i = 0; i < WVEC; ++i) out[i] = h2f(p[i]);
    } else {
        const float* p = reinterpret_cast<const float*>(base) + at;
#pragma unroll
        for (int i = 0; i < WVEC; i += 4) {
            float4 v = *reinterpret_cast<const float4*>(p + i);
            out[i] = v.x; out[i + 1] = v.y; out[i + 2] = v.z; out[i + 3] = v.w;
        }
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// out[r, n] (float32, row stride N) for rows r of the call:
//   v = (x_r * norm_w) . W[n] * rms_scale(x_r)   (norm_w given), else x_r . W[n]
//   swiglu: gate = that with W[n], up = with W[n + N]; v = silu(gate) * up
//   + bias[n]; resid: out += v, else out = v.
// x_r is row r of x (stride K) or, with rowmap, row r * seq + rowmap[r]. With head_index the
// weights start at W + head_index[0] * head_stride (one of several stacked heads).
template <int R, bool XHALF>
__device__ void linear_body(
    const void* __restrict__ x, const long long* __restrict__ rowmap, int seq,
    const float* __restrict__ norm_w, float eps,
    const wt_t* __restrict__ w, long long head_stride, const long long* __restrict__ head_index,
    const float* __restrict__ bias, float* out, int rows, int K, int N, int swiglu, int resid)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = blockIdx.x * WARPS + warp;
    if (n >= N) return;
    const int r0 = blockIdx.y * R;
    const wt_t* wb = w + (head_index ? head_index[0] * head_stride : 0LL);
    const wt_t* w1 = wb + (long long)n * K;
    const wt_t* w2 = wb + (long long)(n + N) * K;
    long long src[R];
    bool valid[R];
    float acc[R], acc2[R], ss[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        int rr = r0 + r;
        valid[r] = rr < rows;
        long long row = valid[r] ? (rowmap ? (long long)rr * seq + rowmap[rr] : rr) : 0;
        src[r] = row * K;
        acc[r] = 0.f; acc2[r] = 0.f; ss[r] = 0.f;
    }
#pragma unroll 4
    for (int k = lane * WVEC; k < K; k += 32 * WVEC) {  // unrolled: loads in flight together
        float wv[WVEC], wv2[WVEC], g[WVEC];
        load_w(w1 + k, wv);
        if (swiglu) load_w(w2 + k, wv2);
        if (norm_w) {
#pragma unroll
            for (int i = 0; i < WVEC; ++i) g[i] = norm_w[k + i];
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (!valid[r]) continue;
            float xv[WVEC];
            load_x<XHALF>(x, src[r] + k, xv);
            if (norm_w) {
#pragma unroll
                for (int i = 0; i < WVEC; ++i) { ss[r] += xv[i] * xv[i]; xv[i] *= g[i]; }
            }
            float a = 0.f, b = 0.f;
#pragma unroll
            for (int i = 0; i < WVEC; ++i) a += xv[i] * wv[i];
            if (swiglu) {
#pragma unroll
                for (int i = 0; i < WVEC; ++i) b += xv[i] * wv2[i];
            }
            acc[r] += a; acc2[r] += b;
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (!valid[r]) continue;  // the same for every lane: no divergent shuffle
        float a = warp_sum(acc[r]);
        float b = swiglu ? warp_sum(acc2[r]) : 0.f;
        float s = norm_w ? warp_sum(ss[r]) : 0.f;
        if (lane != 0) continue;
        if (norm_w) {
            float scale = 1.0f / sqrtf(s / (float)K + eps);
            a *= scale; b *= scale;
        }
        float v = swiglu ? a / (1.0f + expf(-a)) * b : a;
        if (bias) v += bias[n];
        float* o = out + (long long)(r0 + r) * N + n;
        *o = resid ? *o + v : v;
    }
}

#define LINEAR(R, XH, NAME) \
extern "C" __global__ void __launch_bounds__(32 * WARPS) NAME( \
    const void* x, const long long* rowmap, int seq, const float* norm_w, float eps, \
    const wt_t* w, long long head_stride, const long long* head_index, const float* bias, \
    float* out, int rows, int K, int N, int swiglu, int resid) { \
    linear_body<R, XH>(x, rowmap, seq, norm_w, eps, w, head_stride, head_index, bias, out, \
                       rows, K, N, swiglu, resid); }
LINEAR(1, false, linear_f1) LINEAR(2, false, linear_f2) LINEAR(4, false, linear_f4)
LINEAR(8, false, linear_f8) LINEAR(16, false, linear_f16)
LINEAR(1, true, linear_h1) LINEAR(2, true, linear_h2) LINEAR(4, true, linear_h4)
LINEAR(8, true, linear_h8) LINEAR(16, true, linear_h16)

// One block a token, one warp a head (looping): q and k heads get their RMSNorm (weights qn,
// kn; none when null) and rotary, v heads are copied; all written in the attention's type.
// Frequency j's angle is position * inv_freq[j], the position taken from axis freq_axis[j] of
// pos [axes, tokens] (1-D RoPE: axes 1, freq_axis null).
extern "C" __global__ void qk_rope(
    const float* __restrict__ qkv, const long long* __restrict__ pos, int tokens,
    const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ inv_freq, const int* __restrict__ freq_axis,
    at_t* q, at_t* k, at_t* v, int HQ, int HKV, int D)
{
    DYNAMIC_SHARED(float, buf);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int t = blockIdx.x, heads = HQ + 2 * HKV, half = D / 2;
    float* hb = buf + warp * D;
    for (int h = warp; h < heads; h += warps) {
        const float* src = qkv + ((long long)t * heads + h) * D;
        if (h >= HQ + HKV) {
            at_t* dst = v + ((long long)t * HKV + (h - HQ - HKV)) * D;
            for (int i = lane; i < D; i += 32) dst[i] = to_at(src[i]);
            continue;
        }
        const float* nw = h < HQ ? qn : kn;
        float ss = 0.f;
        for (int i = lane; i < D; i += 32) { float e = src[i]; hb[i] = e; ss += e * e; }
        ss = warp_sum(ss);
        float scale = nw ? 1.0f / sqrtf(ss / (float)D + eps) : 1.0f;
        __syncwarp();
        at_t* dst = h < HQ ? q + ((long long)t * HQ + h) * D
                           : k + ((long long)t * HKV + (h - HQ)) * D;
        for (int i = lane; i < D; i += 32) {
            int j = i < half ? i : i - half;
            int axis = freq_axis ? freq_axis[j] : 0;
            float angle = (float)pos[(long long)axis * tokens + t] * inv_freq[j];
            float c = cosf(angle), s = sinf(angle);
            float a = hb[i] * scale * (nw ? nw[i] : 1.0f);
            int p = i < half ? i + half : i - half;
            float b = hb[p] * scale * (nw ? nw[p] : 1.0f);
            dst[i] = to_at(i < half ? a * c - b * s : a * c + b * s);
        }
        __syncwarp();
    }
}

// out[r, :] = rmsnorm(x[row r]) * w: each row's last position (rowmap) normed, for last_hidden.
extern "C" __global__ void rms_rows(
    const float* __restrict__ x, const long long* __restrict__ rowmap, int seq,
    const float* __restrict__ w, float eps, float* __restrict__ out, int H)
{
    __shared__ float part[32];
    const int r = blockIdx.x;
    const float* src = x + ((long long)r * seq + rowmap[r]) * H;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) ss += src[i] * src[i];
    ss = warp_sum(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
        v = warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    float scale = 1.0f / sqrtf(part[0] / (float)H + eps);
    for (int i = threadIdx.x; i < H; i += blockDim.x) out[(long long)r * H + i] = src[i] * scale * w[i];
}

// h[i] += d[i] (DeepStack's features after a layer), d float32 or float16
extern "C" __global__ void add_into(float* h, const float* __restrict__ d, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] += d[i];
}
extern "C" __global__ void add_into_h(float* h, const half_t* __restrict__ d, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] += h2f(d[i]);
}

// the engine's float16 inputs and outputs (the ONNX build's types) to and from float32
extern "C" __global__ void half_to_float(float* out, const half_t* __restrict__ in, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = h2f(in[i]);
}
extern "C" __global__ void float_to_half(half_t* out, const float* __restrict__ in, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2h(in[i]);
}

// a before b: the higher score, the lower id among equals (NaN counts as -inf)
__device__ __forceinline__ bool before(float av, int ai, float bv, int bi) {
    return av > bv || (av == bv && ai < bi);
}

__device__ void bitonic(float* val, int* idx, int n) {
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
                int lo = 2 * i - (i & (stride - 1));
                int hi = lo + stride;
                bool up = (lo & size) == 0;  // this run sorts "before" first
                bool swap = up ? before(val[hi], idx[hi], val[lo], idx[lo])
                               : before(val[lo], idx[lo], val[hi], idx[hi]);
                if (swap) {
                    float tv = val[lo]; val[lo] = val[hi]; val[hi] = tv;
                    int ti = idx[lo]; idx[lo] = idx[hi]; idx[hi] = ti;
                }
            }
        }
    }
    __syncthreads();
}

// pass 1: block (c, b) sorts logits [b, c*CHUNK .. +CHUNK) (+ bias: -inf for ids held out) and
// keeps its best kk in cand_v/cand_i [b, c, kk]
extern "C" __global__ void __launch_bounds__(512) topk_chunks(
    const float* __restrict__ logits, const float* __restrict__ bias, int V, int kk,
    float* cand_v, int* cand_i)
{
    __shared__ float val[TOPK_CHUNK];
    __shared__ int idx[TOPK_CHUNK];
    const int c = blockIdx.x, b = blockIdx.y, chunks = gridDim.x;
    for (int i = threadIdx.x; i < TOPK_CHUNK; i += blockDim.x) {
        int id = c * TOPK_CHUNK + i;
        float s = NEG_INF;
        if (id < V) {
            s = logits[(long long)b * V + id] + (bias ? bias[id] : 0.f);
            if (s != s) s = NEG_INF;
        }
        val[i] = s; idx[i] = id < V ? id : 0x7fffffff;
    }
    bitonic(val, idx, TOPK_CHUNK);
    for (int i = threadIdx.x; i < kk; i += blockDim.x) {
        cand_v[((long long)b * chunks + c) * kk + i] = val[i];
        cand_i[((long long)b * chunks + c) * kk + i] = idx[i];
    }
}

// pass 2: block b sorts its rows' n candidates (n <= TOPK_CHUNK) and writes the best kk
extern "C" __global__ void __launch_bounds__(512) topk_merge(
    const float* __restrict__ cand_v, const int* __restrict__ cand_i, int n, int kk,
    float* out_v, long long* out_i)
{
    __shared__ float val[TOPK_CHUNK];
    __shared__ int idx[TOPK_CHUNK];
    const int b = blockIdx.x;
    int p = 1;
    while (p < n) p <<= 1;
    for (int i = threadIdx.x; i < p; i += blockDim.x) {
        val[i] = i < n ? cand_v[(long long)b * n + i] : NEG_INF;
        idx[i] = i < n ? cand_i[(long long)b * n + i] : 0x7fffffff;
    }
    bitonic(val, idx, p);
    for (int i = threadIdx.x; i < kk; i += blockDim.x) {
        out_v[(long long)b * kk + i] = val[i];
        out_i[(long long)b * kk + i] = idx[i];
    }
}
"""


# ---------------------------------------------------------------------------------------------
# numpy references: what each kernel computes
# ---------------------------------------------------------------------------------------------
def rms_scale(x: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def linear_reference(
    x: np.ndarray, w: np.ndarray, *, norm_w: np.ndarray | None = None, eps: float = 1e-6,
    bias: np.ndarray | None = None, swiglu: bool = False, residual: np.ndarray | None = None,
) -> np.ndarray:  # fmt: skip
    """``linear`` for rows x [T, K], w [N or 2N, K] (float64 result)."""
    x = x.astype(np.float64)
    if norm_w is not None:
        x = x * rms_scale(x, eps) * norm_w.astype(np.float64)
    y = x @ w.astype(np.float64).T
    if swiglu:
        gate, up = np.split(y, 2, axis=-1)
        y = gate / (1.0 + np.exp(-gate)) * up
    if bias is not None:
        y = y + bias
    return y if residual is None else residual.astype(np.float64) + y


def rotary_angles(
    positions: np.ndarray, inv_freq: np.ndarray, freq_axis: np.ndarray | None
) -> np.ndarray:
    """[T, D/2] angles: positions [axes, T] (float32 products, as the kernel and export form)."""
    axis = np.zeros(len(inv_freq), np.int64) if freq_axis is None else freq_axis
    pos = positions.astype(np.float32)[axis]  # [D/2, T]
    return (pos * inv_freq.astype(np.float32)[:, None]).T.astype(np.float64)


def qk_rope_reference(
    qkv: np.ndarray, positions: np.ndarray, *, heads: int, kv_heads: int, head_dim: int,
    inv_freq: np.ndarray, q_norm: np.ndarray | None, k_norm: np.ndarray | None,
    eps: float = 1e-6, freq_axis: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """``qk_rope`` for qkv [T, (heads + 2 kv_heads) * D]: q [T, heads*D], k, v (float64)."""
    t, d = qkv.shape[0], head_dim
    x = qkv.astype(np.float64).reshape(t, heads + 2 * kv_heads, d)
    q, k, v = x[:, :heads], x[:, heads : heads + kv_heads], x[:, heads + kv_heads :]
    angles = rotary_angles(positions, inv_freq, freq_axis)
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None]

    def norm_rope(h: np.ndarray, w: np.ndarray | None) -> np.ndarray:
        if w is not None:
            h = h * rms_scale(h, eps) * w
        rotated = np.concatenate([-h[..., d // 2 :], h[..., : d // 2]], -1)
        return (h * cos + rotated * sin).reshape(t, -1)

    return norm_rope(q, q_norm), norm_rope(k, k_norm), v.reshape(t, -1)


def topk_reference(
    logits: np.ndarray, k: int, bias: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``k`` best (value descending, lower id first among equals)."""
    scores = logits.astype(np.float32) + (0 if bias is None else bias.astype(np.float32))
    scores = np.where(np.isnan(scores), -np.inf, scores)
    order = np.lexsort((np.broadcast_to(np.arange(scores.shape[1]), scores.shape), -scores))
    order = order[:, :k]
    return np.take_along_axis(scores, order, 1), order.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# loading and launching
# ---------------------------------------------------------------------------------------------
def cubin(source: str, arch: str) -> bytes:
    """NVRTC's cubin for ``source``, kept in the kernel cache (``$EDGEOMNI_KERNEL_CACHE``, else
    ~/.cache/edgeomni/kernels; "" turns it off) by a hash of the source, the architecture and
    NVRTC's version, so an engine loads in milliseconds after its first load (NVRTC takes
    seconds). A cache that cannot be written is passed over: the cubin is compiled each time."""
    cache = os.environ.get("EDGEOMNI_KERNEL_CACHE")
    folder = Path(cache) if cache else Path.home() / ".cache" / "edgeomni" / "kernels"
    nvrtc = ac._nvrtc()
    version = ".".join(str(v) for v in nvrtc.nvrtcVersion()[1:])
    key = hashlib.sha256(f"{arch}\0{version}\0{source}".encode()).hexdigest()[:32]
    path = folder / f"{key}.cubin"
    if cache != "" and path.is_file():
        return path.read_bytes()
    image = ac.compile_cubin(source, arch)
    if cache != "":
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(image)
            tmp.replace(path)
    return image


_LOADED: dict[tuple[Variant, int], DecoderKernels] = {}


def kernels_for(variant: Variant) -> DecoderKernels:
    """The variant's kernels in the current context's device, compiled and loaded once a
    process (a talker and its code predictor share them)."""
    cu = ac._driver()
    key = (variant, int(ac.check(cu.cuCtxGetDevice(), "cuCtxGetDevice")))
    if key not in _LOADED:
        _LOADED[key] = DecoderKernels(variant)
    return _LOADED[key]


class DecoderKernels:
    """The compiled module of one ``Variant``, loaded into the current CUDA context; ``launch``
    queues a kernel by name with its arguments as ctypes values."""

    def __init__(self, variant: Variant) -> None:
        cu = ac._driver()
        self.variant = variant
        self.source = variant.source()
        major, minor = compute_capability()
        self.image = cubin(self.source, f"sm_{major}{minor}")
        self.module = ac.check(cu.cuModuleLoadData(self.image), "cuModuleLoadData")
        self._functions: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        if name not in self._functions:
            cu = ac._driver()
            self._functions[name] = ac.check(
                cu.cuModuleGetFunction(self.module, name.encode()), f"cuModuleGetFunction {name}"
            )
        return self._functions[name]

    def launch(
        self, name: str, grid: Sequence[int], block: int, args: Sequence[Any], *,
        shared: int = 0, stream: Any = 0,
    ) -> None:  # fmt: skip
        cu = ac._driver()
        values = list(args)
        ptrs = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        gx, gy, gz = (*grid, 1, 1)[:3]
        ac.check(
            cu.cuLaunchKernel(self.function(name), gx, gy, gz, block, 1, 1, shared, stream,
                              ctypes.addressof(ptrs), 0),
            f"cuLaunchKernel {name} grid {tuple(grid)} block {block}",
        )  # fmt: skip

    def close(self) -> None:
        if getattr(self, "module", None) is not None:
            ac.check(ac._driver().cuModuleUnload(self.module), "cuModuleUnload")
            self.module = None


def compute_capability() -> tuple[int, int]:
    """The current context's device's (major, minor)."""
    cu = ac._driver()
    device = ac.check(cu.cuCtxGetDevice(), "cuCtxGetDevice")
    attr = cu.CUdevice_attribute
    return tuple(
        ac.check(cu.cuDeviceGetAttribute(a, device), "cuDeviceGetAttribute")
        for a in (attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                  attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    )  # fmt: skip


def ptr(value: int | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(int(value) if value else None)


def i32(value: int) -> ctypes.c_int32:
    return ctypes.c_int32(int(value))


def i64(value: int) -> ctypes.c_int64:
    return ctypes.c_int64(int(value))


def f32(value: float) -> ctypes.c_float:
    return ctypes.c_float(float(value))
