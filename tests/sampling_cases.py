"""What the in-engine samplers' tests share (tests/test_engine_sampler.py for the ONNX engines'
sampler, tests/test_fused_sampler.py for the fused kernels'): the sampling settings they draw
with, a generator that hands out given uniform numbers, and the draw-for-draw comparison."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgeomni.runtime.sampling import SamplingParams, sample

K = 64  # the top-k both in-engine samplers draw from

SETTINGS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.8),  # the code predictor's defaults
    SamplingParams(temperature=1.3, top_k=10, top_p=1.0),
    SamplingParams(temperature=0.6, top_k=63, top_p=0.3),
    SamplingParams(temperature=0.9, top_k=2, top_p=0.95),
]


def settings_id(p: SamplingParams) -> str:
    return f"T{p.temperature}-k{p.top_k}-p{p.top_p}"


class Fixed:
    """A generator whose next uniform numbers are given (the engine's uniform input)."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = list(values)

    def random(self) -> float:
        return float(self.values.pop(0))


def compare_draws(draw: Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray],
                  params: SamplingParams, vocab: int, trials: int, seed: int) -> tuple[int, int]:  # fmt: skip
    """``draw(logits, uniform, gen)`` (an in-engine draw of 16 rows from the top K) against the
    host's ``sample`` on float16 logits with forced ties, row by row: a row whose k-th value a
    token outside the K ties must come out -1 (undecided). Returns (tied, undecided) counts."""
    gen = np.random.default_rng(seed)
    k = 1 if params.greedy else params.top_k
    tied = undecided = 0
    for trial in range(trials):
        # float16 logits, as a GPU engine gives them: equal values are common
        logits = (gen.standard_normal((16, vocab)) * 2).astype(np.float16).astype(np.float32)
        logits[trial % 16, gen.choice(vocab, 5, replace=False)] = logits[trial % 16].max()
        u = gen.random(16)
        got = draw(logits, u, gen)
        srt = -np.sort(-logits, axis=1)
        for b in range(16):
            if srt[b, k - 1] == srt[b, K - 1]:  # a token outside the K may tie the k-th
                assert got[b] == -1
                undecided += 1
                continue
            want = sample(logits[b : b + 1], params, Fixed(u[b : b + 1]))[0]  # type: ignore[arg-type]
            assert got[b] == want, (trial, b)
        tied += int((srt[:, k] == srt[:, k - 1]).sum())
    return tied, undecided
