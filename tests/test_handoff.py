"""qwen3_omni.talker.ThinkerRows: the thinker's embeddings as the talker reads them while they come
(its HiddenRows events)."""

from __future__ import annotations

import numpy as np
import pytest

from edgeomni.runtime.events import Finished, HiddenRows
from edgeomni.runtime.families.qwen3_omni.talker import ThinkerRows
from edgeomni.runtime.prompt import PromptRows


def test_rows_read_back_as_fed_across_growth() -> None:
    rng = np.random.default_rng(0)
    prompt = rng.standard_normal((50, 8)).astype(np.float16)  # a GPU table's dtype
    handoff = ThinkerRows(PromptRows(np.arange(50), None))
    handoff.feed(prompt)
    early = handoff.embeds(0, 50)
    steps = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(300)]
    for row in steps:
        handoff.feed(row)
    assert handoff.fed == 350 and len(handoff.prompt.ids) == 50
    np.testing.assert_array_equal(handoff.embeds(0, 50), prompt.astype(np.float32))
    np.testing.assert_array_equal(handoff.embeds(50, 350), np.concatenate(steps))
    np.testing.assert_array_equal(early, prompt.astype(np.float32))  # a read stays valid
    assert handoff.embeds(0, 1).dtype == np.float32


def test_reading_past_what_was_fed_is_an_error() -> None:
    handoff = ThinkerRows(PromptRows(np.arange(3), None))
    with pytest.raises(IndexError, match="0 fed so far"):
        handoff.embeds(0, 1)
    handoff.feed(np.zeros((3, 4)))
    with pytest.raises(IndexError, match="up to 4 asked for, 3 fed"):
        handoff.embeds(2, 4)


def test_rows_are_rebuilt_from_the_thinkers_events() -> None:
    """A talker admitted late reads what came before as events: the prompt's rows first (with
    the prompt), then a row per step; other events change nothing; Finished ends it."""
    rng = np.random.default_rng(1)
    prompt = rng.standard_normal((4, 8)).astype(np.float32)
    steps = [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(3)]
    events = [HiddenRows(0, "thinker", prompt, PromptRows(np.arange(4), None)),
              *[HiddenRows(0, "thinker", row) for row in steps]]  # fmt: skip
    assert ThinkerRows.of(events[1:]) is None  # its prompt has not come
    rows = ThinkerRows.of(events)
    assert rows.fed == 7 and len(rows.prompt.ids) == 4 and not rows.done
    np.testing.assert_array_equal(rows.embeds(0, 7), np.concatenate([prompt, *steps]))
    rows.take(Finished(0, "thinker", "eos"))
    assert rows.done
