"""runners.HiddenHandoff: the thinker's embeddings as the talker reads them while they come."""

from __future__ import annotations

import numpy as np
import pytest

from edgeomni.runtime.runners import HiddenHandoff


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
