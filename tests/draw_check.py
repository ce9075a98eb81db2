"""Per-call check that a code predictor engine's in-graph draws are the host sampler's: every
call's top-K, uniform numbers and drawn codes are recorded and the draws recomputed on the host.
Shared by the CPU test (test_code_predictor_draws.py) and the GPU one (test_gpu.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime import decoder
from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.requests import parse_request_file
from edgeomni.runtime.sampling import SamplingParams, StepLogits, sample_step

BODY = {"max_generate_length": 8, "top_k": 1, "talker_top_k": 10, "talker_seed": 5,
        "talker_max_new_tokens": 17, "talker_min_new_tokens": 17,
        "requests": [{"messages": [{"role": "user", "content": [{"type": "text", "text": p}]}]}
                     for p in ("Hello there", "Tell me a story", "Why?")]}  # fmt: skip


class Given:
    """The uniform numbers the engine was given, as the host sampler's generator."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = list(values)

    def random(self, size: int | None = None) -> float | np.ndarray:
        if size is None:
            return float(self.values.pop(0))
        return np.array([self.values.pop(0) for _ in range(size)], np.float64)


def _settings(body: dict) -> SamplingParams:
    """The residual codes' settings a body asks for (BODY: transformers' defaults)."""
    return SamplingParams(
        temperature=float(body.get("cp_temperature", 1.0)),
        top_k=int(body.get("cp_top_k", 50)),
        top_p=float(body.get("cp_top_p", 0.8)),
    )


def _host(memory: Any, buf: Any) -> np.ndarray:
    """A host copy of an engine's buffer (``memory``: the engine's ``buffers``)."""
    return memory.download(buf)


# a later cohort through the same pipeline with other settings: on a GPU its code predictor
# steps replay the graphs the first cohort captured, so no setting may be frozen into them
OTHER = {**BODY, "cp_top_k": 7, "cp_top_p": 0.5, "cp_temperature": 1.3, "talker_seed": 9}


def engine_draws_match_host(
    engine: Path,
    monkeypatch: Any,
    *,
    bodies: tuple[dict, ...] = (BODY,),
    **options: Any,
) -> int:
    """Run each body (three sampled requests, 16 frames each) through one pipeline and check
    every decided call; returns how many row draws were compared."""
    calls: list[tuple] = []
    run = decoder.DecoderSession.run

    def recorded(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        out = run(self, *args, **kwargs)
        if kwargs.get("tag") and "sample_uniform" in kwargs:  # tag 0: the hidden state alone
            params = SamplingParams(
                temperature=float(kwargs["sample_temperature"][0]),
                top_k=int(kwargs["sample_top_k"][0]),
                top_p=float(kwargs["sample_top_p"][0]),
            )
            memory = self.engine.buffers
            names = ("topk_values", "topk_indices", "sampled_ids")
            got = [_host(memory, out.buffer(n)) for n in names]
            # on a GPU the uniforms are a row of the frame's staged buffer on the device
            calls.append((*got, _host(memory, kwargs["sample_uniform"]), params))
        return out

    outcomes = []
    with monkeypatch.context() as m:
        m.setattr(decoder.DecoderSession, "run", recorded)
        pipe = Pipeline(engine, **options)
        for body in bodies:
            outcomes += pipe.run(parse_request_file(body)[0], batch_size=3)
    assert {c[-1] for c in calls} >= {_settings(b) for b in bodies}  # each body's settings ran
    for outcome in outcomes:
        assert outcome.entry["ok"], outcome.entry
        assert outcome.entry["stages"]["talker"]["code_predictor_draws"] == "engine"
        assert outcome.codes.shape == (16, 16)
    compared = 0
    for values, indices, drawn, uniform, params in calls:
        if not (drawn >= 0).all():  # that frame is drawn again on the host: nothing to compare
            continue
        step = StepLogits(len(values), None, values.astype(np.float32), indices)
        want, _ = sample_step(step, params, Given(uniform))  # type: ignore[arg-type]
        np.testing.assert_array_equal(drawn, want)
        compared += len(drawn)
    return compared
