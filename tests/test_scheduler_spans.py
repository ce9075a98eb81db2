"""scheduler.run_graph with requests that hold spans of rows (guided sampling's cond and uncond
rows, beside one-row requests): a stage's width counts rows, each request gets a contiguous span
of free rows in input order (a wide request is not passed by narrower ones), free rows that are
enough but apart are packed first, compaction moves whole spans, a request wider than the stage
fails alone, and cohorts hold at most ``width`` rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from edgeomni.runtime.scheduler import Cohorts, make_cohorts, place, run_graph


@dataclass
class Plan:
    stages: tuple[str, ...]


@dataclass
class State:
    index: int
    plan: Plan
    rows: int = 1
    need: int = 1
    batch_idx: int | None = None
    started: float = 0.0
    error: str | None = None


@dataclass
class Slot:
    state: State
    row: int
    rows: int
    steps: int = 0
    finish: str | None = None


@dataclass
class SpanStage:
    """Each request holds ``state.rows`` rows and takes ``state.need`` steps; every step checks
    that the spans held are disjoint and inside the width."""

    width: int
    stage_id: str = "a"
    consumes: bool = False
    admitted: list[tuple[int, int]] = field(default_factory=list)  # (index, first row)
    moves: list[tuple[int, int, int]] = field(default_factory=list)  # (index, from, to)
    held: list[list[tuple[int, int, int]]] = field(default_factory=list)  # per step

    def rows_for(self, state: State) -> int:
        return state.rows

    def ready(self, state: State, upstream_done: bool, events: Any) -> bool:
        return upstream_done

    def admit(self, entries: list[tuple[State, int, Any]]) -> list[Slot]:
        self.admitted += [(s.index, row) for s, row, _ in entries]
        return [Slot(s, row, s.rows) for s, row, _ in entries]

    def step(self, slots: dict[int, Slot]) -> None:
        rows = [r for row, s in slots.items() for r in range(row, row + s.rows)]
        assert len(rows) == len(set(rows)) and max(rows) < self.width, slots
        self.held.append(sorted((s.state.index, row, s.rows) for row, s in slots.items()))
        for s in slots.values():
            s.steps += 1

    def update(self, slot: Slot, events: bool) -> list[Any]:
        slot.finish = "eos" if slot.steps >= slot.state.need else None
        return []

    def consume(self, slot: Slot, event: Any) -> None:
        raise TypeError

    def move(self, slot: Slot, row: int) -> None:
        self.moves.append((slot.state.index, slot.row, row))
        slot.row = row

    def retire(self, slot: Slot) -> None:
        pass

    def discard(self, slot: Slot) -> None:
        pass


def requests(*spec: tuple[int, int]) -> list[State]:
    return [State(i, Plan(("a",)), rows, need) for i, (rows, need) in enumerate(spec)]


def test_spans_join_in_input_order_and_never_overlap() -> None:
    """Width 4: a two-row request waits for two free rows, and the one-row request behind it
    waits with it (input order), though one row is free."""
    stage = SpanStage(4)
    states = requests((1, 3), (2, 1), (2, 2), (1, 1), (1, 4))
    run_graph({"a": stage}, states, {"a": 4})
    assert all(s.error is None for s in states)
    assert [i for i, _ in stage.admitted] == [0, 1, 2, 3, 4]
    assert stage.admitted[:2] == [(0, 0), (1, 1)]  # 3 rows held; request 2 (two rows) waits
    assert stage.held[0] == [(0, 0, 1), (1, 1, 2)]
    assert stage.admitted[2:4] == [(2, 1), (3, 3)]  # request 1 left: its rows, then the next


def test_free_rows_apart_are_packed_for_a_span() -> None:
    """Rows 1 and 3 free, a two-row request waiting: request 2 moves down from row 2 to row 1
    and the span takes rows 2..3."""
    stage = SpanStage(4)
    states = requests((1, 5), (1, 1), (1, 5), (1, 1), (2, 2))
    run_graph({"a": stage}, states, {"a": 4})
    assert all(s.error is None for s in states)
    assert stage.moves[0] == (2, 2, 1)
    assert (4, 2) in stage.admitted


def test_compaction_moves_whole_spans_down_onto_their_own_rows() -> None:
    """Rows 0..1, 2 and 3..4 held; the one-row request leaves and none wait: the span at 3
    moves to 2 (onto its own row 3), so the held rows are 0..3."""
    stage = SpanStage(5)
    states = requests((2, 4), (1, 1), (2, 4))
    run_graph({"a": stage}, states, {"a": 5})
    assert stage.moves == [(2, 3, 2)]
    assert stage.held[1] == [(0, 0, 2), (2, 2, 2)]


def test_a_request_wider_than_the_stage_fails_alone() -> None:
    stage = SpanStage(1)
    states = requests((1, 2), (2, 1), (1, 1))
    run_graph({"a": stage}, states, {"a": 1})
    assert states[1].error == "a: it needs 2 rows; the stage has 1"
    assert states[0].error is None and states[2].error is None


def test_cohorts_count_rows() -> None:
    assert make_cohorts(["k"] * 5, 4, [2, 1, 2, 1, 1]) == [[0, 1], [2, 3, 4]]
    assert make_cohorts(["k", "k"], 1, [2, 1]) == [[0], [1]]  # too wide: a cohort of its own
    assert make_cohorts(["k"] * 3, 2) == make_cohorts(["k"] * 3, 2, [1, 1, 1]) == [[0, 1], [2]]
    stage = SpanStage(3)
    states = requests((2, 2), (1, 1), (2, 1))
    run_graph({"a": stage}, states, {"a": 3}, cohorts=Cohorts(lambda s: 0, 3))
    assert [i for i, _ in stage.admitted] == [0, 1, 2] and stage.held[0] == [(0, 0, 2), (1, 2, 1)]


@pytest.mark.parametrize(("taken", "needs", "width", "expected"), [
    (set(), [1, 1, 1], 3, [0, 1, 2]),
    ({0, 2}, [1, 1], 4, [1, 3]),
    ({1}, [2], 4, [2]),
    ({1, 3}, [2], 4, None),
    ({0}, [2, 1], 4, [1, 3]),
])  # fmt: skip
def test_place_takes_the_lowest_free_run(taken: set[int], needs: list[int], width: int,
                                          expected: list[int] | None) -> None:  # fmt: skip
    assert place(taken, needs, width) == expected
