"""The perplexity harness (tests/trained_qwen3/perplexity.py) on the trained tiny Qwen3: its fp32
engine scores the held-out text as transformers does, window for window, so the same harness can
measure what int4 weights cost (issue 32)."""

from __future__ import annotations

import json

import numpy as np
from trained_qwen3 import perplexity as ppl


def test_fp32_engine_perplexity_equals_transformers(trained_qwen3: ppl.Baseline) -> None:
    got = trained_qwen3.scores
    ref = ppl.torch_perplexity(trained_qwen3.ckpt, trained_qwen3.ids, ppl.WINDOW, ppl.BATCH)
    assert got["windows"] == ref["windows"] == ppl.N_WINDOWS
    assert got["tokens"] == ref["tokens"] == got["windows"] * (ppl.WINDOW - 1)
    assert abs(got["ppl"] / ref["ppl"] - 1) < 1e-4, (got["ppl"], ref["ppl"])
    np.testing.assert_allclose(got["token_nll"], ref["token_nll"], rtol=1e-3, atol=1e-4)
    assert np.array_equal(got["greedy"], ref["greedy"])
    assert ppl.greedy_agreement(got, ref) == 1.0


def test_model_has_learned(trained_qwen3: ppl.Baseline) -> None:
    """Far below the unigram baseline training.json records: a model whose predictions a
    quantization can spoil, and the committed checkpoint the trained one."""
    record = json.loads((trained_qwen3.ckpt / "training.json").read_text())
    assert trained_qwen3.scores["ppl"] < 0.2 * record["unigram_heldout_ppl"]
    true_next = ppl.windows(trained_qwen3.ids, ppl.WINDOW)[:, 1:]
    assert (trained_qwen3.scores["greedy"] == true_next).mean() > 0.25  # top-1 accuracy (0.33)


def test_rows_and_batch_size_do_not_change_scores(trained_qwen3: ppl.Baseline) -> None:
    """Windows in cohorts of 3 (the last of 1 row: a fresh session over a cache earlier
    windows filled) score as in cohorts of 8."""
    ids = trained_qwen3.ids[: 4 * ppl.WINDOW]
    small = ppl.engine_perplexity(trained_qwen3.engine_dir, ids, ppl.WINDOW, batch=3)
    np.testing.assert_allclose(
        small["token_nll"], trained_qwen3.scores["token_nll"][:4], rtol=1e-4, atol=1e-5
    )
    assert np.array_equal(small["greedy"], trained_qwen3.scores["greedy"][:4])
    assert ppl.mean_kl(trained_qwen3.scores, trained_qwen3.scores) == 0.0
