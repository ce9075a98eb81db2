"""The fused backend's ``linear`` kernels (CUDA C, compiled into plugins/decoder_cuda.py's
module): ``out = (x * norm_w) @ W^T * rms_scale(x)`` for a few rows of x, with the epilogues a
decoder layer needs fused in (SwiGLU over packed gate/up rows, bias, residual add, each row's
last position, one of several stacked heads).

Two families of variants, picked by ``linear_launch``:

- SIMT, for 1 to 7 rows and for float32 weights (``linear_{f,h}{R}[s]``): a block computes C
  output columns for R rows with kw warps splitting K. A lane reads 16 bytes of each of the C
  weight rows per pass and multiplies them with all R rows (x read once for the C columns);
  the first pass's weights are requested before GRID_WAIT, so under programmatic dependent
  launch they are in flight while the kernel before still runs.
- Tensor cores, for 8 rows and more with float16 weights (``linear_m{f,h}{8,16,32}[s]``):
  ``mma.sync.m16n8k16`` tiles of 16 weight rows by 8 x rows, x (times the norm's weight)
  rounded to float16 as ONNX Runtime's float16 build rounds its activations.
- A tensor-core GEMM for prefills of ``decoder_gemm_cuda.GEMM_ROWS`` rows and more whose
  64 x 64 tiles fill the GPU (``linear_g*``, plugins/decoder_gemm_cuda.py's ``gemm_pays``):
  the tiles stream K through shared memory.

int4 matrices (in float16 modules) run as the float16 ones do: SIMT under 8 rows
(``linear_q{f,h}{R}[s]``, 4 bytes of codes a lane, 8 weights of one group, and their float16
scale), tensor cores from 8 (``linear_mq{f,h}{8,16,32}[s]``, 16 bytes of codes a lane, each
weight rounded to float16 first).

Both end in ``linear_finish``: the norm's row scale, SwiGLU, the bias, and the store (float32, added
into float32, or float16: SwiGLU's output feeds the down projection's tensor cores as the float16
they would round it to). Partial sums from the warps meet in shared memory in warp order, and kw depends on K and the
weights' type only: within one family a row's result does not depend on the rows beside it.
Accumulation is float32; ``linear_reference`` gives the meaning in numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeomni.plugins import decoder_gemm_cuda as gemm

ROWS = (1, 2, 4, 8, 16)  # rows per block of ``linear`` variants
# output columns per block of a ``linear`` variant by its rows, bounded by the registers a lane
# holds (a 16-byte weight vector a column, SwiGLU two, and R x columns sums): SwiGLU at 16 rows
# takes 1
COLUMNS = {1: 8, 2: 8, 4: 4, 8: 2, 16: 2}
MAX_WARPS = 8  # warps splitting K in a ``linear`` block
# how a ``linear`` stores its results (its ``store`` argument): write float32, add into float32
# (the residual), write float16 (SwiGLU's output for a linear on tensor cores)
STORE_SET, STORE_ADD, STORE_HALF = 0, 1, 2


def linear_name(rows: int, half_input: bool, swiglu: bool = False, int4: bool = False) -> str:
    return f"linear_{'q' if int4 else ''}{'h' if half_input else 'f'}{rows}{'s' if swiglu else ''}"


def linear_columns(rows: int, swiglu: bool) -> int:
    """Output columns a block of the R = ``rows`` variant computes."""
    return 1 if swiglu and rows == 16 else COLUMNS[rows]


def linear_warps(k: int, weights: str, mma: bool = False, int4: bool = False) -> int:
    """Warps splitting K = ``k`` in a ``linear`` block: a pass (32 lanes x 16 bytes; a tensor
    core step: 32 columns, 128 of int4 codes) each, up to MAX_WARPS. A function of K, the
    weights' type and the family only, so that a row's sums are added in the same order
    whatever the rows beside it (batch invariance within a family)."""
    step = 128 if int4 else 32  # int4 on tensor cores: 16 bytes of codes a lane, 32 weights
    per_pass = step if mma else 32 * (8 if weights == "float16" else 4)
    return max(1, min(MAX_WARPS, -(-k // per_pass)))


MMA_ROWS = (8, 16, 32)  # rows per block of the tensor-core ``linear`` variants


def linear_uses_mma(weights: str, rows: int) -> bool:
    """Float16 weights and 8 rows or more run on tensor cores (x rounded to float16)."""
    return weights == "float16" and rows >= 8


@dataclass(frozen=True)
class LinearLaunch:
    name: str
    grid: tuple[int, int]
    block: int
    scales: bool = False  # the kernel takes the int4 scales and group (null and 0 for float16)


def linear_launch(
    weights: str, rows: int, k: int, n: int, *, half_input: bool = False,
    swiglu: bool = False, warps: int | None = None, int4: bool = False,
    gemm_way: bool | None = None,
) -> LinearLaunch:  # fmt: skip
    """The kernel, grid and block of a ``linear`` call of ``rows`` rows, K = ``k``, N = ``n``,
    ``weights`` the module's float type (``int4``: this matrix is int4, in a float16 module;
    ``warps``: a benchmark's other split of K, on the mma variants; ``gemm_way``: a test's or
    benchmark's choice of the GEMM, from GEMM_ROWS rows, where the K and epilogue have one. The
    engine leaves both to ``linear_warps`` and ``gemm_pays``)."""
    if half_input and swiglu:
        raise ValueError("linear: no SwiGLU variant takes float16 input")
    if int4 and weights != "float16":
        raise ValueError("linear: int4 weights are in float16 modules only")
    wvec = 8 if weights == "float16" else 4
    if k % wvec:
        raise ValueError(f"linear: K = {k} is not a multiple of {wvec} ({weights})")
    mma = linear_uses_mma(weights, rows)
    kw = warps or linear_warps(k, weights, mma, int4)
    if not 1 <= kw <= MAX_WARPS:
        raise ValueError(f"linear: {kw} warps; 1 to {MAX_WARPS}")
    if gemm_way is None:
        gemm_way = warps is None and gemm.gemm_pays(rows, n, swiglu)
    if mma and gemm_way and rows >= gemm.GEMM_ROWS and gemm.gemm_fits(k, swiglu, half_input):
        return LinearLaunch(gemm.gemm_name(int4, half_input, swiglu), gemm.gemm_grid(rows, n, swiglu),
                            gemm.GEMM_THREADS, scales=True)  # fmt: skip
    if mma:
        r = next((r for r in MMA_ROWS if r >= rows), MMA_ROWS[-1])
        name = f"linear_m{'q' if int4 else ''}{'h' if half_input else 'f'}{r}{'s' if swiglu else ''}"
        return LinearLaunch(name, (-(-n // 16), -(-rows // r)), 32 * kw, scales=int4)
    r = rows_variant(rows)
    cols = linear_columns(r, swiglu)
    return LinearLaunch(linear_name(r, half_input, swiglu, int4), (-(-n // cols), -(-rows // r)),
                        32 * kw, scales=int4)  # fmt: skip


def rows_variant(rows: int) -> int:
    """The ``linear`` variant for a call of ``rows`` rows: the smallest R >= rows, at most 16
    (more rows run as several blocks along y)."""
    return next((r for r in ROWS if r >= rows), ROWS[-1])


SOURCE = r"""
// WVEC weights (16 bytes) of one row at p, zeros where the row or the position is out of range
__device__ __forceinline__ uint4 fetch_w(const wt_t* p, bool ok) {
    if (!ok) { uint4 z; z.x = z.y = z.z = z.w = 0u; return z; }
    return __ldg(reinterpret_cast<const uint4*>(p));
}

