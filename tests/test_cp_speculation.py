"""bench/cp_speculation.py's counting (issue 34's speculation try): the calls a frame takes with
verify size S, from the drafts each hidden state made, and the acceptance its loop measures."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))

import cp_speculation as spec  # noqa: E402

TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "vocab_size": 64, "lm_heads": 15}  # fmt: skip


def drafts_from(codes: np.ndarray, wrong: set[tuple[int, int]]) -> dict[int, dict[int, int]]:
    """Every draft right except (g, j) in ``wrong``."""
    last = len(codes) - 1
    return {g: {j: int(codes[g + j]) + ((g, j) in wrong) for j in range(1, last - g + 1)}
            for g in range(1, last)} | {last: {}}  # fmt: skip


def test_a_verify_call_keeps_the_drafts_up_to_the_first_wrong_one() -> None:
    codes = np.arange(16)
    assert spec.verify_calls(codes, drafts_from(codes, set()), 4) == 4  # 14 codes, 4 a call
    every = {(g, j) for g in range(1, 15) for j in range(1, 15)}
    assert spec.verify_calls(codes, drafts_from(codes, every), 8) == 14  # one code a call
    # from code 1: drafts 2, 3 right, 4 wrong -> codes 2..4; then from 4 every draft right
    assert spec.verify_calls(codes, drafts_from(codes, {(1, 3)}), 4) == 1 + 3
    # a draft past the first wrong one does not count
    assert spec.verify_calls(codes, drafts_from(codes, {(1, 1)}), 8) == 1 + 2


@pytest.mark.parametrize(("ratio", "size", "expected"), [(1.0, 4, 0.0), (1.5, 2, 0.5),
                                                          (5.0, 4, None)])  # fmt: skip
def test_break_even_is_where_a_call_gives_its_cost_in_codes(ratio, size, expected) -> None:
    got = spec.break_even(ratio, size)
    assert got == expected if expected is None or expected == 0 else abs(got - expected) < 1e-3
    if got:
        assert abs(spec.expected_codes(got, size) - ratio) < 1e-2


def test_the_acceptance_loop_sees_drafts_that_are_right() -> None:
    """With every head zero each draft (code 0) is right: ceil(14/S) calls a frame; random
    heads draft next to nothing."""
    right = spec.acceptance(2, [2, 4, 8], dims=TINY, zero_heads=True)
    assert set(right["acceptance_by_depth"].values()) == {1.0}
    assert right["calls_per_frame"] == {2: 7.0, 4: 4.0, 8: 2.0}
    random = spec.acceptance(3, [4], dims=TINY)
    assert np.mean(list(random["acceptance_by_depth"].values())) < 0.2
    assert random["calls_per_frame"][4] > 12
