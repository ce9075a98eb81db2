"""The fused backend's ``linear`` for prefills (CUDA C, compiled into plugins/decoder_cuda.py's
module): a tensor-core GEMM of 64 x rows by 64 weight rows a block, for calls of GEMM_ROWS rows
and more with float16 or int4 weights whose tiles fill the GPU (``gemm_pays``).

The decode variants (plugins/decoder_linear_cuda.py's ``linear_m*``) keep all of a call's rows in
one block and split K over warps, so that a decode step reads its weights once; a prefill of
hundreds of rows runs them as a block per 32 rows, each reading its 16 columns' weights and
its rows' x from global memory one register load at a time. Here a block holds a 64 x 64 tile
of products and streams K through shared memory in steps of 32, three steps in flight
(``cp.async``: the copies of the steps ahead run while the tensor cores take this one): a
weight is read from memory once per 64 rows, an x value once per 64 weight rows.

The epilogue is the decode variants' (``linear_finish``: the norm's row scale, SwiGLU, bias,
the three stores), and so is the rounding: x times the norm's weight rounded to float16, int4
weights dequantized ((code - 8) * scale) and rounded to float16, float32 sums. A row's sums run
in k order whatever the rows beside it (batch invariance within the family).
"""

from __future__ import annotations

GEMM_ROWS = 64  # calls of this many rows and more may run as a GEMM (gemm_pays)
# ... once their tiles make this many blocks: about a wave of an H100's 132 SMs. Fewer leave
# SMs idle for all of a long K, where the mma variants' blocks of 16 columns fill them: on an
# H100 (docs/gpu-runs/2026-12-06-i55-lease3/) the GEMM lost at 64 tiles (o and down at 256
# rows: 0.79 to 0.85 of the mma variant's speed; qkv at 64 rows: 0.72 to 0.95) and won from
# 256 (qkv at 256 rows 2.0 to 2.7x, gate_up 1.5 to 1.8x, o and down at 1024 rows 2.1 to 2.6x)
GEMM_MIN_BLOCKS = 128
GEMM_TILE = 64  # x rows and weight rows a block computes (SwiGLU: 32 outputs, gate and up)
GEMM_K = 32  # K a pipeline step carries: GEMM calls need K a multiple of it
GEMM_THREADS = 128  # 4 warps: 2 along the weight rows by 2 along the x rows, 32 x 32 each


def gemm_fits(k: int, swiglu: bool, half_input: bool) -> bool:
    """Whether a ``linear`` call of this K and epilogue has a GEMM variant."""
    return k % GEMM_K == 0 and not (swiglu and half_input)


def gemm_pays(rows: int, n: int, swiglu: bool) -> bool:
    """Whether a call of ``rows`` rows and N = ``n`` runs faster as a GEMM than on the mma
    variants (GEMM_ROWS, GEMM_MIN_BLOCKS)."""
    cols, row_blocks = gemm_grid(rows, n, swiglu)
    return rows >= GEMM_ROWS and cols * row_blocks >= GEMM_MIN_BLOCKS


def gemm_name(int4: bool, half_input: bool, swiglu: bool) -> str:
    return f"linear_g{'q' if int4 else ''}{'h' if half_input else 'f'}{'s' if swiglu else ''}"