// elements j .. j+3 of a 16-byte weight vector as floats
__device__ __forceinline__ void unpack4(const uint4& raw, int j, float* out) {
#if W_HALF
    const half_t* e = reinterpret_cast<const half_t*>(&raw) + j;
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = h2f(e[i]);
#else
    const float* e = reinterpret_cast<const float*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = e[i];
#endif
}

// (code & 15) - 8 as a float, exactly: the code's bits under 2^23's exponent, less 2^23 + 8
// (an OR and an add; an int-to-float conversion issues at a quarter of their rate)
__device__ __forceinline__ float dequant4(unsigned code) {
    return __uint_as_float(0x4B000000u | (code & 15u)) - 8388616.0f;
}

// A block's results from its warps' partial sums (warp i's at part[i * PW + col * R + r], the
// up rows' at col C + c; row sums of squares at part_ss[i * R + r]), added in warp order, then
// the norm's row scale, SwiGLU, the bias, then the store: STORE_SET writes float32, STORE_ADD adds
// into float32 (the residual), STORE_HALF writes float16 (SwiGLU's output where the next linear
// runs on tensor cores, which round it to float16 anyway): what both families end with.
#define STORE_SET 0
#define STORE_ADD 1
#define STORE_HALF 2
// Column c, row r of warp i's sums is part[i * PW + c * CS + r * RS] (the up rows' at column
// C + c): SIMT blocks write them column by column (CS = R, RS = 1), tensor-core blocks row by
// row with a padded stride (CS = 1, RS > columns), which their fragments store without bank
// conflicts.
template <int R, int C, bool SWIGLU, int CS = R, int RS = 1, int PW = (SWIGLU ? 2 : 1) * C * R>
__device__ __forceinline__ void linear_finish(
    const float* part, const float* part_ss, int kw, int n0, int r0, int rows, int K, int N,
    const float* norm_w, float eps, const float* bias, float* out, int store)
{
    for (int t = threadIdx.x; t < C * R; t += blockDim.x) {
        const int c = t % C, r = t / C, n = n0 + c;
        if (n >= N || r0 + r >= rows) continue;
        float a = 0.f, b = 0.f, s = 0.f;
        for (int i = 0; i < kw; ++i) {
            a += part[i * PW + c * CS + r * RS];
            if (SWIGLU) b += part[i * PW + (C + c) * CS + r * RS];
            if (norm_w) s += part_ss[i * R + r];
        }
        if (norm_w) {
            const float scale = 1.0f / sqrtf(s / (float)K + eps);
            a *= scale; b *= scale;
        }
        float v = SWIGLU ? a / (1.0f + expf(-a)) * b : a;
        if (bias) v += bias[n];
        const long long at = (long long)(r0 + r) * N + n;
        if (store == STORE_HALF) {
            reinterpret_cast<half_t*>(out)[at] = f2h(v);
        } else {
            out[at] = store == STORE_ADD ? out[at] + v : v;
        }
    }
}

