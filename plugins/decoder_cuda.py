"""CUDA C kernels for a dense Qwen3-style decoder step, compiled by NVRTC at load time.

The fused backend (runtime/fused_engine.py) runs each layer of a ``decoder.CausalLM`` as five
launches of these kernels and the attention kernel of plugins/attention_cuda.py:

1. ``linear`` (plugins/decoder_linear_cuda.py) with the input norm: ``qkv = rmsnorm(h) @
   Wqkv^T`` (the norm's row scale comes from the same pass over ``h`` that feeds the dot
   products: no normed copy is written);
2. ``qk_rope``: q/k RMSNorm per head, rotary (1-D or interleaved MRoPE), q, k and v in the cache's
   type, ready for the attention kernel, which writes the new keys and values into the cache in
   place and attends;
3. ``linear`` with the residual: ``h += attn @ Wo^T``;
4. ``linear`` with the post-attention norm and SwiGLU: ``act = silu(gate) * up``, gate and up
   rows of the packed matrix read by the same warp;
5. ``linear`` with the residual: ``h += act @ Wdown^T``.

The last norm and the LM head are one more ``linear`` over each row's ``last_indices`` position,
and ``topk_one`` (a vocabulary of one chunk) or ``topk_chunks`` + ``topk_merge`` reduce the
logits to each row's top K on the device: each block radix-selects its chunk's K best (8 bits at
a time, then the lowest ids among equals) and sorts only those. The same kernels write a float16
build's float16 logits and top-K values, and, in a build with an in-engine sampler, draw each
row's next id from its top K (``draw_row``) and gather that id's embedding for the next call.

Activations are float32 (the residual stream, q/k before rotary, SwiGLU's output); weights are
float16 or float32, read as stored; accumulation is float32. Every kernel calls GRID_LAUNCH and
GRID_WAIT first, so the engine queues them as programmatic dependent launches on sm_90+. Each
kernel has a numpy ``*_reference`` (here or in decoder_linear_cuda.py) giving its meaning.
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
from edgeomni.plugins import decoder_gemm_cuda as gemm
from edgeomni.plugins import decoder_linear_cuda as lc
from edgeomni.plugins import gated_delta_cuda as gdc
from edgeomni.plugins import moe_cuda
from edgeomni.plugins import speech_draw_cuda as sdc
from edgeomni.plugins.attention_source import ROPE_SOURCE, SHARED_SOURCE
from edgeomni.plugins.decoder_linear_cuda import rms_scale

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
                   "A_HALF": int(self.attention == "float16"), "MAX_KW": lc.MAX_WARPS,
                   "TOPK_CHUNK": TOPK_CHUNK, "TOPK_MAX": TOPK_MAX, "MOE_ROWS": moe_cuda.MOE_ROWS,
                   "MOE_SLOTS": moe_cuda.MOE_SLOTS, "CONV_MAX_K": gdc.CONV_MAX_K,
                   "DELTA_WARPS": gdc.DELTA_WARPS, "DELTA_LANE": gdc.DELTA_LANE,
                   "G_TILE": gemm.GEMM_TILE, "G_K": gemm.GEMM_K,
                   "G_THREADS": gemm.GEMM_THREADS}  # fmt: skip
        head = "// edgeomni fused decoder kernels (plugins/decoder_cuda.py)\n"
        body = (_HEAD + lc.SOURCE + gemm.SOURCE + ROPE_SOURCE + _TAIL + moe_cuda.SOURCE
                + gdc.SOURCE + sdc.SOURCE)
        return head + "".join(f"#define {k} {v}\n" for k, v in defines.items()) + body


_HEAD = r"""
typedef unsigned short half_t;
#define NEG_INF __int_as_float(0xff800000)
""" + SHARED_SOURCE + r"""
#ifndef DECODER_HOST_EMULATION  // tests/test_fused_kernels_host.py defines these for g++
__device__ __forceinline__ float h2f(half_t h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ half_t f2h(float f) {
    half_t h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
#endif
#ifndef DYNAMIC_SHARED
#define DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif
#if W_HALF
typedef half_t wt_t;
#define WVEC 8
__device__ __forceinline__ float w2f(wt_t w) { return h2f(w); }
#else
typedef float wt_t;
#define WVEC 4
__device__ __forceinline__ float w2f(wt_t w) { return w; }
#endif
#if A_HALF
typedef half_t at_t;
__device__ __forceinline__ at_t to_at(float f) { return f2h(f); }
#else
typedef float at_t;
__device__ __forceinline__ at_t to_at(float f) { return f; }
#endif

#if defined(DECODER_HOST_EMULATION) || !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
#define GRID_WAIT()
#define GRID_LAUNCH()
#else
// programmatic dependent launch (sm_90+): a kernel launched with the attribute may start while
// the kernel before it runs; it reads only weights and the call's inputs before GRID_WAIT(),
// which returns once everything queued before it has finished and its writes are visible
#define GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define GRID_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" :::)
#endif

template <bool XHALF>
__device__ __forceinline__ void load_x4(const void* base, long long at, float* out) {
    if (XHALF) {
        uint2 raw = *reinterpret_cast<const uint2*>(reinterpret_cast<const half_t*>(base) + at);
        const half_t* e = reinterpret_cast<const half_t*>(&raw);
#pragma unroll
        for (int i = 0; i < 4; ++i) out[i] = h2f(e[i]);
    } else {
        float4 v = *reinterpret_cast<const float4*>(reinterpret_cast<const float*>(base) + at);
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

"""

_TAIL = r"""
// Block (t, y) takes token t's heads y * warps, + warps * gridDim.y, ..., one warp a head
// (several blocks a token: one token's heads at once, where one block took 4 in turn): q and k
// heads get their RMSNorm (weights qn, kn; none when null) and rotary of their first R dims
// (R = D: all), v heads are copied; all written in the attention's type (stage_row and
// rope_elem: the fused decode attention's too). ``gated`` (Qwen3.5): each q head of the
// product is followed by its output gate's D values (attn_gate reads them).
extern "C" __global__ void qk_rope(
    const float* __restrict__ qkv, const long long* __restrict__ pos, int tokens,
    const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ inv_freq, const int* __restrict__ freq_axis,
    at_t* q, at_t* k, at_t* v, int HQ, int HKV, int D, int gated, int R)
{
    DYNAMIC_SHARED(float, buf);
    GRID_LAUNCH();
    GRID_WAIT();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const int t = blockIdx.x, heads = HQ + 2 * HKV, qd = gated ? 2 * D : D;
    const long long row = (long long)t * ((long long)HQ * qd + 2LL * HKV * D);
    float* hb = buf + warp * D;
    for (int h = blockIdx.y * warps + warp; h < heads; h += warps * gridDim.y) {
        const float* src = qkv + row + (h < HQ ? (long long)h * qd
                                               : (long long)HQ * qd + (long long)(h - HQ) * D);
        if (h >= HQ + HKV) {
            at_t* dst = v + ((long long)t * HKV + (h - HQ - HKV)) * D;
            for (int i = lane; i < D; i += 32) dst[i] = to_at(src[i]);
            continue;
        }
        const float* nw = h < HQ ? qn : kn;
        const float scale = stage_row(src, hb, D, nw, eps);
        at_t* dst = h < HQ ? q + ((long long)t * HQ + h) * D
                           : k + ((long long)t * HKV + (h - HQ)) * D;
        for (int i = lane; i < D; i += 32)
            dst[i] = to_at(i < R ? rope_elem(hb, i, R, scale, nw, pos, tokens, t, inv_freq,
                                             freq_axis)
                                 : hb[i] * scale * (nw ? nw[i] : 1.0f));
    }
}

// out[r, :] = rmsnorm(x[row r]) * w: each row's last position (rowmap) normed, for last_hidden.
extern "C" __global__ void rms_rows(
    const float* __restrict__ x, const long long* __restrict__ rowmap, int seq,
    const float* __restrict__ w, float eps, float* __restrict__ out, int H)
{
    SHARED_BEGIN;
    SHARED(float, part, [32]);
    GRID_LAUNCH();
    GRID_WAIT();
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
    GRID_LAUNCH();
    GRID_WAIT();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] += d[i];
}
extern "C" __global__ void add_into_h(float* h, const half_t* __restrict__ d, long long n) {
    GRID_LAUNCH();
    GRID_WAIT();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) h[i] += h2f(d[i]);
}

// a codec frame's summed embedding where its codes were drawn (runtime/speech/code_predictor.py):
// out[r] = base[r] + tables[0][codes[0, r]] + ... + tables[G-1][codes[G-1, r]] (+ add[r]),
// float32 adds in that order (the host's sum, bit for bit), stored as float32 or float16 (the
// next call's input type). An id outside the vocabulary (an undecided draw, -1) adds nothing:
// the caller redraws that frame on the host. grid (ceil(width / 256), rows), block 256.
extern "C" __global__ void frame_sum(const float* __restrict__ base, const float* __restrict__ add,
                                     const long long* __restrict__ codes,
                                     const wt_t* __restrict__ tables, int groups, int rows,
                                     int vocab, int width, int half_out, void* out) {
    GRID_LAUNCH();
    GRID_WAIT();
    const int r = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    const long long o = (long long)r * width + c;
    float t = base[o];
    for (int g = 0; g < groups; ++g) {
        const long long id = codes[(long long)g * rows + r];
        if (id >= 0 && id < vocab) t += w2f(tables[((long long)g * vocab + id) * width + c]);
    }
    if (add) t += add[o];
    if (half_out) ((half_t*)out)[o] = f2h(t);
    else ((float*)out)[o] = t;
}

// the engine's float16 inputs and outputs (the ONNX build's types) to and from float32
extern "C" __global__ void half_to_float(float* out, const half_t* __restrict__ in, long long n) {
    GRID_LAUNCH();
    GRID_WAIT();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = h2f(in[i]);
}
extern "C" __global__ void float_to_half(half_t* out, const float* __restrict__ in, long long n) {
    GRID_LAUNCH();
    GRID_WAIT();
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

// the float's order as an unsigned key: a larger float, a larger key
__device__ __forceinline__ unsigned order_key(float v) {
    unsigned u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

#define TOPK_THREADS 512
#define TOPK_PER (TOPK_CHUNK / TOPK_THREADS)

// Radix select, one 8-bit digit at a time from the top: the digit d of the keys matching
// (key & mask) == prefix at which the count of keys, from the best digit down, reaches need
// (DESC: the largest keys are the best; else the smallest). Warp 0 finds d from the block's
// histogram; every thread returns it with the count of keys strictly better (in *above) and
// equal (in *equal) at this digit.
template <bool DESC>
__device__ int select_digit(const unsigned* keys, unsigned prefix, unsigned mask, int shift,
                            int need, int* hist, int* scratch, int* above, int* equal) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < TOPK_PER; ++j)
        if ((keys[j] & mask) == prefix) atomicAdd(&hist[(keys[j] >> shift) & 255u], 1);
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        // lane l holds the 8 digits of rank 8l .. 8l+7 in best-first order
        int sum = 0;
        for (int r = 0; r < 8; ++r) sum += hist[DESC ? 255 - (8 * lane + r) : 8 * lane + r];
        scratch[lane] = sum;
        __syncwarp();
        int before_me = 0;
        for (int l = 0; l < lane; ++l) before_me += scratch[l];
        if (before_me < need && before_me + sum >= need) {
            int acc = before_me;
            for (int r = 0; r < 8; ++r) {
                const int d = DESC ? 255 - (8 * lane + r) : 8 * lane + r;
                if (acc + hist[d] >= need) { scratch[32] = d; scratch[33] = acc; break; }
                acc += hist[d];
            }
        }
    }
    __syncthreads();
    const int d = scratch[32];
    *above = scratch[33];
    *equal = hist[d];
    __syncthreads();  // hist and scratch are reused by the next call
    return d;
}

// The kk best of the block's TOPK_CHUNK (value, id) pairs, TOPK_PER a thread (the higher value,
// then the lower id, first), written sorted to out_v/out_i[0 .. kk). Radix select finds the
// kk-th best key (and among its equals the lowest ids), the chosen kk are gathered and sorted:
// a few hundred shared-memory operations a thread, where sorting all 4096 took ~80 passes.
template <typename IdT>
__device__ void block_topk(const float* v, const int* id, int kk, float* out_v, IdT* out_i,
                           half_t* out_h) {
    SHARED_BEGIN_INNER;
    SHARED(int, hist, [256]);
    SHARED(int, scratch, [34]);
    SHARED(float, sv, [TOPK_MAX]);
    SHARED(int, si, [TOPK_MAX]);
    SHARED(int, taken, );
    SHARED(int, taken_eq, );
    unsigned keys[TOPK_PER], ids[TOPK_PER];
#pragma unroll
    for (int j = 0; j < TOPK_PER; ++j) { keys[j] = order_key(v[j]); ids[j] = (unsigned)id[j]; }
    unsigned prefix = 0u, mask = 0u;
    int need = kk, above = 0, equal = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        const int d = select_digit<true>(keys, prefix, mask, shift, need, hist, scratch, &above,
                                         &equal);
        prefix |= (unsigned)d << shift;
        mask |= 255u << shift;
        need -= above;
    }
    const unsigned t = prefix;  // the kk-th best key: take every better one and need of its equals
    unsigned id_prefix = 0u, id_mask = 0u;
    int id_need = need;
    const bool ties = equal > need;
    if (ties) {  // the lowest ids among keys == t: the same select over the ids, smallest first
        unsigned masked[TOPK_PER];
#pragma unroll
        for (int j = 0; j < TOPK_PER; ++j) masked[j] = keys[j] == t ? ids[j] : 0xffffffffu;
        for (int shift = 24; shift >= 0; shift -= 8) {
            const int d = select_digit<false>(masked, id_prefix, id_mask, shift, id_need, hist,
                                              scratch, &above, &equal);
            id_prefix |= (unsigned)d << shift;
            id_mask |= 255u << shift;
            id_need -= above;
        }
    }
    int p2 = 1;
    while (p2 < kk) p2 <<= 1;
    if (threadIdx.x == 0) { taken = 0; taken_eq = 0; }
    for (int i = threadIdx.x; i < p2; i += blockDim.x) { sv[i] = NEG_INF; si[i] = 0x7fffffff; }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < TOPK_PER; ++j) {
        bool take = keys[j] > t;
        if (keys[j] == t) {
            if (!ties) take = true;
            else if (ids[j] < id_prefix) take = true;
            else if (ids[j] == id_prefix) take = atomicAdd(&taken_eq, 1) < id_need;
        }
        if (take) {
            const int slot = atomicAdd(&taken, 1);
            if (slot < kk) { sv[slot] = key_value(keys[j]); si[slot] = (int)ids[j]; }
        }
    }
    bitonic(sv, si, p2);
    for (int i = threadIdx.x; i < kk; i += blockDim.x) {
        out_v[i] = sv[i];
        out_i[i] = (IdT)si[i];
        if (out_h) out_h[i] = f2h(sv[i]);
    }
}

