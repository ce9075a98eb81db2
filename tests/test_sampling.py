"""runtime/sampling.py against Hugging Face's logits processors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from edgeomni.runtime.sampling import (
    SAMPLING_KEYS,
    SamplingParams,
    apply_repetition_penalty,
    candidate_distribution,
    sample,
    sampling_from_dict,
)


def _hf_support(row: np.ndarray, p: SamplingParams) -> tuple[set[int], np.ndarray]:
    """Tokens HF's Temperature -> TopK -> TopP chain leaves finite, and their softmax."""
    scores = torch.from_numpy(row[None].copy())
    ids = torch.zeros((1, 1), dtype=torch.long)
    scores = TemperatureLogitsWarper(p.temperature)(ids, scores)
    if p.top_k > 0:
        scores = TopKLogitsWarper(p.top_k)(ids, scores)
    if p.top_p < 1.0:
        scores = TopPLogitsWarper(p.top_p)(ids, scores)
    finite = torch.isfinite(scores[0])
    return set(torch.nonzero(finite).flatten().tolist()), scores.softmax(-1)[0].numpy()


def test_greedy_is_first_argmax() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 1000)).astype(np.float32)
    logits[2, 10] = logits[2, 700] = 50.0  # a tie: first index wins, like torch.argmax
    for params in (SamplingParams(temperature=0.0), SamplingParams(top_k=1)):
        assert params.greedy
        got = sample(logits, params, np.random.default_rng(1))
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, torch.argmax(torch.from_numpy(logits), -1).numpy())
        assert got[2] == 10
    assert not SamplingParams().greedy


def test_repetition_penalty_matches_hf() -> None:
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((3, 500)) * 4).astype(np.float32)
    # Repeated ids, ids on both signs of zero, and one id past the vocabulary (HF skips it).
    seen_list = [rng.integers(0, 500, size=40) for _ in range(3)]
    seen_list[1] = np.concatenate([seen_list[1], seen_list[1][:5], [500]])
    seen_list[2] = seen_list[2][:1]
    width = max(len(s) for s in seen_list)
    for penalty in (1.3, 0.7):
        ours = logits.copy()
        apply_repetition_penalty(ours, seen_list, penalty)
        # HF takes a rectangular id tensor; pad with an id already in the row.
        padded = np.stack([np.pad(s, (0, width - len(s)), mode="edge") for s in seen_list])
        ref = RepetitionPenaltyLogitsProcessor(penalty)(
            torch.from_numpy(padded), torch.from_numpy(logits.copy())
        )
        np.testing.assert_array_equal(ours, ref.numpy())
        assert not np.array_equal(ours, logits)


def test_sample_applies_penalty_without_touching_caller_logits() -> None:
    logits = np.array([[3.0, 2.9, -1.0]], dtype=np.float32)
    before = logits.copy()
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    assert sample(logits, params, np.random.default_rng(0)).tolist() == [0]
    got = sample(logits, params, np.random.default_rng(0), seen=[np.array([0, 0])])
    assert got.tolist() == [1]  # 3.0 / 2 < 2.9
    np.testing.assert_array_equal(logits, before)


@pytest.mark.parametrize(
    ("k", "p", "temperature", "scale", "vocab"),
    [
        (50, 0.8, 1.0, 3.0, 2000),
        (10, 1.0, 0.7, 1.0, 2000),
        (0, 0.9, 1.0, 3.0, 2000),
        (0, 0.5, 1.3, 0.5, 2000),
        (200, 0.95, 0.6, 2.0, 2000),
        (5, 0.3, 1.0, 1.0, 100),
        (0, 0.8, 1.0, 1.0, 151936),  # top-p alone must grow past the first guess
        (0, 0.8, 1.0, 8.0, 151936),
        (50, 0.8, 1.0, 1.0, 151936),
    ],
)
def test_candidates_match_hf_topk_topp(
    k: int, p: float, temperature: float, scale: float, vocab: int
) -> None:
    rng = np.random.default_rng(k * 1000 + int(p * 100) + vocab)
    params = SamplingParams(temperature=temperature, top_k=k, top_p=p)
    for _ in range(3):
        row = (rng.standard_normal(vocab) * scale).astype(np.float32)
        ids, probs = candidate_distribution(row, params)
        support, ref_probs = _hf_support(row, params)
        assert set(ids.tolist()) == support
        assert len(ids) == len(support)  # no duplicates
        np.testing.assert_allclose(probs, ref_probs[ids], rtol=1e-4, atol=1e-7)
        assert probs.sum() == pytest.approx(1.0)