// out[r, n] (float32, row stride N) for rows r of the call and output columns n:
//   v = (x_r * norm_w) . W[n] * rms_scale(x_r)   (norm_w given), else x_r . W[n]
//   SWIGLU: gate = that with W[n], up = with W[n + N]; v = silu(gate) * up
//   + bias[n]; then stored by ``store`` (linear_finish).
// x_r is row r of x (stride K) or, with rowmap, row r * seq + rowmap[r]. With head_index the
// weights start at W + head_index[0] * head_stride (one of several stacked heads).
// A block: C columns (n0 ..), R rows (r0 ..), kw = blockDim.x / 32 warps splitting K: K is
// cut in passes of 32 lanes x WVEC, warp w takes passes [w P / kw, (w + 1) P / kw), and each
// lane reads the C (SWIGLU: 2C) weight rows' 16 bytes of a pass together, once for all R rows.
// Partial sums meet in shared memory, warps in order: a row's result depends on K and kw only,
// never on R, C or the rows beside it (the engine picks kw from K: batch-invariant).
//
// Q4 (float16 builds): W is int4, ``w`` its codes (two a byte, the lower k in the low nibble,
// [rows, K / 2]) and ``scales`` one float16 scale a row and ``group`` (a multiple of 32) of K:
// W[n, k] = (code - 8) * scale, exact in float32. A lane reads 4 bytes of codes (8 weights, one
// group) of each weight row a pass and their scale, so the passes and the split of K are the
// float16 variants' (rows of head h start at h * head_stride weights). (16 bytes a lane, 32
// weights, made whole steps at 1 row 20-30% slower on the H200: a pass of 1024 weights left
// one warp a block for K = 1024.)
template <int R, int C, bool XHALF, bool SWIGLU, bool Q4 = false>
__device__ __forceinline__ void linear_body(
    const void* __restrict__ x, const long long* __restrict__ rowmap, int seq,
    const float* __restrict__ norm_w, float eps,
    const wt_t* __restrict__ w, long long head_stride, const long long* __restrict__ head_index,
    const float* __restrict__ bias, float* out, int rows, int K, int N, int store,
    const half_t* __restrict__ scales = nullptr, int group = 0)
{
    constexpr int CW = SWIGLU ? 2 * C : C;  // weight rows a lane reads a pass
    constexpr int VEC = WVEC, STEP = 32 * VEC;  // weights a lane and a warp read a pass
    SHARED_BEGIN_INNER;
    SHARED(float, part, [MAX_KW][CW * R]);
    SHARED(float, part_ss, [MAX_KW][R]);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = blockDim.x >> 5;
    const int n0 = blockIdx.x * C, r0 = blockIdx.y * R;
    const int passes = (K + STEP - 1) / STEP;
    const int p0 = warp * passes / kw, p1 = (warp + 1) * passes / kw;
    const long long head = head_index ? head_index[0] * head_stride : 0LL;
    const wt_t* wb = w + (Q4 ? 0LL : head);
    const unsigned char* qb = reinterpret_cast<const unsigned char*>(w) + (Q4 ? head / 2 : 0LL);
    const half_t* sb = Q4 ? scales + head / group : nullptr;
    uint4 wr[CW];  // a pass's weights of each weight row
    unsigned wq[CW];  // Q4: a pass's 8 codes of each weight row, and their scale
    float sc[CW];
    // a pass's weights of weight row c (column n0 + c % C; SwiGLU's up rows from C) at k
    auto load = [&](int c, int k, bool ok) {
        const int n = n0 + (c % C);
        const long long row = c < C ? n : (long long)n + N;
        ok = ok && n < N && k < K;
        if (Q4) {
            const long long at = row * K + k;
            wq[c] = ok ? __ldg(reinterpret_cast<const unsigned*>(qb + at / 2)) : 0u;
            sc[c] = ok ? h2f(sb[at / group]) : 0.f;
        } else {
            wr[c] = fetch_w(wb + row * K + k, ok);
        }
    };
    // the first pass's weights are requested before waiting on the kernel before this one
    {
        const int k = p0 * STEP + lane * VEC;
#pragma unroll
        for (int c = 0; c < CW; ++c) load(c, k, p0 < p1);
    }
    GRID_LAUNCH();
    GRID_WAIT();
    long long src[R];
    bool valid[R];
    float acc[CW][R], ss[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int rr = r0 + r;
        valid[r] = rr < rows;
        const long long row = valid[r] ? (rowmap ? (long long)rr * seq + rowmap[rr] : rr) : 0;
        src[r] = row * K;
        ss[r] = 0.f;
#pragma unroll
        for (int c = 0; c < CW; ++c) acc[c][r] = 0.f;
    }
    for (int p = p0; p < p1; ++p) {
        const int k = p * STEP + lane * VEC;
        if (k < K) {
#pragma unroll
            for (int j = 0; j < VEC; j += 4) {  // 4 elements at a time: few registers for x
                float g[4], xv[R][4];
                if (norm_w) {
                    float4 gv = *reinterpret_cast<const float4*>(norm_w + k + j);
                    g[0] = gv.x; g[1] = gv.y; g[2] = gv.z; g[3] = gv.w;
                }
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    if (!valid[r]) { xv[r][0] = xv[r][1] = xv[r][2] = xv[r][3] = 0.f; continue; }
                    load_x4<XHALF>(x, src[r] + k + j, xv[r]);
                    if (norm_w) {
#pragma unroll
                        for (int i = 0; i < 4; ++i) { ss[r] += xv[r][i] * xv[r][i]; xv[r][i] *= g[i]; }
                    }
                }
#pragma unroll
                for (int c = 0; c < CW; ++c) {
                    float wf[4];
                    if (Q4) {  // codes j .. j + 3 of the 8
#pragma unroll
                        for (int i = 0; i < 4; ++i) wf[i] = dequant4(wq[c] >> (4 * (j + i))) * sc[c];
                    } else {
                        unpack4(wr[c], j, wf);
                    }
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        acc[c][r] += xv[r][0] * wf[0] + xv[r][1] * wf[1] + xv[r][2] * wf[2]
                                   + xv[r][3] * wf[3];
                }
            }
        }
        if (p + 1 < p1) {  // the next pass's weights (a warp of a long K has several)
#pragma unroll
            for (int c = 0; c < CW; ++c) load(c, k + STEP, true);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int c = 0; c < CW; ++c) {
            const float v = warp_sum(acc[c][r]);
            if (lane == 0) part[warp][c * R + r] = v;
        }
        if (norm_w) {
            const float s = warp_sum(ss[r]);
            if (lane == 0) part_ss[warp][r] = s;
        }
    }
    __syncthreads();
    linear_finish<R, C, SWIGLU>(&part[0][0], &part_ss[0][0], kw, n0, r0, rows, K, N, norm_w, eps,
                                bias, out, store);
}

