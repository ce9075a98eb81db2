"""The fused backend's draw of a speech frame's first code on the device (``first_draw``,
compiled into plugins/decoder_cuda.py's module), so the talker's step, the draw and the next
frame's code predictor run back to back with no host read between them
(runtime/speech/talker.py's device loop).

One block a row. The talker engine's top K (values descending, the lower id first among
equals; float16 values where its outputs are, as the host reads them) gets the bans and the
repetition penalty as runtime/sampling.py's ``_ban_and_penalise`` gives them on the host:
``marks`` [B, V] holds 2 for an id the row may not draw now (the codec's control band, the end
of speech before its minimum) and 1 for one it drew before; a banned score is -inf, a seen one
x * penalty below 0 and x / penalty above (float32, IEEE rounding). The K are sorted again
(rank by rank: value descending, lower id first), and ``draw_row`` draws from them with the
host's uniform number. A row is drawn only where the top K decides it as ``_topk_scores``
says: its top_k-th score after the bans and penalty must be above the K-th value before them
(no id outside the K can reach it); else -1, and the host draws that step. The drawn id's row
of the talker's codec embedding table [V, H] (float32; row 0 for -1) goes to ``base`` [B, H]
(float32, the frame sum's first term) and ``first`` [B, H] (the code predictor's first input,
float16 where ``half_first``: rounded to nearest, as numpy's cast of the host's rows).
"""

from __future__ import annotations

import numpy as np

SEEN, BANNED = 1, 2  # ``marks``' values (runtime/sampling.py's ``draw_marks`` makes them)

SOURCE = r"""
// ---- a speech frame's first code drawn on the device (plugins/speech_draw_cuda.py) --------
extern "C" __global__ void __launch_bounds__(TOPK_THREADS) first_draw(
    const void* __restrict__ values, int half_values, const long long* __restrict__ ids, int K,
    int V,
    const unsigned char* __restrict__ marks, float penalty, const double* __restrict__ uniform,
    const double* __restrict__ temperature, const long long* __restrict__ top_k,
    const double* __restrict__ top_p, const float* __restrict__ table, int H,
    long long* __restrict__ drawn, float* __restrict__ base, void* first, int half_first)
{
    GRID_LAUNCH();
    GRID_WAIT();
    SHARED_BEGIN;
    SHARED(float, xs, [TOPK_MAX]);
    SHARED(float, xr, [TOPK_MAX]);
    SHARED(long long, is, [TOPK_MAX]);
    SHARED(long long, ir, [TOPK_MAX]);
    const int b = blockIdx.x;
    const long long at = (long long)b * K;
    const long long* id = ids + at;
#define VALUE(i) (half_values ? h2f(reinterpret_cast<const half_t*>(values)[at + (i)]) \
                              : reinterpret_cast<const float*>(values)[at + (i)])
    const float floor_value = VALUE(K - 1);
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
        float x = VALUE(i);
        const long long t = id[i];
        const unsigned char m = (t >= 0 && t < V) ? marks[(long long)b * V + t] : 0;
        if (m == 2) x = NEG_INF;
        else if (m == 1) x = x < 0.f ? x * penalty : x / penalty;
        xr[i] = x;
        ir[i] = t;
    }
#undef VALUE
    __syncthreads();
    for (int i = threadIdx.x; i < K; i += blockDim.x) {  // each score's place in the new order
        const float x = xr[i];
        const long long t = ir[i];
        int rank = 0;
        for (int j = 0; j < K; ++j) rank += xr[j] > x || (xr[j] == x && ir[j] < t);
        xs[rank] = x;
        is[rank] = t;
    }
    __syncthreads();
    draw_row(b, xs, is, K, V, floor_value, uniform, temperature, top_k, top_p, nullptr,
             nullptr, 0, drawn, nullptr);
    const long long pick = drawn[b];
    const float* row = table + (pick < 0 ? 0LL : pick) * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        const float e = row[i];
        base[(long long)b * H + i] = e;
        if (half_first) reinterpret_cast<half_t*>(first)[(long long)b * H + i] = f2h(e);
        else reinterpret_cast<float*>(first)[(long long)b * H + i] = e;
    }
}
"""


def first_draw_reference(
    values: np.ndarray, ids: np.ndarray, marks: np.ndarray, penalty: float,
    uniform: np.ndarray, *, temperature: float, top_k: int, top_p: float, table: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``first_draw``: the drawn ids [B] (-1 where the K cannot decide) and their table rows
    [B, H] (row 0 for -1), float32."""
    from edgeomni.plugins.decoder_cuda import sample_reference

    x = np.asarray(values, np.float32).copy()
    hit = np.take_along_axis(marks, ids, axis=1)
    x = np.where(hit == SEEN, np.where(x < 0, x * np.float32(penalty), x / np.float32(penalty)),
                 x)  # fmt: skip
    x = np.where(hit == BANNED, np.float32(-np.inf), x).astype(np.float32)
    order = np.lexsort((ids, -x), axis=-1)
    xs, ids_sorted = np.take_along_axis(x, order, 1), np.take_along_axis(ids, order, 1)
    floor = np.asarray(values, np.float32)[:, -1]  # the K-th value before bans and penalty
    drawn, _ = sample_reference(xs, ids_sorted, uniform, temperature=temperature, top_k=top_k,
                                top_p=top_p, floor=floor)
    return drawn, table[np.maximum(drawn, 0)].astype(np.float32)


def first_draw_launch(rows: int) -> tuple[tuple[int], int]:
    """A block a row, of the top-K kernels' TOPK_THREADS."""
    return (rows,), 512