def test_top_k_keeps_ties_like_hf() -> None:
    row = np.array([1.0, 5.0, 3.0, 3.0, 0.0], dtype=np.float32)
    params = SamplingParams(top_k=2, top_p=1.0)
    ids, _ = candidate_distribution(row, params)
    assert set(ids.tolist()) == _hf_support(row, params)[0] == {1, 2, 3}


def test_draws_stay_in_support_and_seed_reproduces() -> None:
    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((4, 3000)) * 3).astype(np.float32)
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.7)

    def draws(seed: int) -> list[list[int]]:
        gen = np.random.default_rng(seed)
        return [sample(logits, params, gen).tolist() for _ in range(30)]

    a = draws(7)
    assert draws(7) == a
    assert len({tuple(r) for r in a}) > 1  # it does sample, not argmax
    for row in range(4):
        support = set(candidate_distribution(logits[row], params)[0].tolist())
        assert {draw[row] for draw in a} <= support
    assert draws(8) != a


def test_empirical_distribution_matches_softmax() -> None:
    logits = np.array([[1.0, 0.5, -0.3, 2.0, 0.0]], dtype=np.float32)
    temperature = 0.8
    params = SamplingParams(temperature=temperature, top_k=0, top_p=1.0)
    rng = np.random.default_rng(1234)
    n = 20000
    draws = np.array([sample(logits, params, rng)[0] for _ in range(n)])
    freq = np.bincount(draws, minlength=5) / n
    z = logits[0].astype(np.float64) / temperature
    expected = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    # Binomial standard error is at most sqrt(0.25 / 20000) ~ 0.0035; allow about 4 sigma.
    np.testing.assert_allclose(freq, expected, atol=0.015)


def test_sampling_from_dict_overrides_and_aliases() -> None:
    base = SamplingParams(temperature=0.5, top_k=7)
    got = sampling_from_dict({"top_p": 0.9, "sampling_seed": 3, "other": "x"}, base)
    assert got == SamplingParams(temperature=0.5, top_k=7, top_p=0.9, seed=3)
    assert sampling_from_dict({}, base) is base
    talker = sampling_from_dict(
        {"temperature": 0.1, "talker_temperature": 0.9, "talker_seed": 1}, prefix="talker_"
    )
    assert talker.temperature == 0.9 and talker.seed == 1
    assert sampling_from_dict({"temperature": 1}).temperature == 1.0
    assert isinstance(sampling_from_dict({"temperature": 1}).temperature, float)
    assert {"temperature", "top_k", "top_p", "repetition_penalty", "seed"} <= set(SAMPLING_KEYS)
    assert "sampling_seed" in SAMPLING_KEYS


@pytest.mark.parametrize(
    ("d", "prefix", "key"),
    [
        ({"temperature": -0.1}, "", "temperature"),
        ({"temperature": "hot"}, "", "temperature"),
        ({"temperature": float("nan")}, "", "temperature"),
        ({"top_k": -1}, "", "top_k"),
        ({"top_k": 2.5}, "", "top_k"),
        ({"top_k": True}, "", "top_k"),
        ({"top_p": 0.0}, "", "top_p"),
        ({"top_p": 1.5}, "", "top_p"),
        ({"repetition_penalty": 0}, "", "repetition_penalty"),
        ({"seed": -3}, "", "seed"),
        ({"sampling_seed": "x"}, "", "sampling_seed"),
        ({"seed": 1, "sampling_seed": 2}, "", "sampling_seed"),
        ({"talker_top_p": 2.0}, "talker_", "talker_top_p"),
    ],
)
def test_invalid_values_name_the_key(d: dict, prefix: str, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        sampling_from_dict(d, prefix=prefix)


def test_params_validate_on_construction() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="logits must be"):
        sample(np.zeros(5, np.float32), SamplingParams(), np.random.default_rng(0))