#define LINEAR(R, C, XH, SW, NAME) \
extern "C" __global__ void __launch_bounds__(32 * MAX_KW) NAME( \
    const void* x, const long long* rowmap, int seq, const float* norm_w, float eps, \
    const wt_t* w, long long head_stride, const long long* head_index, const float* bias, \
    float* out, int rows, int K, int N, int store) { \
    linear_body<R, C, XH, SW>(x, rowmap, seq, norm_w, eps, w, head_stride, head_index, bias, \
                              out, rows, K, N, store); }
LINEAR(1, 8, false, false, linear_f1) LINEAR(2, 8, false, false, linear_f2)
LINEAR(4, 4, false, false, linear_f4) LINEAR(8, 2, false, false, linear_f8)
LINEAR(16, 2, false, false, linear_f16)
LINEAR(1, 8, false, true, linear_f1s) LINEAR(2, 8, false, true, linear_f2s)
LINEAR(4, 4, false, true, linear_f4s) LINEAR(8, 2, false, true, linear_f8s)
LINEAR(16, 1, false, true, linear_f16s)
LINEAR(1, 8, true, false, linear_h1) LINEAR(2, 8, true, false, linear_h2)
LINEAR(4, 4, true, false, linear_h4) LINEAR(8, 2, true, false, linear_h8)
LINEAR(16, 2, true, false, linear_h16)

