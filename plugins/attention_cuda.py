"""CUDA C kernel for edgeomni::CachedAttention, compiled by NVRTC through cuda-python.

The kernel behind the op's TensorRT plugin (shared/notes/tensorrt.md §2, §7): a
``tensorrt.plugin`` AOT implementation returns one PTX kernel per call, passes only integer
extra arguments and does not serialize attributes, so everything the op's attributes say (head
counts, head size, scale, window, causal, the float type) is baked into the generated source as
``#define``s, and a launch takes pointers plus the int32 sizes B, S and C. The same function
(``launch_params``) gives the grid a TensorRT AOT implementation fills ``KernelLaunchParams``
with; pass it ``trtp.cdiv`` there so the grid stays a symbolic expression.

One kernel serves prefill, chunked prefill and decode, with per-row lengths (plugins/attention.py
is the specification; its ``reference`` is the numpy meaning):

- Grid ``(ceil(S / WARPS), num_heads / HB, B)``, ``32 * WARPS`` threads. A block takes up to
  WARPS query positions of one row and HB query heads of one kv head (HB divides the GQA group,
  so a key row read once serves HB heads). Positions are split among the warps; when the block
  has fewer positions than warps (decode: one), the spare warps split that position's keys
  (powers of two), and their partial softmax states are merged in shared memory, in a fixed
  order (deterministic).
- Each warp runs an online softmax (float32, exp2 with the scale folded into q) over chunks of
  32 keys: each lane dots one key with the HB queries (held in shared memory, as float), then
  the lanes turn to the values, each accumulating a slice of the head dimension.
- Keys below a row's ``past_lens`` are read from the cache; the new tokens' keys and values are
  read from the ``k``/``v`` inputs directly, never from the cache slots this launch writes. Those
  slots (``past + i`` for ``i < query_lens``) are written by exactly one block each (head slice
  0 of the block whose positions hold token ``i``) with a bit-exact copy, so no block reads what
  another writes, and every other cache slot is left as it was.
- ``out`` is written in full: positions at or past a row's ``query_lens`` (and whole idle rows)
  get zeros. Lengths outside the op's contract are clamped so that nothing is written out of
  bounds (``past`` to [0, C], new tokens to [0, min(S, C - past)]).

Kernel parameters, in TensorRT's AOT order (tensor inputs, integer extras, tensor outputs):
``q, k, v, past_key, past_value, past_lens, query_lens, B, S, C, out, present_key,
present_value``. ``present_*`` must be the same buffers as ``past_*`` (the op's in-place
contract, TensorRT's aliased plugin I/O): the kernel writes only the new slots.

No torch, CuPy or Triton: ``cuda.bindings.nvrtc`` compiles, ``cuda.bindings.driver`` loads and
launches (``CudaAttention``, for tests and benchmarks; plugins/cuda_driver.py, re-exported here).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edgeomni.plugins.cuda_driver import (  # noqa: F401 (re-exported: callers use ac.*)
    KernelError,
    _driver,
    _nvrtc,
    check,
    compile_cubin,
    compile_ptx,
    launch_kernel,
    stream_handle,
)

KERNEL_NAME = "edgeomni_cached_attention"
DTYPES = {"float16": 2, "float32": 4}
# the kernel's parameters, in order (see the module docstring)
PARAMS = ("q", "k", "v", "past_key", "past_value", "past_lens", "query_lens",
          "batch", "seq", "capacity", "out", "present_key", "present_value")  # fmt: skip
_STATIC_SHARED_LIMIT = 48 * 1024  # static shared memory needs no opt-in attribute up to this
_LOG2E = 1.0 / math.log(2.0)


@dataclass(frozen=True)
class KernelConfig:
    """Everything baked into one compiled kernel: the op's attributes, the float type, and two
    tuning knobs. ``heads_per_block`` (0: ``default_heads_per_block``) trades key reuse (a key
    row read once per HB heads) against the number of blocks, which a decode call at small
    batch needs to fill the GPU; ``warps`` is positions per block and key splits per position."""

    num_heads: int
    kv_num_heads: int
    head_dim: int
    dtype: str = "float16"
    scale: float = 0.0
    window: int = 0
    causal: int = 1
    heads_per_block: int = 0
    warps: int = 8
    # decode calls (seq 1) take q, k and v as the decoder's qkv projection (float32) and do
    # plugins/decoder_cuda.py's qk_rope themselves (edgeomni's fused backend; not the op's)
    fused_qk: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r}: the kernel has {', '.join(DTYPES)}")
        if self.num_heads <= 0 or self.kv_num_heads <= 0 or self.num_heads % self.kv_num_heads:
            raise ValueError(
                f"num_heads {self.num_heads} must be a positive multiple of kv_num_heads "
                f"{self.kv_num_heads}"
            )
        if self.head_dim <= 0 or self.head_dim % 2 and self.dtype == "float16":
            raise ValueError(f"head_dim {self.head_dim}: float16 needs an even head size")
        if self.window < 0 or (self.window and not self.causal):
            raise ValueError("a sliding window needs causal attention (causal=0 takes window=0)")
        if self.causal not in (0, 1):
            raise ValueError(f"causal must be 0 or 1, not {self.causal}")
        if self.warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"warps {self.warps}: one of 1, 2, 4, 8, 16")
        if self.fused_qk not in (0, 1) or (self.fused_qk and self.head_dim % 2):
            raise ValueError(f"fused_qk {self.fused_qk}: 0, or 1 with an even head size")
        hb = self.block_heads
        if hb <= 0 or self.group % hb or hb & (hb - 1) or hb > 8:
            raise ValueError(
                f"heads_per_block {hb} must be a power of two up to 8 dividing the group "
                f"({self.group} query heads per kv head)"
            )
        if self.shared_bytes > _STATIC_SHARED_LIMIT:
            raise ValueError(
                f"{self.shared_bytes} bytes of shared memory per block (limit "
                f"{_STATIC_SHARED_LIMIT}): use fewer warps or heads per block"
            )

    @property
    def group(self) -> int:
        return self.num_heads // self.kv_num_heads

    @property
    def block_heads(self) -> int:
        return self.heads_per_block or default_heads_per_block(self.group)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def vector_bytes(self) -> int:
        """Bytes per load: 16 where the head size allows, down to one element."""
        row = self.head_dim * self.itemsize
        width = 16
        while row % width:
            width //= 2
        return max(width, self.itemsize)

    @property
    def shared_bytes(self) -> int:
        """Static shared memory: per warp its queries (float) and one chunk's probabilities;
        after the key loop the same memory holds the split merge's partial states."""
        hb, d, w = self.block_heads, self.head_dim, self.warps
        main = w * hb * (d + 32) + (w * d if self.fused_qk else 0)  # fused: a row a warp staged
        merge = max(w // 2, 1) * hb * (d + 2)
        return 4 * max(main, merge)

    def source(self) -> str:
        return _source(self)

    def launch_params(
        self,
        batch: Any,
        seq: Any,
        capacity: Any = None,
        cdiv: Callable[[Any, Any], Any] | None = None,
    ) -> tuple[tuple[Any, Any, Any], tuple[int, int, int], int]:
        return launch_params(
            batch, seq, capacity, num_heads=self.num_heads, heads_per_block=self.block_heads,
            warps=self.warps, cdiv=cdiv,
        )  # fmt: skip


def default_heads_per_block(group: int) -> int:
    """Up to 4 query heads per block: a key row read once serves 4 heads, and a decode call
    still has ``B * num_heads / 4`` blocks (8 at batch 1 for 32 heads). More (8) suits large
    decode batches, fewer (1-2) batch 1 on a big GPU; bench/attention_kernels_gpu.py measures."""
    hb = 1
    while hb * 2 <= min(group, 4) and group % (hb * 2) == 0:
        hb *= 2
    return hb


def kernel_source(
    *,
    num_heads: int,
    kv_num_heads: int,
    head_dim: int,
    scale: float = 0.0,
    window: int = 0,
    causal: int = 1,
    dtype: str = "float16",
    heads_per_block: int = 0,
    warps: int = 8,
) -> str:
    """The CUDA C source of one kernel variant (entry ``KERNEL_NAME``), attributes baked in."""
    return KernelConfig(
        num_heads, kv_num_heads, head_dim, dtype, scale, window, causal, heads_per_block, warps
    ).source()


def from_node_attributes(
    attrs: Mapping[str, Any], head_dim: int, dtype: str, **tuning: int
) -> KernelConfig:
    """The kernel for a CachedAttention node: ``attrs`` as onnx.helper.get_attribute_value gives
    them (num_heads, kv_num_heads, and the optional scale, window, causal)."""
    return KernelConfig(
        num_heads=int(attrs["num_heads"]),
        kv_num_heads=int(attrs["kv_num_heads"]),
        head_dim=int(head_dim),
        dtype=dtype,
        scale=float(attrs.get("scale", 0.0) or 0.0),
        window=int(attrs.get("window", 0) or 0),
        causal=int(attrs.get("causal", 1)),
        **tuning,
    )


def launch_params(
    batch: Any,
    seq: Any,
    capacity: Any = None,
    *,
    num_heads: int,
    heads_per_block: int,
    warps: int = 8,
    cdiv: Callable[[Any, Any], Any] | None = None,
) -> tuple[tuple[Any, Any, Any], tuple[int, int, int], int]:
    """(grid, block, dynamic shared memory) for a call on [B, S] queries and a cache of C slots.

    Only ``+``, ``*`` and ``cdiv`` of the sizes, so TensorRT's symbolic sizes work too (pass
    ``cdiv=trtp.cdiv``). The capacity does not change the grid; it is a parameter so that
    callers need not know that. Shared memory is static (``KernelConfig.shared_bytes``)."""
    del capacity
    div = cdiv or (lambda a, b: (a + b - 1) // b)
    return (div(seq, warps), num_heads // heads_per_block, batch), (32 * warps, 1, 1), 0


# ---------------------------------------------------------------------------------------------
# the CUDA C source
# ---------------------------------------------------------------------------------------------
def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _defines(cfg: KernelConfig) -> dict[str, Any]:
    elems = cfg.vector_bytes // cfg.itemsize  # elements per vector load
    nvec = cfg.head_dim // elems  # vectors per head row
    lanes_per_row = min(32, _pow2_at_least(nvec))  # lanes sharing one value row
    vecs_per_lane = -(-nvec // lanes_per_row)
    regs_per_value_chunk = lanes_per_row * vecs_per_lane * cfg.vector_bytes // 4
    scale = cfg.scale or 1.0 / math.sqrt(cfg.head_dim)
    return {
        "NUM_HEADS": cfg.num_heads,
        "KV_HEADS": cfg.kv_num_heads,
        "HEAD_DIM": cfg.head_dim,
        "GROUP": cfg.group,
        "HB": cfg.block_heads,
        "SLICES": cfg.group // cfg.block_heads,
        "WARPS": cfg.warps,
        "THREADS": cfg.threads,
        "IS_HALF": int(cfg.dtype == "float16"),
        "CAUSAL": cfg.causal,
        "WINDOW": cfg.window,
        # q * scale * log2(e): the softmax runs on exp2
        "SCALE_LOG2": f"{float(scale * _LOG2E).hex()}f",
        "VEC_BYTES": cfg.vector_bytes,
        "VL": elems,
        "NV": nvec,
        "LPR": lanes_per_row,
        "KPS": 32 // lanes_per_row,
        "VPL": vecs_per_lane,
        "PREFETCH_V": int(regs_per_value_chunk <= 64),
        "SMEM_FLOATS": cfg.shared_bytes // 4,
        "FUSED_QK": cfg.fused_qk,
        "STAGE_AT": cfg.warps * cfg.block_heads * (cfg.head_dim + 32),  # fused: staged rows
    }


def _source(cfg: KernelConfig) -> str:
    head = (
        f"// {KERNEL_NAME}: edgeomni::CachedAttention, generated by edgeomni.plugins.attention_cuda\n"
        f"// {cfg}\n"
    )
    lines = [f"#define {k} {v}" for k, v in _defines(cfg).items()]
    body = _BODY.replace("// ROPE_SOURCE\n", ROPE_SOURCE if cfg.fused_qk else "")
    return head + "\n".join(lines) + f"\n#define KERNEL_NAME {KERNEL_NAME}\n" + body


# q/k RMSNorm and rotary of one head row, shared by plugins/decoder_cuda.py's qk_rope and the
# fused decode attention (so both compute the same bits). A warp stages the row (float32, D
# values at src) in hb and gets its norm scale; element i of the result is then rope_elem's.
# Frequency j's angle is position * inv_freq[j], the position taken from axis freq_axis[j] of
# pos [axes, tokens] (1-D RoPE: axes 1, freq_axis null).
ROPE_SOURCE = r"""
__device__ __forceinline__ float stage_row(const float* src, float* hb, int D, const float* nw,
                                           float eps) {
    const int lane = threadIdx.x & 31;
    __syncwarp();  // the row staged before is read no more
    float ss = 0.f;
    for (int i = lane; i < D; i += 32) { float e = src[i]; hb[i] = e; ss += e * e; }
    ss = warp_sum(ss);
    __syncwarp();
    return nw ? 1.0f / sqrtf(ss / (float)D + eps) : 1.0f;
}

__device__ __forceinline__ float rope_elem(const float* hb, int i, int D, float scale,
                                           const float* nw, const long long* pos,
                                           long long tokens, long long t,
                                           const float* inv_freq, const int* freq_axis) {
    const int half = D / 2;
    const int j = i < half ? i : i - half;
    const int axis = freq_axis ? freq_axis[j] : 0;
    const float angle = (float)pos[(long long)axis * tokens + t] * inv_freq[j];
    const float c = cosf(angle), s = sinf(angle);
    const float a = hb[i] * scale * (nw ? nw[i] : 1.0f);
    const int p = i < half ? i + half : i - half;
    const float b = hb[p] * scale * (nw ? nw[p] : 1.0f);
    return i < half ? a * c - b * s : a * c + b * s;
}
"""


_BODY = r"""
#if IS_HALF
typedef unsigned short T;  // IEEE half, converted with cvt (no cuda_fp16.h: NVRTC needs none)
#else
typedef float T;
#endif

#if VEC_BYTES == 16
typedef uint4 vec_t;
#elif VEC_BYTES == 8
typedef uint2 vec_t;
#elif VEC_BYTES == 4
typedef unsigned int vec_t;
#else
typedef unsigned short vec_t;
#endif

union Vec {
    vec_t raw;
    T e[VL];
};

#ifndef ATTN_HOST_EMULATION
#if IS_HALF
__device__ __forceinline__ float to_f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short from_f(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float from_f(float x) { return x; }
#endif
#endif

// read-only loads: keys below past are never written by this launch, new tokens come from k/v
// (FUSED_QK: from the cache, where this block wrote them: coherent loads)
__device__ __forceinline__ vec_t load_vec(const T* p) {
#if FUSED_QK
    return *reinterpret_cast<const vec_t*>(p);
#else
    return __ldg(reinterpret_cast<const vec_t*>(p));
#endif
}

__device__ __forceinline__ vec_t zero_vec() {
    Vec z;
#pragma unroll
    for (int t = 0; t < VL; ++t) z.e[t] = (T)0;
    return z.raw;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// ROPE_SOURCE
// exp2(m_old - m_new), 0 for a state that has seen nothing (m_old = -inf)
__device__ __forceinline__ float rescale(float m_old, float m_new) {
    return m_old == __int_as_float(0xff800000) ? 0.f : exp2f(m_old - m_new);
}

// key or value row j of row b, kv head hk: the cache below past, the new tokens from the input
__device__ __forceinline__ const T* kv_row(const T* cache, const T* fresh, int j, int past,
                                           int b, int hk, int seq, int capacity) {
    return j < past ? cache + (((size_t)b * KV_HEADS + hk) * capacity + j) * HEAD_DIM
                    : fresh + (((size_t)b * seq + (j - past)) * KV_HEADS + hk) * HEAD_DIM;
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) KERNEL_NAME(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* past_key, const T* past_value,
    const int* __restrict__ past_lens, const int* __restrict__ query_lens,
    int batch, int seq, int capacity,
    T* __restrict__ out, T* present_key, T* present_value
#if FUSED_QK
    , const float* __restrict__ qkv, const long long* __restrict__ pos,
    const float* __restrict__ qn, const float* __restrict__ kn, float eps,
    const float* __restrict__ inv_freq, const int* __restrict__ freq_axis
#endif
    ) {
    __shared__ __align__(16) float smem[SMEM_FLOATS];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // a dependent launch (sm_90+) waits here for what was queued before; else both no-ops
    asm volatile("griddepcontrol.launch_dependents;" :::);
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    const float NEG_INF = __int_as_float(0xff800000);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int b = blockIdx.z;
    if (b >= batch) return;  // the whole block: before any barrier
    const int hk = blockIdx.y / SLICES, slice = blockIdx.y % SLICES;
    const int h0 = hk * GROUP + slice * HB;  // first query head of this block
    const int tile0 = blockIdx.x * WARPS;    // first query position of this block

    int past = past_lens[b];
    past = past < 0 ? 0 : (past > capacity ? capacity : past);
    int fresh = query_lens[b];
    const int room = min(seq, capacity - past);
    fresh = fresh < 0 ? 0 : (fresh > room ? room : fresh);

    // positions of this block; spare warps split a position's keys (a power of two ways)
    const int npos = min(WARPS, seq - tile0);
    int splits = 1;
    while (splits * 2 * npos <= WARPS) splits *= 2;
    const int slot = warp / splits, split = warp % splits;
    const int i = tile0 + slot;  // this warp's query position
    const bool active = slot < npos;
    const bool valid = active && i < fresh;

#if FUSED_QK
    // decode (seq 1): qk_rope's work for this block from qkv [batch, heads + 2 kv heads, D],
    // rounded to T as qk_rope's outputs are: its HB query heads into qs (one copy: every warp
    // serves the one position) and its kv head's new key and value into the cache (by every
    // block of that kv head, the same bits; read back from there after the barrier). Rows
    // shared out among the warps: q heads 0 .. HB-1, then the key, then the value.
    float* qs = smem;
    if (valid) {
        float* hb = smem + STAGE_AT + warp * HEAD_DIM;
        const long long t = b, rows = (long long)NUM_HEADS + 2 * KV_HEADS;
        const size_t dst = (((size_t)b * KV_HEADS + hk) * capacity + past) * HEAD_DIM;
        for (int r = warp; r < HB + 2; r += WARPS) {
            if (r == HB + 1) {
                const float* vsrc = qkv + (t * rows + NUM_HEADS + KV_HEADS + hk) * HEAD_DIM;
                for (int e = lane; e < HEAD_DIM; e += 32) present_value[dst + e] = from_f(vsrc[e]);
                continue;
            }
            const bool key = r == HB;
            const float* nw = key ? kn : qn;
            const long long row = key ? NUM_HEADS + hk : h0 + r;
            const float scale = stage_row(qkv + (t * rows + row) * HEAD_DIM, hb, HEAD_DIM, nw, eps);
            for (int e = lane; e < HEAD_DIM; e += 32) {
                const T x = from_f(rope_elem(hb, e, HEAD_DIM, scale, nw, pos, batch, t, inv_freq,
                                             freq_axis));
                if (key) present_key[dst + e] = x;
                else qs[r * HEAD_DIM + e] = to_f(x) * SCALE_LOG2;
            }
        }
    }
    __syncthreads();  // the new key and value are in the cache for every warp
    const int kv_past = past + fresh;  // every key from the cache
#else
    const int kv_past = past;  // new tokens' keys and values from k and v
    // the new token's key and value into the cache: one block per (row, kv head, token)
    if (slice == 0 && valid && split == 0) {
        const size_t src = ((size_t)b * seq + i) * KV_HEADS * HEAD_DIM + (size_t)hk * HEAD_DIM;
        const size_t dst = (((size_t)b * KV_HEADS + hk) * capacity + past + i) * HEAD_DIM;
        for (int e = lane; e < NV; e += 32) {
            *reinterpret_cast<vec_t*>(present_key + dst + e * VL) =
                *reinterpret_cast<const vec_t*>(k + src + e * VL);
            *reinterpret_cast<vec_t*>(present_value + dst + e * VL) =
                *reinterpret_cast<const vec_t*>(v + src + e * VL);
        }
    }

#endif
#if !FUSED_QK
    float* qs = smem + warp * (HB * HEAD_DIM);                   // [HB][HEAD_DIM], scaled
#endif
    float* ps = smem + WARPS * (HB * HEAD_DIM) + warp * (32 * HB);  // [32 keys][HB]
    const int g = lane / LPR, c = lane % LPR;  // value phase: key group, vector column

    float m[HB], l[HB], acc[HB][VPL * VL];
#pragma unroll
    for (int h = 0; h < HB; ++h) {
        m[h] = NEG_INF;
        l[h] = 0.f;
#pragma unroll
        for (int t = 0; t < VPL * VL; ++t) acc[h][t] = 0.f;
    }

    if (valid) {
#if !FUSED_QK
        const T* qrow = q + (((size_t)b * seq + i) * NUM_HEADS + h0) * HEAD_DIM;
        for (int e = lane; e < HB * NV; e += 32) {
            Vec x;
            x.raw = load_vec(qrow + e * VL);
#pragma unroll
            for (int t = 0; t < VL; ++t) qs[e * VL + t] = to_f(x.e[t]) * SCALE_LOG2;
        }
#endif
        __syncwarp();
        const int pos = past + i;
        const int hi = CAUSAL ? pos + 1 : past + fresh;
        const int lo = WINDOW > 0 ? max(0, pos + 1 - WINDOW) : 0;
        const int chunks = (hi - lo + 31) / 32;
        for (int ch = split; ch < chunks; ch += splits) {
            const int j0 = lo + ch * 32;
#if PREFETCH_V
            // this chunk's values, loaded before the scores need the keys
            vec_t vreg[LPR][VPL];
#pragma unroll
            for (int st = 0; st < LPR; ++st) {
                const int j = j0 + st * KPS + g;
                const T* vrow = kv_row(past_value, v, j, kv_past, b, hk, seq, capacity);
#pragma unroll
                for (int u = 0; u < VPL; ++u) {
                    const int vi = c + u * LPR;
                    vreg[st][u] = (j < hi && vi < NV) ? load_vec(vrow + vi * VL) : zero_vec();
                }
            }
#endif
            // scores: lane <-> key j0 + lane
            const int j = j0 + lane;
            const bool in_range = j < hi;
            const T* krow = kv_row(past_key, k, j, kv_past, b, hk, seq, capacity);
            float s[HB];
#pragma unroll
            for (int h = 0; h < HB; ++h) s[h] = 0.f;
#pragma unroll 16
            for (int e = 0; e < NV; ++e) {
                Vec x;
                x.raw = in_range ? load_vec(krow + e * VL) : zero_vec();
                float kf[VL];
#pragma unroll
                for (int t = 0; t < VL; ++t) kf[t] = to_f(x.e[t]);
#pragma unroll
                for (int h = 0; h < HB; ++h) {
                    const float* qh = qs + h * HEAD_DIM + e * VL;
#if VL % 4 == 0
#pragma unroll
                    for (int t = 0; t < VL; t += 4) {
                        const float4 q4 = *reinterpret_cast<const float4*>(qh + t);
                        s[h] = fmaf(q4.x, kf[t], s[h]);
                        s[h] = fmaf(q4.y, kf[t + 1], s[h]);
                        s[h] = fmaf(q4.z, kf[t + 2], s[h]);
                        s[h] = fmaf(q4.w, kf[t + 3], s[h]);
                    }
#else
#pragma unroll
                    for (int t = 0; t < VL; ++t) s[h] = fmaf(qh[t], kf[t], s[h]);
#endif
                }
            }
            // online softmax: the chunk's maximum, rescale, probabilities to shared memory
#pragma unroll
            for (int h = 0; h < HB; ++h) {
                const float sh = in_range ? s[h] : NEG_INF;
                const float m_new = fmaxf(m[h], warp_max(sh));  // finite: key j0 is in range
                const float alpha = rescale(m[h], m_new);
                const float p = exp2f(sh - m_new);
                m[h] = m_new;
                l[h] = l[h] * alpha + p;
#pragma unroll
                for (int t = 0; t < VPL * VL; ++t) acc[h][t] *= alpha;
                ps[lane * HB + h] = p;
            }
            __syncwarp();
            // values: lane (g, c) takes key j0 + st * KPS + g, vectors c, c + LPR, ...
#pragma unroll
            for (int st = 0; st < LPR; ++st) {
                const int kk = st * KPS + g;
#if !PREFETCH_V
                vec_t vrow_regs[VPL];
                {
                    const int jv = j0 + kk;
                    const T* vrow = kv_row(past_value, v, jv, kv_past, b, hk, seq, capacity);
#pragma unroll
                    for (int u = 0; u < VPL; ++u) {
                        const int vi = c + u * LPR;
                        vrow_regs[u] = (jv < hi && vi < NV) ? load_vec(vrow + vi * VL)
                                                            : zero_vec();
                    }
                }
#endif
                float p[HB];
#pragma unroll
                for (int h = 0; h < HB; ++h) p[h] = ps[kk * HB + h];
#pragma unroll
                for (int u = 0; u < VPL; ++u) {
                    Vec x;
#if PREFETCH_V
                    x.raw = vreg[st][u];
#else
                    x.raw = vrow_regs[u];
#endif
#pragma unroll
                    for (int t = 0; t < VL; ++t) {
                        const float vf = to_f(x.e[t]);
#pragma unroll
                        for (int h = 0; h < HB; ++h)
                            acc[h][u * VL + t] = fmaf(p[h], vf, acc[h][u * VL + t]);
                    }
                }
            }
            __syncwarp();  // ps is rewritten by the next chunk
        }
    }

    // whole-warp totals: l over lanes, acc over the key groups (every group then holds it)
#pragma unroll
    for (int h = 0; h < HB; ++h) {
        l[h] = warp_sum(l[h]);
#pragma unroll
        for (int o = LPR; o < 32; o <<= 1) {
#pragma unroll
            for (int t = 0; t < VPL * VL; ++t)
                acc[h][t] += __shfl_xor_sync(0xffffffffu, acc[h][t], o);
        }
    }

    // merge the key splits of a position pairwise, in a fixed order
    if (splits > 1) {
        const int slot_floats = HB * (HEAD_DIM + 2);
        __syncthreads();  // queries and probabilities are done with: reuse the memory
        for (int step = 1; step < splits; step <<= 1) {
            const bool writer = active && (split & (2 * step - 1)) == step;
            const bool reader = active && (split & (2 * step - 1)) == 0;
            if (writer) {
                float* buf = smem + (warp >> 1) * slot_floats;
                if (lane == 0) {
#pragma unroll
                    for (int h = 0; h < HB; ++h) {
                        buf[h] = m[h];
                        buf[HB + h] = l[h];
                    }
                }
                if (g == 0) {
#pragma unroll
                    for (int u = 0; u < VPL; ++u) {
                        const int vi = c + u * LPR;
                        if (vi < NV) {
#pragma unroll
                            for (int h = 0; h < HB; ++h)
#pragma unroll
                                for (int t = 0; t < VL; ++t)
                                    buf[2 * HB + h * HEAD_DIM + vi * VL + t] = acc[h][u * VL + t];
                        }
                    }
                }
            }
            __syncthreads();
            if (reader) {
                const float* buf = smem + ((warp + step) >> 1) * slot_floats;
#pragma unroll
                for (int h = 0; h < HB; ++h) {
                    const float mb = buf[h];
                    const float m_new = fmaxf(m[h], mb);
                    const float a = rescale(m[h], m_new), bb = rescale(mb, m_new);
                    m[h] = m_new;
                    l[h] = l[h] * a + buf[HB + h] * bb;
#pragma unroll
                    for (int u = 0; u < VPL; ++u) {
                        const int vi = c + u * LPR;
#pragma unroll
                        for (int t = 0; t < VL; ++t) {
                            const float other =
                                vi < NV ? buf[2 * HB + h * HEAD_DIM + vi * VL + t] : 0.f;
                            acc[h][u * VL + t] = acc[h][u * VL + t] * a + other * bb;
                        }
                    }
                }
            }
            __syncthreads();
        }
    }

    // out: the normalised sum for valid positions, zeros for padding and idle rows
    if (active && split == 0 && g == 0) {
        T* orow = out + (((size_t)b * seq + i) * NUM_HEADS + h0) * HEAD_DIM;
#pragma unroll
        for (int h = 0; h < HB; ++h) {
            const float inv = valid ? 1.f / l[h] : 0.f;
#pragma unroll
            for (int u = 0; u < VPL; ++u) {
                const int vi = c + u * LPR;
                if (vi < NV) {
                    Vec x;
#pragma unroll
                    for (int t = 0; t < VL; ++t) x.e[t] = from_f(acc[h][u * VL + t] * inv);
                    *reinterpret_cast<vec_t*>(orow + h * HEAD_DIM + vi * VL) = x.raw;
                }
            }
        }
    }
}
"""


@dataclass(frozen=True)
class FusedQK:
    """A fused_qk call's inputs (device pointers as ints, 0 for none): the qkv projection
    [batch, heads + 2 kv heads, D] (float32), positions [axes, batch], the q/k norms' weights,
    their epsilon, the rotary frequencies and each frequency's position axis (MRoPE)."""

    qkv: int
    pos: int
    q_norm: int
    k_norm: int
    eps: float
    inv_freq: int
    freq_axis: int = 0


class CudaAttention:
    """One compiled kernel variant, loaded into the current CUDA context (the caller makes one
    current, e.g. cuDevicePrimaryCtxRetain + cuCtxSetCurrent).

    By default it loads a cubin for the current device, which needs no PTX JIT and so no driver
    as new as NVRTC; ``ptx=True`` loads PTX instead, as TensorRT would."""

    def __init__(
        self, config: KernelConfig, *, ptx: bool = False,
        cubin: Callable[[str, str], bytes] | None = None,
    ) -> None:  # fmt: skip
        """``cubin``: how to get the cubin for (source, arch) (default: compile it; the fused
        backend passes its kernel cache)."""
        cu = _driver()
        self.config = config
        self.source = config.source()
        device = check(cu.cuCtxGetDevice(), "cuCtxGetDevice")
        attr = cu.CUdevice_attribute
        major = check(
            cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device),
            "cuDeviceGetAttribute",
        )
        minor = check(
            cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device),
            "cuDeviceGetAttribute",
        )
        if ptx:
            self.image = compile_ptx(self.source, f"compute_{major}{minor}")
        else:
            self.image = (cubin or compile_cubin)(self.source, f"sm_{major}{minor}")
        self.module = check(cu.cuModuleLoadData(self.image), "cuModuleLoadData")
        self.function = check(
            cu.cuModuleGetFunction(self.module, KERNEL_NAME.encode()), "cuModuleGetFunction"
        )

    def registers(self) -> int:
        """Registers per thread the compiled kernel uses (for reports)."""
        cu = _driver()
        return check(
            cu.cuFuncGetAttribute(
                cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, self.function
            ),
            "cuFuncGetAttribute",
        )

    def launch(
        self,
        q: int,
        k: int,
        v: int,
        past_key: int,
        past_value: int,
        past_lens: int,
        query_lens: int,
        out: int,
        *,
        batch: int,
        seq: int,
        capacity: int,
        stream: Any = 0,
        overlap: bool = False,
        qk: FusedQK | None = None,
    ) -> None:
        """Queue one call on ``stream`` (device pointers as ints). The cache is updated in
        place: present_key/present_value are past_key/past_value. ``overlap``: as a
        programmatic dependent launch (see ``launch_kernel``). A ``fused_qk`` kernel takes
        decode calls only, ``qk`` instead of q, k and v (pass 0 for those)."""
        if bool(self.config.fused_qk) != (qk is not None):
            raise ValueError("qk: given exactly when the kernel is fused_qk")
        if qk is not None and seq != 1:
            raise ValueError(f"a fused_qk kernel takes decode calls (seq 1), not seq {seq}")
        grid, block, shared = self.config.launch_params(batch, seq, capacity)
        pointers = (q, k, v, past_key, past_value, past_lens, query_lens)
        values: list[Any] = [ctypes.c_void_p(int(p)) for p in pointers]
        values += [ctypes.c_int32(int(n)) for n in (batch, seq, capacity)]
        values += [ctypes.c_void_p(int(p)) for p in (out, past_key, past_value)]
        if qk is not None:
            values += [ctypes.c_void_p(int(p)) for p in (qk.qkv, qk.pos, qk.q_norm, qk.k_norm)]
            values += [ctypes.c_float(qk.eps)]
            values += [ctypes.c_void_p(int(p)) for p in (qk.inv_freq, qk.freq_axis)]
        args = (ctypes.c_void_p * len(values))(*[ctypes.addressof(x) for x in values])
        launch_kernel(self.function, grid, block[0], shared, stream, ctypes.addressof(args),
                      overlap=overlap, what=KERNEL_NAME)  # fmt: skip

    def close(self) -> None:
        if getattr(self, "module", None) is not None:
            check(_driver().cuModuleUnload(self.module), "cuModuleUnload")
            self.module = None
