"""runtime/scheduler.py: cohorts in input order, equal keys, at most ``width`` each."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pytest

from edgeomni.runtime.scheduler import make_cohorts


@pytest.mark.parametrize(
    ("keys", "width", "expected"),
    [
        ([], 4, []),
        (["a"] * 5, 2, [[0, 1], [2, 3], [4]]),
        (["a"] * 4, 4, [[0, 1, 2, 3]]),
        (["a", "b", "a", "b", "a"], 2, [[0, 2], [1, 3], [4]]),
        (["a", "b", "a", "b", "a"], 4, [[0, 2, 4], [1, 3]]),
        (["a", "b", "a"], 1, [[0], [1], [2]]),
        (["a", "a", "b"], 100, [[0, 1], [2]]),
        # A full cohort pushes the rest of its key behind an earlier-starting cohort.
        (["a", "a", "a", "b", "a"], 2, [[0, 1], [2, 4], [3]]),
        (["b", "a", "a", "a", "b", "a"], 2, [[0, 4], [1, 2], [3, 5]]),
        # Composite keys: equal tuples group, any differing part separates.
        ([("t", 1), ("t", 2), ("t", 1), ("s", 1)], 3, [[0, 2], [1], [3]]),
    ],
)
def test_cohort_table(keys: Sequence[Hashable], width: int, expected: list[list[int]]) -> None:
    assert make_cohorts(keys, width) == expected


@pytest.mark.parametrize("width", [1, 2, 3, 7])
def test_cohort_invariants(width: int) -> None:
    keys = [("abc"[(i * 7) % 3], i % 2) for i in range(41)]
    cohorts = make_cohorts(keys, width)
    flat = [i for c in cohorts for i in c]
    assert sorted(flat) == list(range(len(keys)))  # every index exactly once
    assert [c[0] for c in cohorts] == sorted(c[0] for c in cohorts)
    for c in cohorts:
        assert 1 <= len(c) <= width
        assert c == sorted(c)
        assert len({keys[i] for i in c}) == 1
    assert make_cohorts(keys, width) == cohorts  # deterministic


@pytest.mark.parametrize("width", [0, -1, 1.5, True])
def test_bad_width_rejected(width: object) -> None:
    with pytest.raises(ValueError, match="width"):
        make_cohorts(["a"], width)  # type: ignore[arg-type]