#if W_HALF
// int4 weights (Q4) under 8 rows: SIMT, K read as the float16 variants read it
#define LINEAR_Q4(R, C, XH, SW, NAME) \
extern "C" __global__ void __launch_bounds__(32 * MAX_KW) NAME( \
    const void* x, const long long* rowmap, int seq, const float* norm_w, float eps, \
    const wt_t* w, long long head_stride, const long long* head_index, const float* bias, \
    float* out, int rows, int K, int N, int store, const half_t* scales, int group) { \
    linear_body<R, C, XH, SW, true>(x, rowmap, seq, norm_w, eps, w, head_stride, head_index, \
                                    bias, out, rows, K, N, store, scales, group); }
LINEAR_Q4(1, 8, false, false, linear_qf1) LINEAR_Q4(2, 8, false, false, linear_qf2)
LINEAR_Q4(4, 4, false, false, linear_qf4) LINEAR_Q4(8, 2, false, false, linear_qf8)
LINEAR_Q4(16, 2, false, false, linear_qf16)
LINEAR_Q4(1, 8, false, true, linear_qf1s) LINEAR_Q4(2, 8, false, true, linear_qf2s)
LINEAR_Q4(4, 4, false, true, linear_qf4s) LINEAR_Q4(8, 2, false, true, linear_qf8s)
LINEAR_Q4(16, 1, false, true, linear_qf16s)
LINEAR_Q4(1, 8, true, false, linear_qh1) LINEAR_Q4(2, 8, true, false, linear_qh2)
LINEAR_Q4(4, 4, true, false, linear_qh4) LINEAR_Q4(8, 2, true, false, linear_qh8)
LINEAR_Q4(16, 2, true, false, linear_qh16)
#endif

#if W_HALF
// Tensor cores for 8 rows and more (float16 weights): out^T = W x^T as mma.m16n8k16 tiles, 16
// output columns (W rows) by 8 rows of x, fp16 products summed in float32. A lane reads 16
// bytes of each of its two W rows (g, g + 8) and 16 bytes of its x row (g) per 32 columns of
// K; the k order inside a tile is permuted alike in both operands, which a sum allows, so
// every load is 16 bytes wide. x (after the norm's weight) is rounded to float16 first, as
// ONNX Runtime's float16 build rounds its activations. K is split over kw warps in steps of
// 32, partial sums meeting in shared memory as in linear_body.
// Q4 (int4 codes and scales as in linear_body): a lane reads 16 bytes of codes of each W row,
// 32 weights of one group (k = 128 s + 32 t ..), per step of 128, and runs that step's four
// mma tiles from them, each weight (code - 8) * scale rounded to float16 (a float16 GEMM over
// the dequantized matrix rounds it so); the A and B words pair k with k + 4 there (both alike).
#ifndef DECODER_HOST_EMULATION
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, const unsigned* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

__device__ __forceinline__ unsigned pack_h2(float lo, float hi) {
    return (unsigned)f2h(lo) | ((unsigned)f2h(hi) << 16);
}

