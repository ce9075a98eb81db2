"""The CUDA C of edgeomni::CachedAttention's kernel (plugins/attention_cuda.py generates the
``#define``s in front of ``BODY`` for each KernelConfig and launches it), and the q/k norm and
rotary device functions its fused_qk variant shares with plugins/decoder_cuda.py's qk_rope."""

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


# a function's static shared arrays: plain __shared__ here, one aliased zone in a persistent
# program (bench/persistent_cuda.py defines SHARED first)
SHARED_SOURCE = r"""
#ifndef SHARED  // a function's static shared arrays (bench/persistent_cuda.py aliases them)
#define SHARED_BEGIN
#define SHARED_BEGIN_INNER
#define SHARED(T, name, dims) __shared__ __align__(16) T name dims
#endif
"""

BODY = r"""
#if IS_HALF
typedef unsigned short T;  // IEEE half, converted with cvt (no cuda_fp16.h: NVRTC needs none)
#else
typedef float T;
#endif

""" + SHARED_SOURCE + r"""
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
    SHARED_BEGIN;
    SHARED(float, smem, [SMEM_FLOATS]);
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
