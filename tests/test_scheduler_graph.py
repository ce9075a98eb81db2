"""scheduler.run_graph over fake stages (pure Python, no engine): requests move to their next
stage the step their current one finishes them, a consuming stage gets its upstream's events in
order (those emitted before it admitted the request too), a failure anywhere drops the
request's slots everywhere, and ``patience`` lets a later stage gather rows before it steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from edgeomni.runtime.scheduler import run_graph


@dataclass
class Plan:
    stages: tuple[str, ...]


@dataclass
class State:
    index: int
    plan: Plan
    batch_idx: int | None = None
    started: float = 0.0
    error: str | None = None


@dataclass
class Slot:
    state: State
    row: int
    steps: int = 0
    finish: str | None = None
    got: list[Any] = field(default_factory=list)


class Stage:
    """Each request needs ``need(index)`` steps here; emits ("tick", index, n) per step."""

    def __init__(self, sid: str, need: Any, consumes: bool = False, fail_at: Any = None) -> None:
        self.stage_id, self.need, self.consumes, self.fail_at = sid, need, consumes, fail_at
        self.step_rows: list[int] = []
        self.discarded: list[int] = []
        self.retired: dict[int, Slot] = {}

    def ready(self, state: State, upstream_done: bool, events: list[Any]) -> bool:
        return upstream_done or self.consumes

    def admit(self, entries: list[tuple[State, int, list[Any]]]) -> list[Slot]:
        return [Slot(state, row, got=list(events)) for state, row, events in entries]

    def step(self, slots: dict[int, Slot]) -> None:
        self.step_rows.append(len(slots))
        for slot in slots.values():
            slot.steps += 1

    def update(self, slot: Slot, events: bool) -> list[Any]:
        if self.fail_at == (slot.state.index, slot.steps):
            raise RuntimeError("boom")
        if slot.steps >= self.need(slot.state.index) and (
            not self.consumes or ("done", slot.state.index) in slot.got
        ):
            slot.finish = "eos"
        out = [("tick", slot.state.index, slot.steps)] if slot.steps else []
        if slot.finish:
            out.append(("done", slot.state.index))
        return out

    def consume(self, slot: Slot, event: Any) -> None:
        slot.got.append(event)

    def move(self, slot: Slot, row: int) -> None:
        slot.row = row

    def retire(self, slot: Slot) -> None:
        self.retired[slot.state.index] = slot

    def discard(self, slot: Slot) -> None:
        self.discarded.append(slot.state.index)


def states(n: int, path: tuple[str, ...] = ("a", "b")) -> list[State]:
    return [State(i, Plan(path)) for i in range(n)]


def test_requests_flow_and_events_reach_the_consumer_in_order() -> None:
    a = Stage("a", lambda i: 2 + 3 * i)
    b = Stage("b", lambda i: 1, consumes=True)
    events: list[Any] = []
    left: list[int] = []
    run_graph({"a": a, "b": b}, states(4), {"a": 2, "b": 4}, listener=events.append,
              done=lambda s: left.append(s.index))  # fmt: skip
    assert sorted(left) == [0, 1, 2, 3] and set(b.retired) == {0, 1, 2, 3}
    for i, slot in b.retired.items():  # every tick of "a", then its done, held or not
        assert slot.got == [("tick", i, n) for n in range(1, 3 + 3 * i)] + [("done", i)]
    # a request's events: all of a's before b finishes it
    for i in range(4):
        mine = [e for e in events if e[1] == i]
        assert mine[-1] == ("done", i) and mine.index(("done", i)) < len(mine) - 1


def test_a_failure_drops_the_request_everywhere() -> None:
    a = Stage("a", lambda i: 6, fail_at=(1, 3))
    b = Stage("b", lambda i: 1, consumes=True)  # takes requests as soon as a admits them
    run_graph({"a": a, "b": b}, (st := states(3)), {"a": 3, "b": 3})
    assert st[1].error == "a: RuntimeError: boom"
    assert b.discarded == [1] and set(b.retired) == {0, 2}
    assert [s.error for s in (st[0], st[2])] == [None, None]


@pytest.mark.parametrize("patience", [0, 4, 100])
def test_patience_lets_a_later_stage_gather_rows(patience: int) -> None:
    """Stage "a" finishes one request every other step; "b" needs 6 steps a request. Without
    patience b steps nearly empty batches every turn; with it, fuller ones, never waiting past
    its patience and never once nothing more can come."""
    a = Stage("a", lambda i: 2 * (i + 1))
    b = Stage("b", lambda i: 6)
    run_graph({"a": a, "b": b}, states(6), {"a": 6, "b": 6}, patience=patience)
    assert set(b.retired) == set(range(6)) and all(s.steps == 6 for s in b.retired.values())
    rows = b.step_rows
    if patience == 0:
        assert rows[0] == 1 and len(rows) > 12
    else:
        assert sum(rows) / len(rows) > 2 and len(rows) < 12
    if patience == 100:  # it waits for all six, which come by turn 12
        assert rows == [6] * 6


class Scripted:
    """A feed (scheduler.Arrivals' interface) that gives each request at a given turn, then
    closes: turn t's requests are there at the t-th take."""

    def __init__(self, arrivals: dict[int, list[State]]) -> None:
        self.arrivals, self.turn, self.waits = arrivals, 0, 0

    @property
    def closed(self) -> bool:
        return self.turn > max(self.arrivals)

    def take(self, wait: bool) -> list[State]:
        self.waits += int(wait)
        out = self.arrivals.get(self.turn, [])
        self.turn += 1
        return out


def test_requests_that_arrive_while_the_graph_runs_join_its_batches() -> None:
    """Requests fed while others run join the running batch as rows free up (a server's
    arrivals); each gets all its events and leaves; with nothing in the graph the loop waits
    for the feed; an index already used in the run is refused."""
    a = Stage("a", lambda i: 4)
    b = Stage("b", lambda i: 2, consumes=True)
    first, later = states(2), [State(i, Plan(("a", "b"))) for i in (2, 3, 4)]
    feed = Scripted({2: later[:2], 12: later[2:]})
    events: list[Any] = []
    left: list[int] = []
    run_graph({"a": a, "b": b}, first, {"a": 3, "b": 3}, listener=events.append,
              done=lambda s: left.append(s.index), feed=feed)  # fmt: skip
    assert sorted(left) == [0, 1, 2, 3, 4] and set(b.retired) == {0, 1, 2, 3, 4}
    for i in range(5):
        assert [e for e in events if e[1] == i and e[0] == "done"] == [("done", i), ("done", i)]
    # request 2 joined the two running (3 rows), request 3 waited for a row: a stepped 3 rows
    assert 3 in a.step_rows and a.step_rows[0] == 2
    assert feed.waits > 0  # between the first four leaving and request 4 coming, it waited
    with pytest.raises(ValueError, match="index 0 is already"):
        run_graph({"a": a, "b": b}, [State(0, Plan(("a",)))], {"a": 1, "b": 1},
                  feed=Scripted({0: [State(0, Plan(("a",)))]}))  # fmt: skip


def test_a_cancelled_request_leaves_and_frees_its_row() -> None:
    """A request whose client went away fails as cancelled at the next turn, wherever it is
    (its slots discarded, a Failed event), and a request waiting for a row takes its row."""
    from edgeomni.runtime.events import Failed
    from edgeomni.runtime.scheduler import CANCELLED

    a = Stage("a", lambda i: 8)
    b = Stage("b", lambda i: 1, consumes=True)
    gone: set[int] = set()
    events: list[Any] = []

    def listener(event: Any) -> None:
        events.append(event)
        if event == ("tick", 0, 3):  # its client leaves after its third step
            gone.add(0)

    st = states(3)
    run_graph({"a": a, "b": b}, st, {"a": 2, "b": 3}, listener=listener,
              cancelled=lambda s: s.index in gone)  # fmt: skip
    assert st[0].error == CANCELLED and st[1].error is None and st[2].error is None
    assert 0 in a.discarded and 0 in b.discarded and set(b.retired) == {1, 2}
    failed = [e for e in events if isinstance(e, Failed)]
    assert [(f.index, f.error) for f in failed] == [(0, CANCELLED)]
    assert ("tick", 0, 4) not in events  # it stepped no more
    # request 2 waited for a row of "a" (2 rows) and took request 0's after its third step:
    # 3 + 8 steps in all (without the cancel, 8 + 8)
    assert a.step_rows == [2] * 8 + [1] * 3


def test_arrivals_feed_waits_across_threads() -> None:
    """scheduler.Arrivals: a loop with nothing to do waits in take until a request is put
    from another thread, and ends once the feed is closed and the graph empty."""
    import threading

    from edgeomni.runtime.scheduler import Arrivals

    a = Stage("a", lambda i: 2)
    feed = Arrivals()
    left: list[int] = []

    def client() -> None:
        for i in range(3):
            feed.put(State(i, Plan(("a",))))
        feed.close()

    timer = threading.Timer(0.2, client)
    timer.start()
    run_graph({"a": a}, [], {"a": 2}, done=lambda s: left.append(s.index), feed=feed)
    timer.join()
    assert sorted(left) == [0, 1, 2] and feed.closed
    with pytest.raises(RuntimeError, match="no more requests"):
        feed.put(State(9, Plan(("a",))))


def test_cohorts_enter_one_at_a_time_and_each_stage_admits_a_cohort_together() -> None:
    """Cohort admission (TensorRT Edge-LLM's batching, ``Cohorts``): requests with equal keys
    enter together, greedily in input order; a stage admits a cohort once all of it is ready
    there (b takes none of a cohort while a still holds one of it), and the next cohort enters
    only once the last one has left the graph."""
    from edgeomni.runtime.scheduler import Cohorts

    a = Stage("a", lambda i: 1 + i)  # a cohort's requests leave "a" at different steps
    b = Stage("b", lambda i: 2)
    st = states(5)
    keys = {0: "x", 1: "y", 2: "x", 3: "x", 4: "y"}
    log: list[tuple[str, int]] = []
    real_a, real_b = a.admit, b.admit
    a.admit = lambda entries: (log.extend(("a", e[0].index) for e in entries), real_a(entries))[1]
    b.admit = lambda entries: (log.extend(("b", e[0].index) for e in entries), real_b(entries))[1]
    left: list[int] = []
    run_graph({"a": a, "b": b}, st, {"a": 4, "b": 4}, done=lambda s: left.append(s.index),
              cohorts=Cohorts(lambda s: keys[s.index], 2))  # fmt: skip
    # cohorts [0, 2], [1, 4], [3]: each wholly through a, then b, before the next enters
    assert log == [("a", 0), ("a", 2), ("b", 0), ("b", 2), ("a", 1), ("a", 4), ("b", 1),
                   ("b", 4), ("a", 3), ("b", 3)]  # fmt: skip
    assert left == [0, 2, 1, 4, 3]
    assert all(s.error is None for s in st)
    with pytest.raises(ValueError, match="already in this run"):
        run_graph({"a": a}, [State(0, Plan(("a",))), State(0, Plan(("a",)))], {"a": 1},
                  cohorts=Cohorts(lambda s: 0, 2))  # fmt: skip