// the mma's A words for k half h of a 32-wide step: rows g (wa) and g + 8 (wb)
__device__ __forceinline__ void a_frag(const uint4& wa, const uint4& wb, int h, unsigned* a) {
    const unsigned* pa = reinterpret_cast<const unsigned*>(&wa);
    const unsigned* pb = reinterpret_cast<const unsigned*>(&wb);
    a[0] = pa[2 * h]; a[1] = pb[2 * h]; a[2] = pa[2 * h + 1]; a[3] = pb[2 * h + 1];
}

template <int RG, bool XHALF, bool SWIGLU, bool Q4 = false>
__device__ __forceinline__ void linear_mma_body(
    const void* __restrict__ x, const long long* __restrict__ rowmap, int seq,
    const float* __restrict__ norm_w, float eps,
    const wt_t* __restrict__ w, long long head_stride, const long long* __restrict__ head_index,
    const float* __restrict__ bias, float* out, int rows, int K, int N, int store,
    const half_t* __restrict__ scales = nullptr, int group = 0)
{
    constexpr int R = 8 * RG, T = SWIGLU ? 2 : 1;  // rows a block; W tiles (gate, up) a step
    // a warp's sums row by row, T * 16 columns and 4 of padding: rows 2t and 2t + 2 of a
    // fragment store 8 banks apart, so a warp's 32 stores meet no bank twice
    constexpr int RS = T * 16 + 4;
    SHARED_BEGIN_INNER;
    SHARED(float, part, [MAX_KW][R * RS]);
    SHARED(float, part_ss, [MAX_KW][R]);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kw = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16, r0 = blockIdx.y * R;
    constexpr int KS = Q4 ? 128 : 32, TILES = KS / 32;  // K a step covers; its mma k-pairs
    const int steps = (K + KS - 1) / KS;
    const int s0 = warp * steps / kw, s1 = (warp + 1) * steps / kw;
    const long long head = head_index ? head_index[0] * head_stride : 0LL;
    const wt_t* wb = w + (Q4 ? 0LL : head);
    const unsigned char* qb = reinterpret_cast<const unsigned char*>(w) + (Q4 ? head / 2 : 0LL);
    const half_t* sb = Q4 ? scales + head / group : nullptr;
    // this lane's 16 bytes of W rows g and g + 8 (and the up rows) for U steps: a ring of the
    // warp's next U steps, each refilled as soon as it is used, so that U steps' weights are
    // in flight at once (one step's were too few to keep HBM busy from 64 blocks)
    // within the registers of 2 blocks an SM (SwiGLU at 32 rows spilled with 4)
    // (Q4: a step is 128 of K, its dequantized tiles take registers too: half as many steps)
    constexpr int U = Q4 ? ((T == 2 && RG >= 4) ? 1 : (T == 2 || RG >= 4) ? 2 : 4)
                         : (T == 2 && RG >= 4) ? 2 : (T == 2 || RG >= 4) ? 4 : 8;
    uint4 wr[U][T][2];
    float sc[Q4 ? U : 1][T][2];  // Q4: the codes' scales
    auto fetch = [&](int s, int slot) {
        const int k = s * KS + (KS / 4) * t;
#pragma unroll
        for (int u = 0; u < T; ++u)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int n = n0 + g + 8 * i;
                const long long row = (long long)n + u * N;
                const bool ok = s < s1 && n < N && k < K;
                if (Q4) {
                    const long long at = row * K + k;
                    wr[slot][u][i] = fetch_w(reinterpret_cast<const wt_t*>(qb + at / 2), ok);
                    sc[Q4 ? slot : 0][u][i] = ok ? h2f(sb[at / group]) : 0.f;
                } else {
                    wr[slot][u][i] = fetch_w(wb + row * K + k, ok);
                }
            }
    };
#pragma unroll
    for (int slot = 0; slot < U; ++slot) fetch(s0 + slot, slot);
    GRID_LAUNCH();
    GRID_WAIT();
    long long src[RG];
    bool valid[RG];
#pragma unroll
    for (int q = 0; q < RG; ++q) {
        const int rr = r0 + q * 8 + g;
        valid[q] = rr < rows;
        const long long row = valid[q] ? (rowmap ? (long long)rr * seq + rowmap[rr] : rr) : 0;
        src[q] = row * K;
    }
    float acc[T][RG][4], ss[RG];
#pragma unroll
    for (int q = 0; q < RG; ++q) {
        ss[q] = 0.f;
#pragma unroll
        for (int u = 0; u < T; ++u)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[u][q][i] = 0.f;
    }
    for (int base = s0; base < s1; base += U)
