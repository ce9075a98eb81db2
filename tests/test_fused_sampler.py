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
from edgeomni.runtime.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from sampling_cases import SETTINGS, K, compare_draws, settings_id  # noqa: E402


@pytest.mark.parametrize("params", SETTINGS, ids=settings_id)
def test_the_fused_draw_is_the_hosts(params: SamplingParams) -> None:
    greedy = params.greedy

    def draw(logits: np.ndarray, u: np.ndarray, gen: np.random.Generator) -> np.ndarray:
        values, ids = dc.topk_reference(logits, K)
        got, _ = dc.sample_reference(values, ids, np.zeros(16) if greedy else u,
                                     temperature=1.0 if greedy else params.temperature,
                                     top_k=1 if greedy else params.top_k,
                                     top_p=1.0 if greedy else params.top_p)  # fmt: skip
        return got

    tied, undecided = compare_draws(draw, params, vocab=500, trials=20, seed=5)
    assert tied > 0 and undecided < 80


def test_the_drawn_rows_embedding_comes_from_the_heads_table() -> None:
    values = np.array([[3.0, 2.0, 1.0], [1.0, 1.0, 1.0]], np.float32)
    ids = np.array([[4, 0, 2], [0, 1, 2]], np.int64)
    tables = np.arange(2 * 5 * 2, dtype=np.float32).reshape(2, 5, 2)
    got, rows = dc.sample_reference(values, ids, np.zeros(2), temperature=1.0, top_k=1,
                                    top_p=1.0, tables=tables, head=1)  # fmt: skip
    assert got.tolist() == [4, -1]  # the second row's best ties the K-th
    np.testing.assert_array_equal(rows, tables[1][[4, 0]])