// Block (c, b)'s TOPK_PER logits a thread, of logits [b, c*CHUNK .. +CHUNK) (+ bias: -inf for ids
// held out; NaN as -inf). Where logits_h is given (a float16 build's logits output, written here
// rather than by a kernel of its own) each logit goes there in float16 and the top K is of
// those float16 values: the top K of the logits the engine outputs, with their ties, as the
// host would take it from them and as an ONNX float16 build's TopK does.
__device__ __forceinline__ void load_chunk(const float* __restrict__ logits,
                                           const float* __restrict__ bias, int V, int c, int b,
                                           half_t* logits_h, float* v, int* id) {
#pragma unroll
    for (int j = 0; j < TOPK_PER; ++j) {
        const int i = c * TOPK_CHUNK + threadIdx.x + j * TOPK_THREADS;
        float s = NEG_INF;
        if (i < V) {
            float raw = logits[(long long)b * V + i];
            if (logits_h) {
                const half_t h = f2h(raw);
                logits_h[(long long)b * V + i] = h;
                raw = h2f(h);
            }
            s = raw + (bias ? bias[i] : 0.f);
            if (s != s) s = NEG_INF;
        }
        v[j] = s; id[j] = i < V ? i : 0x7fffffff;
    }
}

// Row b's draw from its top K as the top-K kernels leave it (values descending, the lower id
// first among equals), as runtime/sampling.py draws from the same candidates and export/common/
// sampler.py does in an ONNX engine: the candidates are the values >= the top_k-th (ties stay),
// their softmax at the temperature in float64, top-p keeps those whose preceding mass is below
// top_p, and uniform[b] picks one of the kept by their renormalised cumulative mass. A row the
// K cannot decide (its top_k-th value is not above ``floor_value``, the K-th before any change:
// an id outside the K may tie it) draws -1.
// The drawn id's embedding, row head * V + id of tables [heads * V, H] (id 0 for -1), goes to
// embeds [B, H] for the next call. The whole block calls it after its top-K is written (and
// synchronised); the exponentials and divisions are spread over its threads, the running sums
// are thread 0's, in candidate order.
#define DRAW_PARAMS const double* __restrict__ uniform, const double* __restrict__ temperature, \
    const long long* __restrict__ top_k, const double* __restrict__ top_p, \
    const long long* __restrict__ head, const wt_t* __restrict__ tables, int H, \
    long long* __restrict__ drawn, wt_t* __restrict__ embeds
