"""What the in-engine samplers' tests share (tests/test_engine_sampler.py for the ONNX engines'
sampler, tests/test_fused_sampler.py for the fused kernels'): the sampling settings they draw
with, and a generator that hands out given uniform numbers."""

from __future__ import annotations

import numpy as np

from edgeomni.runtime.sampling import SamplingParams

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
