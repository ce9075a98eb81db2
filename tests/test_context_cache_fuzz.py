"""The context cache under random traffic: prompts that share random prefixes, run many at once
(rows joining and leaving), under random budgets, from roomy to one that evicts all the time
(entries leave while the requests that copied them still decode): every request's tokens equal
the uncached run's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.requests import parse_request_file

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "we", "all", "saw", "it", "happen",
         "while", "rain", "fell", "over", "quiet", "hills", "near", "old", "towns", "where",
         "people", "speak", "softly"]  # fmt: skip


def traffic(rng: np.random.Generator, n: int) -> dict:
    """``n`` raw-text prompts: each one of a few shared prefixes (or none), then its own words,
    some repeated whole; random reply lengths and cache keys."""
    prefixes = [" ".join(rng.choice(WORDS, rng.integers(4, 14))) for _ in range(3)]
    requests = []
    for i in range(n):
        if i and rng.random() < 0.2:  # an earlier prompt again, whole
            requests.append(dict(requests[int(rng.integers(0, i))]))
            continue
        head = prefixes[int(rng.integers(0, 3))] if rng.random() < 0.8 else ""
        tail = " ".join(rng.choice(WORDS, rng.integers(1, 6)))
        req = {"prompt": f"{head} {tail}".strip(), "max_generate_length": int(rng.integers(1, 7))}
        if rng.random() < 0.15:
            req["context_cache_key"] = f"tenant-{int(rng.integers(0, 2))}"
        requests.append(req)
    return {"top_k": 1, "apply_chat_template": False, "requests": requests}


def tokens(engine: Path, obj: dict, mb: float) -> tuple[list[list[int]], Pipeline]:
    requests, _ = parse_request_file(obj)
    pipe = Pipeline(engine, context_cache_mb=mb)
    out = pipe.run(requests, batch_size=3)
    for o in out:
        assert o.entry["ok"], o.entry.get("error")
    return [o.entry["stages"]["llm"]["output_tokens"] for o in out], pipe


@pytest.mark.slow
@pytest.mark.parametrize("name,seed", [("qwen3", 0), ("qwen3", 1), ("qwen35", 2)])
def test_random_prefixes_budgets_and_evictions(name: str, seed: int,
                                               request: pytest.FixtureRequest) -> None:  # fmt: skip
    engine = request.getfixturevalue(f"{name}_engine")
    rng = np.random.default_rng(seed)
    obj = traffic(rng, 16)
    want, _ = tokens(engine, obj, 0)
    evicted = 0
    hits = 0
    for mb in (64.0, float(rng.uniform(0.02, 0.08)), 0.004):  # roomy, tight, a block or two
        got, pipe = tokens(engine, obj, mb)
        assert got == want, f"budget {mb} MiB"
        cache = pipe.context_cache
        assert cache is not None and cache.used <= cache.budget
        evicted += cache.evicted
        hits += cache.as_dict()["stages"]["llm"]["cached_tokens"]
    assert hits > 0, "the traffic shares prefixes: some must have been found"
    assert evicted > 0, "the small budgets must have evicted"