#define DRAW_ARGS uniform, temperature, top_k, top_p, head, tables, H, drawn, embeds
__device__ void draw_row(int b, const float* x, const long long* ids, int K, int V, float floor_value,
                         DRAW_PARAMS) {
    SHARED_BEGIN_INNER;
    SHARED(double, e, [TOPK_MAX]);
    SHARED(double, total, );
    SHARED(int, kept, );
    SHARED(long long, pick, );
    long long kk = top_k[0];
    kk = kk < 1 ? 1 : (kk > K ? K : kk);
    const float kth = x[kk - 1];
    const double t = temperature[0];
    const double z0 = (double)x[0] / t;
    for (int i = threadIdx.x; i < K; i += blockDim.x)
        e[i] = x[i] >= kth ? exp((double)x[i] / t - z0) : 0.0;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int i = 0; i < K; ++i) s += e[i];
        total = s;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < K; i += blockDim.x) e[i] = e[i] / total;  // p
    __syncthreads();
    if (threadIdx.x == 0) {
        int count = 0;
        while (count < K && x[count] >= kth) ++count;  // the candidates: a prefix
        int m = count;
        if (top_p[0] < 1.0) {  // each candidate whose preceding mass (cumsum - p) is below top_p
            double run = 0.0;
            m = 0;
            for (int i = 0; i < count; ++i) {
                run += e[i];
                m += (run - e[i]) < top_p[0];
            }
        }
        double s = 0.0;
        for (int i = 0; i < m; ++i) s += e[i];
        total = s;
        kept = m;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kept; i += blockDim.x) e[i] = e[i] / total;  // q
    __syncthreads();
    if (threadIdx.x == 0) {
        double run = 0.0;
        for (int i = 0; i < kept; ++i) { run += e[i]; e[i] = run; }  // the cdf
        const double point = uniform[b] * run;
        int below = 0;
        for (int i = 0; i < kept; ++i) below += e[i] <= point;
        below = below < kept - 1 ? below : kept - 1;
        pick = kth > floor_value ? ids[below] : -1LL;
        drawn[b] = pick;
    }
    __syncthreads();
    const long long row = (head ? head[0] : 0LL) * V + (pick < 0 ? 0LL : pick);
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        embeds[(long long)b * H + i] = tables[row * H + i];
}

