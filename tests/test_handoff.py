"""runners.HiddenHandoff: the thinker's embeddings as the talker reads them while they come."""

from __future__ import annotations

import numpy as np
import pytest

from edgeomni.runtime.runners import HiddenHandoff, feed_cohort


def test_rows_read_back_as_fed_across_growth() -> None:
    rng = np.random.default_rng(0)
    prompt = rng.standard_normal((50, 8)).astype(np.float16)  # a GPU table's dtype
    handoff = HiddenHandoff(np.arange(50), None)
    handoff.feed(prompt)
    early = handoff.embeds(0, 50)
    steps = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(300)]
    for row in steps:
        handoff.feed(row)
    assert handoff.fed == 350 and handoff.prompt_len == 50
    np.testing.assert_array_equal(handoff.embeds(0, 50), prompt.astype(np.float32))
    np.testing.assert_array_equal(handoff.embeds(50, 350), np.concatenate(steps))
    np.testing.assert_array_equal(early, prompt.astype(np.float32))  # a read stays valid
    assert handoff.embeds(0, 1).dtype == np.float32


def test_reading_past_what_was_fed_is_an_error() -> None:
    handoff = HiddenHandoff(np.arange(3), None)
    with pytest.raises(IndexError, match="0 fed so far"):
        handoff.embeds(0, 1)
    handoff.feed(np.zeros((3, 4)))
    with pytest.raises(IndexError, match="up to 4 asked for, 3 fed"):
        handoff.embeds(2, 4)


def test_a_cohort_fed_in_one_buffer_reads_back_as_fed_row_by_row() -> None:
    """``feed_cohort``: a thinker step feeds only its active rows, each at its own length; every
    handoff reads what per-row ``feed`` calls would have given it, earlier reads stay valid."""
    rng = np.random.default_rng(1)
    lens = [5, 2, 7]
    cohort = [HiddenHandoff(np.arange(n), None) for n in lens]
    alone = [HiddenHandoff(np.arange(n), None) for n in lens]
    fed = feed_cohort(cohort, capacity=7 + 4, hidden=8)
    for n, a, b in zip(lens, cohort, alone, strict=True):
        prompt = rng.standard_normal((n, 8)).astype(np.float32)
        a.feed(prompt)
        b.feed(prompt)
    early = cohort[0].embeds(0, 5)
    for active in ([0, 1, 2], [0, 2], [2], [2]):  # rows finish at different steps
        rows = np.array(active)
        step = rng.standard_normal((len(rows), 8)).astype(np.float32)
        fed.step(rows, step)
        for j, r in enumerate(active):
            alone[r].feed(step[j])
    for a, b in zip(cohort, alone, strict=True):
        assert a.fed == b.fed
        np.testing.assert_array_equal(a.embeds(0, a.fed), b.embeds(0, b.fed))
    np.testing.assert_array_equal(early, alone[0].embeds(0, 5))
    # a full buffer doubles: every row keeps what it was fed, a view read before stays valid
    late = rng.standard_normal((1, 8)).astype(np.float32)
    fed.step(np.array([2]), late)
    alone[2].feed(late)
    assert fed.store.shape[1] == 22
    for a, b in zip(cohort, alone, strict=True):
        np.testing.assert_array_equal(a.embeds(0, a.fed), b.embeds(0, b.fed))
    np.testing.assert_array_equal(early, alone[0].embeds(0, 5))


def test_feed_cohort_takes_only_empty_handoffs() -> None:
    handoff = HiddenHandoff(np.arange(2), None)
    handoff.feed(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="nothing was fed"):
        feed_cohort([handoff], capacity=8, hidden=4)
