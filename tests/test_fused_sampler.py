"""The fused engine's in-engine draw (plugins/decoder_cuda.py's ``draw_row``, whose kernels
equal ``sample_reference`` in tests/fused_kernel_cases.py's cases) draws what the host's sampler
(runtime/sampling.py) draws from the same logits and uniform numbers, as the ONNX engines'
sampler does (tests/test_engine_sampler.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from edgeomni.plugins import decoder_cuda as dc
from edgeomni.runtime.sampling import SamplingParams, sample

sys.path.insert(0, str(Path(__file__).parent))
from sampling_cases import SETTINGS, Fixed, settings_id  # noqa: E402

K = 64


@pytest.mark.parametrize("params", SETTINGS, ids=settings_id)
def test_the_fused_draw_is_the_hosts(params: SamplingParams) -> None:
    gen = np.random.default_rng(5)
    greedy = params.greedy
    k = 1 if greedy else params.top_k
    undecided = tied = 0
    for trial in range(20):
        # float16 logits, as a GPU engine gives them: equal values are common
        logits = (gen.standard_normal((16, 500)) * 2).astype(np.float16).astype(np.float32)
        logits[trial % 16, gen.choice(500, 5, replace=False)] = logits[trial % 16].max()
        u = gen.random(16)
        values, ids = dc.topk_reference(logits, K)
        got, _ = dc.sample_reference(values, ids, np.zeros(16) if greedy else u,
                                     temperature=1.0 if greedy else params.temperature,
                                     top_k=k, top_p=1.0 if greedy else params.top_p)  # fmt: skip
        for b in range(16):
            if values[b, k - 1] == values[b, K - 1]:  # an id outside the K may tie the k-th
                assert got[b] == -1
                undecided += 1
                continue
            want = sample(logits[b : b + 1], params, Fixed(u[b : b + 1]))[0]  # type: ignore[arg-type]
            assert got[b] == want, (trial, b)
        tied += int((values[:, k] == values[:, k - 1]).sum()) if k < K else 0
    assert tied > 0 and undecided < 80


def test_the_drawn_rows_embedding_comes_from_the_heads_table() -> None:
    values = np.array([[3.0, 2.0, 1.0], [1.0, 1.0, 1.0]], np.float32)
    ids = np.array([[4, 0, 2], [0, 1, 2]], np.int64)
    tables = np.arange(2 * 5 * 2, dtype=np.float32).reshape(2, 5, 2)
    got, rows = dc.sample_reference(values, ids, np.zeros(2), temperature=1.0, top_k=1,
                                    top_p=1.0, tables=tables, head=1)  # fmt: skip
    assert got.tolist() == [4, -1]  # the second row's best ties the K-th
    np.testing.assert_array_equal(rows, tables[1][[4, 0]])