#pragma unroll
    for (int slot = 0; slot < U; ++slot) {
        const int s = base + slot;
        if (s >= s1) break;
#pragma unroll
        for (int tile = 0; tile < TILES; ++tile) {
            const int k = Q4 ? s * KS + 32 * t + 8 * tile : s * 32 + 8 * t;
            uint4 wt[T][2];  // the tile's weights of rows g and g + 8, float16
#pragma unroll
            for (int u = 0; u < T; ++u)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    if (!Q4) { wt[u][i] = wr[slot][u][i]; continue; }
                    const unsigned word = reinterpret_cast<const unsigned*>(&wr[slot][u][i])[tile];
                    const float scale = sc[Q4 ? slot : 0][u][i];
                    unsigned* h = reinterpret_cast<unsigned*>(&wt[u][i]);
#pragma unroll
                    for (int m = 0; m < 4; ++m)  // weights m and m + 4 of the tile's 8
                        h[m] = pack_h2(dequant4(word >> (4 * m)) * scale,
                                       dequant4(word >> (4 * m + 16)) * scale);
                }
            float gw[8];
            if (norm_w && k < K) {
                float4 g0 = *reinterpret_cast<const float4*>(norm_w + k);
                float4 g1 = *reinterpret_cast<const float4*>(norm_w + k + 4);
                gw[0] = g0.x; gw[1] = g0.y; gw[2] = g0.z; gw[3] = g0.w;
                gw[4] = g1.x; gw[5] = g1.y; gw[6] = g1.z; gw[7] = g1.w;
            }
#pragma unroll
            for (int q = 0; q < RG; ++q) {
                unsigned b[4] = {0u, 0u, 0u, 0u};  // x row q*8+g, k .. k+7, as float16 pairs
                if (valid[q] && k < K) {
                    if (XHALF && !norm_w && !Q4) {
                        uint4 raw = *reinterpret_cast<const uint4*>(
                            reinterpret_cast<const half_t*>(x) + src[q] + k);
                        b[0] = raw.x; b[1] = raw.y; b[2] = raw.z; b[3] = raw.w;
                    } else {
                        float xv[8];
                        load_x4<XHALF>(x, src[q] + k, xv);
                        load_x4<XHALF>(x, src[q] + k + 4, xv + 4);
                        if (norm_w) {
#pragma unroll
                            for (int i = 0; i < 8; ++i) { ss[q] += xv[i] * xv[i]; xv[i] *= gw[i]; }
                        }
#pragma unroll
                        for (int i = 0; i < 4; ++i)  // Q4 pairs k with k + 4, as its weights
                            b[i] = Q4 ? pack_h2(xv[i], xv[i + 4]) : pack_h2(xv[2 * i], xv[2 * i + 1]);
                    }
                }
#pragma unroll
                for (int u = 0; u < T; ++u)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        unsigned a[4];
                        a_frag(wt[u][0], wt[u][1], h, a);
                        mma16816(acc[u][q], a, b + 2 * h);
                    }
            }
        }
        if (s + U < s1) fetch(s + U, slot);
    }
    // C fragment: acc[u][q][j] is column n0 + g + 8 (j >> 1), row q*8 + 2t + (j & 1)
#pragma unroll
    for (int u = 0; u < T; ++u)
#pragma unroll
        for (int q = 0; q < RG; ++q)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int col = u * 16 + g + 8 * (j >> 1), r = q * 8 + 2 * t + (j & 1);
                part[warp][r * RS + col] = acc[u][q][j];
            }
    if (norm_w) {
#pragma unroll
        for (int q = 0; q < RG; ++q) {
            float v = ss[q];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            if (t == 0) part_ss[warp][q * 8 + g] = v;
        }
    }
    __syncthreads();
    linear_finish<R, 16, SWIGLU, 1, RS, R * RS>(&part[0][0], &part_ss[0][0], kw, n0, r0, rows, K,
                                                N, norm_w, eps, bias, out, store);
}

// two blocks an SM at least (128 registers a thread): SwiGLU at 32 rows took 162, one block an
// SM, and its 192 blocks of a 0.6B model's gate_up then ran in two waves on 132 SMs
#define LINEAR_MMA(RG, XH, SW, NAME) \
extern "C" __global__ void __launch_bounds__(32 * MAX_KW, 2) NAME( \
    const void* x, const long long* rowmap, int seq, const float* norm_w, float eps, \
    const wt_t* w, long long head_stride, const long long* head_index, const float* bias, \
    float* out, int rows, int K, int N, int store) { \
    linear_mma_body<RG, XH, SW>(x, rowmap, seq, norm_w, eps, w, head_stride, head_index, bias, \
                                out, rows, K, N, store); }
