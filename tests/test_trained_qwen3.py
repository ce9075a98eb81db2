"""The perplexity harness (tests/trained_qwen3/perplexity.py) on the trained tiny Qwen3 and Qwen3.5:
each fp32 engine scores the held-out text as transformers does, window for window, so the same
harness can measure what int4 weights cost (issue 32; Qwen3.5's recurrent layers, issue 52)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from trained_qwen3 import perplexity as ppl


@pytest.fixture(params=["trained_qwen3", "trained_qwen35"])
def trained(request: pytest.FixtureRequest, exports: Any) -> ppl.Baseline:
    """Each trained checkpoint's fp32 baseline (conftest.py; ``exports`` named so the tests
    are tiered slow, as the baselines' builds are)."""
    return request.getfixturevalue(request.param)


def test_fp32_engine_perplexity_equals_transformers(trained: ppl.Baseline) -> None:
    got = trained.scores
    ref = ppl.torch_perplexity(trained.ckpt, trained.ids, ppl.WINDOW, ppl.BATCH)
    assert got["windows"] == ref["windows"] == ppl.N_WINDOWS
    assert got["tokens"] == ref["tokens"] == got["windows"] * (ppl.WINDOW - 1)
    assert abs(got["ppl"] / ref["ppl"] - 1) < 1e-4, (got["ppl"], ref["ppl"])
    np.testing.assert_allclose(got["token_nll"], ref["token_nll"], rtol=1e-3, atol=1e-4)
    assert np.array_equal(got["greedy"], ref["greedy"])
    assert ppl.greedy_agreement(got, ref) == 1.0


def test_model_has_learned(trained: ppl.Baseline) -> None:
    """Far below the unigram baseline training.json records: a model whose predictions a
    quantization can spoil, and the committed checkpoint the trained one."""
    record = json.loads((trained.ckpt / "training.json").read_text())
    assert trained.scores["ppl"] < 0.2 * record["unigram_heldout_ppl"]
    true_next = ppl.windows(trained.ids, ppl.WINDOW)[:, 1:]
    assert (trained.scores["greedy"] == true_next).mean() > 0.25  # top-1 accuracy (0.33)


def test_rows_and_batch_size_do_not_change_scores(trained: ppl.Baseline) -> None:
    """Windows in cohorts of 3 (the last of 1 row: a fresh session over a cache earlier
    windows filled, a Qwen3.5 row's recurrent state reset) score as in cohorts of 8."""
    ids = trained.ids[: 4 * ppl.WINDOW]
    small = ppl.engine_perplexity(trained.engine_dir, ids, ppl.WINDOW, batch=3)
    np.testing.assert_allclose(
        small["token_nll"], trained.scores["token_nll"][:4], rtol=1e-4, atol=1e-5
    )
    assert np.array_equal(small["greedy"], trained.scores["greedy"][:4])
    assert ppl.mean_kl(trained.scores, trained.scores) == 0.0