// One block a row, where the logits are one chunk (V <= TOPK_CHUNK): the row's best kk written
// sorted to out_v/out_i (and out_h in float16, where given), then its draw where uniform is
// given (DRAW_PARAMS; null: no draw).
extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_one(
    const float* __restrict__ logits, const float* __restrict__ bias, int V, int kk,
    half_t* logits_h, float* out_v, long long* out_i, half_t* out_h, DRAW_PARAMS)
{
    GRID_LAUNCH();
    GRID_WAIT();
    const int b = blockIdx.y;
    float v[TOPK_PER];
    int id[TOPK_PER];
    load_chunk(logits, bias, V, 0, b, logits_h, v, id);
    const long long at = (long long)b * kk;
    block_topk<long long>(v, id, kk, out_v + at, out_i + at, out_h ? out_h + at : nullptr);
    __syncthreads();
    if (uniform) draw_row(b, out_v + at, out_i + at, kk, V, out_v[at + kk - 1], DRAW_ARGS);
}

// pass 1 of a larger vocabulary: block (c, b) keeps the best kk of its chunk in cand_v/cand_i
// [b, c, kk]
extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_chunks(
    const float* __restrict__ logits, const float* __restrict__ bias, int V, int kk,
    half_t* logits_h, float* cand_v, int* cand_i)
{
    GRID_LAUNCH();
    GRID_WAIT();
    const int c = blockIdx.x, b = blockIdx.y, chunks = gridDim.x;
    float v[TOPK_PER];
    int id[TOPK_PER];
    load_chunk(logits, bias, V, c, b, logits_h, v, id);
    const long long at = ((long long)b * chunks + c) * kk;
    block_topk<int>(v, id, kk, cand_v + at, cand_i + at, nullptr);
}