LINEAR_MMA(1, false, false, linear_mf8) LINEAR_MMA(2, false, false, linear_mf16)
LINEAR_MMA(4, false, false, linear_mf32)
LINEAR_MMA(1, false, true, linear_mf8s) LINEAR_MMA(2, false, true, linear_mf16s)
LINEAR_MMA(4, false, true, linear_mf32s)
LINEAR_MMA(1, true, false, linear_mh8) LINEAR_MMA(2, true, false, linear_mh16)
LINEAR_MMA(4, true, false, linear_mh32)

// int4 weights (Q4) on tensor cores
#define LINEAR_MMA_Q4(RG, XH, SW, NAME) \
extern "C" __global__ void __launch_bounds__(32 * MAX_KW, 2) NAME( \
    const void* x, const long long* rowmap, int seq, const float* norm_w, float eps, \
    const wt_t* w, long long head_stride, const long long* head_index, const float* bias, \
    float* out, int rows, int K, int N, int store, const half_t* scales, int group) { \
    linear_mma_body<RG, XH, SW, true>(x, rowmap, seq, norm_w, eps, w, head_stride, head_index, \
                                      bias, out, rows, K, N, store, scales, group); }
LINEAR_MMA_Q4(1, false, false, linear_mqf8) LINEAR_MMA_Q4(2, false, false, linear_mqf16)
LINEAR_MMA_Q4(4, false, false, linear_mqf32)
LINEAR_MMA_Q4(1, false, true, linear_mqf8s) LINEAR_MMA_Q4(2, false, true, linear_mqf16s)
LINEAR_MMA_Q4(4, false, true, linear_mqf32s)
LINEAR_MMA_Q4(1, true, false, linear_mqh8) LINEAR_MMA_Q4(2, true, false, linear_mqh16)
LINEAR_MMA_Q4(4, true, false, linear_mqh32)
#endif
"""


INT4_ZERO = 8  # the code of 0.0 (plugins/quant_linear.py's symmetric layout)
INT4_MATRICES = ("qkv", "o", "gate_up", "down")  # a layer's matrices an int4 build quantizes


def int4_weights(codes: np.ndarray, scales: np.ndarray, group: int) -> np.ndarray:
    """The float32 matrix [rows, K] of the Q4 variants' ``codes`` [rows, K / 2] (two a byte,
    the lower k in the low nibble) and ``scales`` [rows, K / group]: (code - 8) * scale."""
    from edgeomni.plugins.quant_linear import unpack_codes

    rows = codes.shape[0]
    k = codes.shape[-1] * 2
    q = unpack_codes(codes.reshape(rows, -1), k).astype(np.float32) - INT4_ZERO
    s = np.repeat(scales.reshape(rows, -1).astype(np.float32), group, axis=1)
    return q * s


def rms_scale(x: np.ndarray, eps: float) -> np.ndarray:
    x = x.astype(np.float64)
    return 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def linear_reference(
    x: np.ndarray, w: np.ndarray, *, norm_w: np.ndarray | None = None, eps: float = 1e-6,
    bias: np.ndarray | None = None, swiglu: bool = False, residual: np.ndarray | None = None,
    half_x: bool = False,
) -> np.ndarray:  # fmt: skip
    """``linear`` for rows x [T, K], w [N or 2N, K] (float64 result). ``half_x``: the tensor
    core variants' rounding of x (times the norm's weight) to float16; the RMS scale, a
    factor of each row's sums, applies after the products as in the kernels."""
    x = x.astype(np.float64)
    scale = 1.0
    if norm_w is not None:
        scale = rms_scale(x, eps)
        x = (x.astype(np.float32) * norm_w.astype(np.float32)).astype(np.float64)
    if half_x:
        x = x.astype(np.float16).astype(np.float64)
    y = (x @ w.astype(np.float64).T) * scale
    if swiglu:
        gate, up = np.split(y, 2, axis=-1)
        y = gate / (1.0 + np.exp(-gate)) * up
    if bias is not None:
        y = y + bias
    return y if residual is None else residual.astype(np.float64) + y
