"""decoder_stage's step plan, a value the stage, the engine and these tests see: which rows step,
the call's width, each row's cache length, position offset and query length; and the runs of
contiguous new rows that each prefill in one call."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from edgeomni.runtime.decoder_stage import Slot, plan_step, prefill_runs


def slot(row: int, past: int, delta: int = 0, ready: bool = True) -> Slot:
    s = Slot(SimpleNamespace(index=row), row, SimpleNamespace(ready=ready), None, None,
             length=past, delta=delta)  # fmt: skip
    assert s.past == past  # a new slot's cache holds its prompt
    return s


def test_a_step_calls_rows_up_to_the_highest_active_and_only_ready_rows_step() -> None:
    """Rows 0, 2 and 5 active, row 2 waiting (a talker whose thinker has not fed its next
    token): the call is 6 rows wide; rows 1, 3, 4 (free) and 2 (waiting) have query 0; the
    waiting row still tells its cache length, so its cache is read where it is."""
    slots = {0: slot(0, 7), 2: slot(2, 4, delta=-3, ready=False), 5: slot(5, 11, delta=2)}
    plan = plan_step(slots, lambda s: s.data.ready)
    assert plan.rows == (0, 5) and plan.width == 6
    np.testing.assert_array_equal(plan.query, [1, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(plan.past, [7, 0, 4, 0, 0, 11])
    np.testing.assert_array_equal(plan.deltas, [0, 0, -3, 0, 0, 2])
    assert plan.past.dtype == plan.query.dtype == np.int32
    assert plan_step({2: slots[2]}, lambda s: s.data.ready) is None  # nothing can step


def test_new_rows_prefill_in_runs_of_contiguous_rows() -> None:
    runs = prefill_runs([slot(r, 3) for r in (0, 1, 3, 4, 5, 7)])
    assert [[s.row for s in run] for run in runs] == [[0, 1], [3, 4, 5], [7]]
    assert prefill_runs([]) == []