// pass 2: block b takes its row's n candidates (n <= TOPK_CHUNK) and writes the best kk (and,
// where given, their float16 values and the row's draw, as topk_one)
extern "C" __global__ void __launch_bounds__(TOPK_THREADS) topk_merge(
    const float* __restrict__ cand_v, const int* __restrict__ cand_i, int n, int kk,
    float* out_v, long long* out_i, half_t* out_h, int V, DRAW_PARAMS)
{
    GRID_LAUNCH();
    GRID_WAIT();
    const int b = blockIdx.x;
    float v[TOPK_PER];
    int id[TOPK_PER];
#pragma unroll
    for (int j = 0; j < TOPK_PER; ++j) {
        const int i = threadIdx.x + j * TOPK_THREADS;
        v[j] = i < n ? cand_v[(long long)b * n + i] : NEG_INF;
        id[j] = i < n ? cand_i[(long long)b * n + i] : 0x7fffffff;
    }
    const long long at = (long long)b * kk;
    block_topk<long long>(v, id, kk, out_v + at, out_i + at, out_h ? out_h + at : nullptr);
    __syncthreads();
    if (uniform) draw_row(b, out_v + at, out_i + at, kk, V, out_v[at + kk - 1], DRAW_ARGS);
}
"""


# ---------------------------------------------------------------------------------------------
# numpy references: what each kernel computes
# ---------------------------------------------------------------------------------------------
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
    eps: float = 1e-6, freq_axis: np.ndarray | None = None, gated: bool = False,
    rotary_dim: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """``qk_rope`` for qkv [T, (heads + 2 kv_heads) * D]: q [T, heads*D], k, v (float64).
    ``gated`` (Qwen3.5): each q head is followed by its output gate, [T, heads * 2D + ...];
    ``rotary_dim``: rope on each head's first dims alone (the rest pass through, normed)."""
    t, d = qkv.shape[0], head_dim
    x = qkv.astype(np.float64).reshape(t, -1)
    width = (2 if gated else 1) * heads * d
    q = x[:, :width].reshape(t, heads, -1)[..., :d]
    kv = x[:, width:].reshape(t, 2 * kv_heads, d)
    k, v = kv[:, :kv_heads], kv[:, kv_heads:]
    r = rotary_dim or d
    angles = rotary_angles(positions, inv_freq, freq_axis)
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None]

    def norm_rope(h: np.ndarray, w: np.ndarray | None) -> np.ndarray:
        if w is not None:
            h = h * rms_scale(h, eps) * w
        part = h[..., :r]
        rotated = np.concatenate([-part[..., r // 2 :], part[..., : r // 2]], -1)
        return np.concatenate([part * cos + rotated * sin, h[..., r:]], -1).reshape(t, -1)

    return norm_rope(q, q_norm), norm_rope(k, k_norm), v.reshape(t, -1)


def attn_gate_reference(attn: np.ndarray, qkv: np.ndarray, heads: int,
                        head_dim: int) -> np.ndarray:  # fmt: skip
    """Gated attention's output (Qwen3.5): attn [T, heads*D] times sigmoid of each head's gate,
    the D values after its q in a gated qkv product [T, heads * 2D + ...]."""
    t, d = attn.shape[0], head_dim
    gate = qkv.astype(np.float64)[:, : 2 * heads * d].reshape(t, heads, 2 * d)[..., d:]
    return attn * (1.0 / (1.0 + np.exp(-gate.reshape(t, -1))))


def topk_reference(
    logits: np.ndarray, k: int, bias: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``k`` best (value descending, lower id first among equals)."""
    scores = logits.astype(np.float32) + (0 if bias is None else bias.astype(np.float32))
    scores = np.where(np.isnan(scores), -np.inf, scores)
    order = np.lexsort((np.broadcast_to(np.arange(scores.shape[1]), scores.shape), -scores))
    order = order[:, :k]
    return np.take_along_axis(scores, order, 1), order.astype(np.int64)


def sample_reference(
    values: np.ndarray, ids: np.ndarray, uniform: np.ndarray, *, temperature: float,
    top_k: int, top_p: float, tables: np.ndarray | None = None, head: int = 0,
    floor: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:  # fmt: skip
    """``draw_row`` (after ``topk_one`` or ``topk_merge``): each row's drawn id from its sorted top K (values [B, K] descending,
    ids [B, K]), -1 where the K cannot decide, and the drawn ids' rows of ``tables`` [heads, V,
    H] (row 0 for -1). Sums run in candidate order, as the kernel's thread 0 adds them.
    ``floor`` [B]: each row's value a drawn row's top_k-th must exceed (default its K-th)."""
    n, k = values.shape
    kk = min(max(int(top_k), 1), k)
    out = np.empty(n, np.int64)
    for b in range(n):
        x = values[b].astype(np.float64)
        kth = x[kk - 1]
        e = np.where(x >= kth, np.exp(x / temperature - x[0] / temperature), 0.0)
        p = e / np.cumsum(e)[-1]
        count = int(np.count_nonzero(x >= kth))
        m = count
        if top_p < 1.0:
            m = int(np.count_nonzero(np.cumsum(p[:count]) - p[:count] < top_p))
        q = p[:m] / np.cumsum(p[:m])[-1]
        cdf = np.cumsum(q)
        below = min(int(np.count_nonzero(cdf <= uniform[b] * cdf[-1])), m - 1)
        out[b] = ids[b, below] if kth > (x[-1] if floor is None else floor[b]) else -1
    rows = None if tables is None else tables[head][np.maximum(out, 0)]
    return out, rows


def frame_sum_reference(
    base: np.ndarray, codes: np.ndarray, tables: np.ndarray, add: np.ndarray | None = None
) -> np.ndarray:
    """``frame_sum``: base [n, W] (float32) plus each group's table row tables[g][codes[g]]
    (codes [G, n], tables [G, V, W] float32 or float16, ids outside V adding nothing), then
    ``add`` [n, W]: float32 adds in that order, the host's frame sum."""
    total = base.astype(np.float32)  # a copy
    for g in range(len(codes)):
        ids = codes[g]
        ok = (ids >= 0) & (ids < tables.shape[1])
        total += np.where(ok[:, None], tables[g][np.where(ok, ids, 0)].astype(np.float32), 0)
    if add is not None:
        total += add.astype(np.float32)
    return total


def frame_sum_launch(rows: int, width: int) -> tuple[tuple[int, int], int]:
    """``frame_sum``'s grid and block: a thread a column, a block row of them a frame row."""
    return (-(-width // 256), rows), 256


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
        shared: int = 0, stream: Any = 0, overlap: bool = False,
    ) -> None:  # fmt: skip
        """``overlap``: a programmatic dependent launch (sm_90+), which may start while the
        kernel queued before it still runs: it fetches its first weights, then waits in
        GRID_WAIT() for everything queued before it. Only for kernels of this module queued
        after another kernel of this module or the attention kernel (the one before must call
        GRID_LAUNCH for any overlap to happen; one that does not simply finishes first)."""
        ac.launch_kernel(self.function(name), grid, block, shared, stream, list(args),
                         overlap=overlap, what=name)  # fmt: skip

    def close(self) -> None:
        if getattr(self, "module", None) is not None:
            ac.check(ac._driver().cuModuleUnload(self.module), "cuModuleUnload")
            self.module = None


def rope_launch(tokens: int, heads: int, head_dim: int,
                warps: int | None = None) -> tuple[tuple[int, int], int, int]:  # fmt: skip
    """``qk_rope``'s grid, block and dynamic shared memory for ``heads`` q, k and v heads a
    token: a block a token and group of ``warps`` heads (default up to 8), a warp a head."""
    warps = warps or min(8, heads)
    return (tokens, -(-heads // warps)), 32 * warps, warps * head_dim * 4


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