def gemm_grid(rows: int, n: int, swiglu: bool) -> tuple[int, int]:
    """(blocks along the outputs, blocks along the rows): SwiGLU's tile is 32 outputs' gate
    and up weight rows."""
    cols = GEMM_TILE // 2 if swiglu else GEMM_TILE
    return -(-n // cols), -(-rows // GEMM_TILE)


SOURCE = r"""
#if W_HALF
// G_TILE, G_K and G_THREADS come from the module's defines (decoder_cuda.Variant.source)
#define G_STAGES 3
#define G_WS 40   // a weight row's halves in shared memory: 32 and 8 of padding (80 bytes)
// a float32 x row's floats: 32 and 8 of padding (160 bytes): a half warp's 8-byte reads (rows
// g = 0 .. 3, words 2t, 2t + 1) then fall in 32 distinct banks
#define G_XS 40
#define G_XH 40   // a float16 x row's halves
#define G_RS 68   // the epilogue's row stride: 64 columns and 4 of padding
static_assert(G_TILE == 64 && G_K == 32 && G_THREADS == 128,
              "linear_gemm_body's copies: 2 weight and 4 x chunks a thread, int4 rows by halves");
#ifndef DECODER_HOST_EMULATION  // tests/test_fused_kernels_host.py: copies done at once
// 16 (4) bytes from global to shared memory, asynchronously; zeros where !ok (none read)
__device__ __forceinline__ void cp16(void* dst, const void* src, bool ok) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(d), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp4(void* dst, const void* src, bool ok) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"
                 :: "r"(d), "l"(src), "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// wait until at most N committed groups are still copying
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
#endif

// The GEMM: out[r, n] as linear_body defines it, for rows r0 .. r0 + 63 (blockIdx.y) and the
// block's 64 weight rows (blockIdx.x: 64 outputs, or SwiGLU's 32 gate and 32 up rows). A
// pipeline step carries K = 32 of the weight rows (float16, or int4 codes and the word holding
// their scale), of the x rows (as stored) and of the norm's weight into one of three shared
// stages; warp (wm, wn) multiplies weight rows 32 wm .. and x rows 32 wn .. of it, two k16
// halves of 2 x 4 mma tiles. Warps with wm = 0 see each x row once and sum its squares.
//
// MOE (moe_gate_up_gemm, moe_down_gemm): block y is tile moe_tiles[1 + 2y] = (expert e, r0) of
// moe_group's list, its rows slots order[offsets[e] + r0 ..] of expert e: x row slot / slot_div
// (a token's normed state for gate_up, the slot's activations for down), weights at e *
// expert_stride, SwiGLU's gate and up rows interleaved (2c, 2c + 1, as fc1 stores them), the
// result stored (float32) in the slot's row. No norm or bias there.
template <bool XHALF, bool SWIGLU, bool Q4, bool MOE = false>
__device__ __forceinline__ void linear_gemm_body(
    const void* __restrict__ x, const long long* __restrict__ rowmap, int seq,
    const float* __restrict__ norm_w, float eps,
    const wt_t* __restrict__ w, long long head_stride, const long long* __restrict__ head_index,
    const float* __restrict__ bias, float* out, int rows, int K, int N, int store,
    const half_t* __restrict__ scales, int group, const int* __restrict__ moe_offsets = nullptr,
    const int* __restrict__ moe_order = nullptr, const int* __restrict__ moe_tiles = nullptr,
    int slot_div = 1, long long expert_stride = 0)
{
    constexpr int C = SWIGLU ? G_TILE / 2 : G_TILE;  // outputs a block
    constexpr int W_BYTES = Q4 ? G_TILE * 16 : G_TILE * G_WS * 2;  // a stage's weights
    constexpr int X_BYTES = XHALF ? G_TILE * G_XH * 2 : G_TILE * G_XS * 4;
    constexpr int STAGE = W_BYTES + X_BYTES + G_TILE * 4 + G_K * 4;  // + scale words, norm
    constexpr int MAIN = G_STAGES * STAGE, PART = G_TILE * G_RS * 4;
    SHARED_BEGIN_INNER;
    SHARED(unsigned char, smem, [MAIN > PART ? MAIN : PART]);
    SHARED(float, part_ss, [G_TILE]);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wm = warp & 1, wn = warp >> 1;
    const int n0 = blockIdx.x * C;
    int r0 = blockIdx.y * G_TILE, lo = 0;  // MOE: the tile's first row, its expert's first slot
    const int steps = K / G_K;
    long long head = head_index ? head_index[0] * head_stride : 0LL;
    if (MOE) {  // the tile list is the kernel before's output
        GRID_LAUNCH();
        GRID_WAIT();
        if ((int)blockIdx.y >= moe_tiles[0]) return;
        const int e = moe_tiles[1 + 2 * blockIdx.y];
        r0 = moe_tiles[2 + 2 * blockIdx.y];
        lo = moe_offsets[e];
        rows = moe_offsets[e + 1] - lo;
        head = e * expert_stride;
    }
    const wt_t* wb = w + (Q4 ? 0LL : head);
    const unsigned char* qb = reinterpret_cast<const unsigned char*>(w) + (Q4 ? head / 2 : 0LL);
    const half_t* sb = Q4 ? scales + head / group : nullptr;
    // tile row i's weight row, and whether it exists
    auto wrow = [&](int i, bool& ok) -> long long {
        const int c = SWIGLU ? (i & (C - 1)) : i;
        ok = n0 + c < N;
        if (MOE && SWIGLU) return 2LL * (n0 + c) + (i >= C);  // fc1: gate, up, gate, up, ...
        return (long long)(n0 + c) + (SWIGLU && i >= C ? N : 0);
    };
    // int4: the row this thread copies (element and scale offsets), and the scales' offsets of
    // the rows its A fragments read (rows g and g + 8 of two m tiles), whose parity says which
    // half of a copied word is the scale
    const int kg = Q4 ? K / group : 0;  // scales a row
    bool q_ok = false;
    long long q_row = 0, q_scale = 0, a_scale[2][2];
    if (Q4) {
        q_row = wrow(tid & (G_TILE - 1), q_ok);
        q_scale = q_row * kg;
        q_row *= K;
        const long long base = (long long)(reinterpret_cast<unsigned long long>(sb) >> 1);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                bool ok;
                a_scale[mt][hi] = base + wrow(wm * 32 + mt * 16 + g + 8 * hi, ok) * kg;
            }
    }
    auto w_stage = [&](int s) -> unsigned char* { return smem + (s % G_STAGES) * STAGE; };
    // a step's weights: 4 chunks of 16 bytes a row (float16), or one of codes and a scale word
    auto issue_w = [&](int s) {
        unsigned char* dst = w_stage(s);
        const int k0 = s * G_K;
        if (Q4) {  // this thread's row: tid & 63, codes from the first 64 threads
            const int i = tid & (G_TILE - 1);
            const bool ok = q_ok && s < steps;
            if (tid < G_TILE) {
                cp16(dst + i * 16, qb + (ok ? (q_row + k0) / 2 : 0), ok);
            } else {  // the aligned word holding the scale (4-byte copies only)
                const half_t* p = sb + (ok ? q_scale + k0 / group : 0);
                const void* word = reinterpret_cast<const void*>(
                    reinterpret_cast<unsigned long long>(p) & ~3ull);
                cp4(dst + W_BYTES + X_BYTES + i * 4, word, ok);
            }
        } else {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int c = tid + j * G_THREADS, i = c >> 2, part = c & 3;
                bool ok;
                const long long row = wrow(i, ok);
                ok = ok && s < steps;
                cp16(dst + (i * G_WS + part * 8) * 2, wb + (ok ? row * K + k0 + part * 8 : 0),
                     ok);
            }
        }
    };
    // this thread's x chunks keep their rows from step to step
    constexpr int XCH = XHALF ? 2 : 4;  // chunks of 16 bytes a thread a step
    constexpr int XPR = XHALF ? 4 : 8;  // chunks a row
    auto issue_x = [&](int s, const long long* src) {
        unsigned char* dst = w_stage(s) + W_BYTES;
        const int k0 = s * G_K;
#pragma unroll
        for (int j = 0; j < XCH; ++j) {
            const int c = tid + j * G_THREADS, i = c / XPR, part = c % XPR;
            const bool ok = src[j] >= 0 && s < steps;
            if (XHALF) {
                cp16(dst + (i * G_XH + part * 8) * 2,
                     reinterpret_cast<const half_t*>(x) + (ok ? src[j] + k0 + part * 8 : 0), ok);
            } else {
                cp16(dst + (i * G_XS + part * 4) * 4,
                     reinterpret_cast<const float*>(x) + (ok ? src[j] + k0 + part * 4 : 0), ok);
            }
        }
        if (norm_w && tid < G_K / 4)
            cp16(dst + X_BYTES + G_TILE * 4 + tid * 16, norm_w + (s < steps ? k0 + tid * 4 : 0),
                 s < steps);
    };
#pragma unroll
    for (int s = 0; s < G_STAGES - 1; ++s) issue_w(s);  // weights before the kernel before ends
    if (!MOE) {
        GRID_LAUNCH();
        GRID_WAIT();
    }
    long long src[XCH];  // x element offsets of this thread's chunks' rows, -1 past the call
#pragma unroll
    for (int j = 0; j < XCH; ++j) {
        const int rr = r0 + (tid + j * G_THREADS) / XPR;
        const long long row = MOE ? (rr < rows ? moe_order[lo + rr] / slot_div : 0)
                                  : (rowmap ? (long long)rr * seq + rowmap[rr] : rr);
        src[j] = rr < rows ? row * K : -1;
    }
#pragma unroll
    for (int s = 0; s < G_STAGES - 1; ++s) { issue_x(s, src); cp_commit(); }
    float acc[2][4][4], ss[4];
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            ss[b] = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[a][b][j] = 0.f;
        }
    for (int s = 0; s < steps; ++s) {
        cp_wait<G_STAGES - 2>();
        __syncthreads();  // step s is in, and every warp is done with the stage refilled next
        if (s + G_STAGES - 1 < steps) { issue_w(s + G_STAGES - 1); issue_x(s + G_STAGES - 1, src); }
        cp_commit();
        const unsigned char* st = w_stage(s);
        const int s_group = Q4 ? s * G_K / group : 0;  // the step's group of K
        const float* gs = reinterpret_cast<const float*>(st + W_BYTES + X_BYTES + G_TILE * 4);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            unsigned a[2][4], b[4][2];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int hi = 0; hi < 2; ++hi) {  // rows g and g + 8 of the m tile
                    const int i = wm * 32 + mt * 16 + g + 8 * hi;
                    if (Q4) {  // bytes kk*8 + t and + 4: codes k = 2t, 2t + 1 and k + 8, + 9
                        const unsigned word = reinterpret_cast<const unsigned*>(st + i * 16)[kk * 2];
                        const unsigned word8 = reinterpret_cast<const unsigned*>(st + i * 16)[kk * 2 + 1];
                        const unsigned sw = reinterpret_cast<const unsigned*>(st + W_BYTES + X_BYTES)[i];
                        const int odd = (int)((a_scale[mt][hi] + s_group) & 1);  // the upper half
                        const float scale = h2f((half_t)(sw >> (16 * odd)));
                        const unsigned b0 = (word >> (8 * t)) & 0xffu, b1 = (word8 >> (8 * t)) & 0xffu;
                        a[mt][hi] = pack_h2(dequant4(b0) * scale, dequant4(b0 >> 4) * scale);
                        a[mt][2 + hi] = pack_h2(dequant4(b1) * scale, dequant4(b1 >> 4) * scale);
                    } else {
                        const unsigned* row = reinterpret_cast<const unsigned*>(st) + i * (G_WS / 2);
                        a[mt][hi] = row[kk * 8 + t];
                        a[mt][2 + hi] = row[kk * 8 + t + 4];
                    }
                }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int i = wn * 32 + nt * 8 + g;
#pragma unroll
                for (int h = 0; h < 2; ++h) {  // k = 2t, 2t + 1 and k + 8, + 9
                    const int k = kk * 16 + 2 * t + 8 * h;
                    float v0, v1;
                    if (XHALF) {
                        const unsigned raw = reinterpret_cast<const unsigned*>(
                            st + W_BYTES)[(i * G_XH + k) / 2];
                        if (!norm_w) { b[nt][h] = raw; continue; }
                        v0 = h2f((half_t)(raw & 0xffffu)); v1 = h2f((half_t)(raw >> 16));
                    } else {
                        const float2 xv = *reinterpret_cast<const float2*>(
                            reinterpret_cast<const float*>(st + W_BYTES) + i * G_XS + k);
                        v0 = xv.x; v1 = xv.y;
                    }
                    if (norm_w) {
                        if (wm == 0) ss[nt] += v0 * v0 + v1 * v1;
                        v0 *= gs[k]; v1 *= gs[k + 1];
                    }
                    b[nt][h] = pack_h2(v0, v1);
                }
            }
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) mma16816(acc[mt][nt], a[mt], b[nt]);
        }
    }
    cp_wait<0>();
    __syncthreads();  // the stages are free: the epilogue's sums go where they were
    float* part = reinterpret_cast<float*>(smem);
    // C fragment: acc[mt][nt][j] is weight row 32 wm + 16 mt + g + 8 (j >> 1), x row
    // 32 wn + 8 nt + 2t + (j & 1)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                part[(wn * 32 + nt * 8 + 2 * t + (j & 1)) * G_RS + wm * 32 + mt * 16 + g
                     + 8 * (j >> 1)] = acc[mt][nt][j];
    if (norm_w && wm == 0) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            float v = ss[nt];
            v += __shfl_xor_sync(0xffffffffu, v, 1);
            v += __shfl_xor_sync(0xffffffffu, v, 2);
            if (t == 0) part_ss[wn * 32 + nt * 8 + g] = v;
        }
    }
    __syncthreads();
    if (MOE) {  // each tile row's slot gets its row of results
        for (int i = tid; i < C * G_TILE; i += G_THREADS) {
            const int c = i % C, r = i / C;
            if (n0 + c >= N || r0 + r >= rows) continue;
            const float a = part[r * G_RS + c];
            const float v = SWIGLU ? a / (1.0f + expf(-a)) * part[r * G_RS + C + c] : a;
            out[(long long)moe_order[lo + r0 + r] * N + n0 + c] = v;
        }
        return;
    }
    linear_finish<G_TILE, C, SWIGLU, 1, G_RS, 0>(part, part_ss, 1, n0, r0, rows, K, N, norm_w,
                                                 eps, bias, out, store);
}

#define LINEAR_GEMM(XH, SW, Q4, NAME) \
extern "C" __global__ void __launch_bounds__(G_THREADS) NAME( \
    const void* x, const long long* rowmap, int seq, const float* norm_w, float eps, \
    const wt_t* w, long long head_stride, const long long* head_index, const float* bias, \
    float* out, int rows, int K, int N, int store, const half_t* scales, int group) { \
    linear_gemm_body<XH, SW, Q4>(x, rowmap, seq, norm_w, eps, w, head_stride, head_index, \
                                 bias, out, rows, K, N, store, scales, group); }
LINEAR_GEMM(false, false, false, linear_gf) LINEAR_GEMM(false, true, false, linear_gfs)
LINEAR_GEMM(true, false, false, linear_gh)
LINEAR_GEMM(false, false, true, linear_gqf) LINEAR_GEMM(false, true, true, linear_gqfs)
LINEAR_GEMM(true, false, true, linear_gqh)

// grouped MoE on tensor cores (plugins/moe_cuda.py): fc1 [E, 2I, H] over the slots' tokens'
// normed states xn [T, H] into act [S, I]; fc2 [E, H, I] over act into d [S, H]
// (the _q4 kernels: int4 experts, their float16 scales one a row and ``group`` of K)
#define MOE_GEMM(Q4, GATE_UP, DOWN) \
extern "C" __global__ void __launch_bounds__(G_THREADS) GATE_UP( \
    const float* xn, const wt_t* fc1, const int* offsets, const int* order, const int* tiles, \
    int top_k, int H, int I, float* act, const half_t* s1, int group) { \
    linear_gemm_body<false, true, Q4, true>(xn, nullptr, 1, nullptr, 0.f, fc1, 0, nullptr, \
                                            nullptr, act, 0, H, I, 0, s1, group, offsets, \
                                            order, tiles, top_k, 2LL * I * H); } \
extern "C" __global__ void __launch_bounds__(G_THREADS) DOWN( \
    const float* act, const wt_t* fc2, const int* offsets, const int* order, const int* tiles, \
    int H, int I, float* d, const half_t* s2, int group) { \
    linear_gemm_body<false, false, Q4, true>(act, nullptr, 1, nullptr, 0.f, fc2, 0, nullptr, \
                                             nullptr, d, 0, I, H, 0, s2, group, offsets, \
                                             order, tiles, 1, (long long)H * I); }
MOE_GEMM(false, moe_gate_up_gemm, moe_down_gemm)
MOE_GEMM(true, moe_gate_up_gemm_q4, moe_down_gemm_q4)
#endif
"""
