"""Scheduling, pure Python: cohorts of requests that run as one batch, and the in-flight loop
that admits requests into a running batch and retires them as they finish.

A cohort's requests must run the same stages with the same request fields and share
batch-wide settings (sampling, chat-template flags); the caller folds all of that into one
hashable key per request. Grouping is greedy in input order so results are deterministic and
early requests are never starved by later ones.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from edgeomni.graph_schema import Plan
    from edgeomni.runtime.events import Event

__all__ = ["CANCELLED", "PATIENCE", "Arrivals", "Cohorts", "Feed", "GraphRequest", "SlotStage",
           "StageSlot", "Stuck", "failure", "make_cohorts", "pack", "place", "rows_for",
           "run_graph", "span"]  # fmt: skip
CANCELLED = "cancelled"  # the error of a request its client gave up on
# turns a later stage (the talker, the vocoder) waits for rows still on their way before it
# steps a batch that is not full (run_graph's patience; docs/benchmarks.md measured it)
PATIENCE = 16
log = logging.getLogger("edge-infer")


def make_cohorts(
    keys: Sequence[Hashable], width: int, rows: Sequence[int] | None = None
) -> list[list[int]]:
    """Split request indices into cohorts of at most ``width`` rows with equal keys (``rows``:
    each request's, default one; a request of guided sampling holds two).

    Walking the requests in order, each cohort starts at the first unassigned request and
    takes the following unassigned requests with an equal key while the next one fits; the
    requests that do not fit wait for a later cohort (a request wider than ``width`` is a
    cohort of its own). Every index appears exactly once, in increasing order within its
    cohort, and cohorts are ordered by their first request.
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"cohort width must be an integer >= 1, got {width!r}")
    # Per key, its unassigned requests in input order: a cohort always takes from the front,
    # so a request is unassigned when the walk reaches it exactly if it is its queue's front.
    queues: dict[Hashable, deque[int]] = {}
    for i, key in enumerate(keys):
        queues.setdefault(key, deque()).append(i)
    cohorts: list[list[int]] = []
    for i, key in enumerate(keys):
        queue = queues[key]
        if queue and queue[0] == i:
            cohort, used = [queue.popleft()], rows[i] if rows is not None else 1
            while queue and used + (need := rows[queue[0]] if rows is not None else 1) <= width:
                cohort.append(queue.popleft())
                used += need
            cohorts.append(cohort)
    return cohorts


# ---------------------------------------------------------------------------------------------
# In-flight batching: one loop of schedule -> execute -> update over the stages of a graph whose
# requests hold slots (a span of rows each: one, or two for guided sampling's cond and uncond
# rows; their own settings), so requests join and leave each stage's running batch, and a
# request moves on to its next stage the step it finishes. A stage's width counts rows.


class GraphRequest(Protocol):
    """What the loop reads and writes of a request (runners.RequestState): its ``index``
    (unique in a run), its ``plan``'s stages, and its ``error``, row in its first stage's batch
    and start time, which the loop sets."""

    index: int
    plan: Plan
    error: str | None
    batch_idx: int | None
    started: float


R = TypeVar("R", bound=GraphRequest)
R_co = TypeVar("R_co", bound=GraphRequest, covariant=True)
R_contra = TypeVar("R_contra", bound=GraphRequest, contravariant=True)
S = TypeVar("S")  # a stage's own slot type


class StageSlot(Protocol[R_co]):
    """What the loop reads of a slot: its request, its row, and ``finish`` once it is done.
    A slot with a ``rows`` attribute holds that many rows from ``row`` on (its span: ``span``);
    any other holds one."""

    row: int
    finish: str | None

    @property
    def state(self) -> R_co: ...


@runtime_checkable
class SlotStage(Protocol[R_contra, S]):
    """A stage the scheduler loop steps.

    ``ready(state, upstream_done, events)``: whether a waiting request can start here now (a
    request waits at its next stage from the moment its current one admits it;
    ``upstream_done``: that stage is done with it; ``events``: what it emitted for the request
    so far, for a stage that ``consumes``). ``admit`` starts requests in free rows, each entry
    (state, row, its upstream's events so far) (a decoder prefills them and draws each one's
    first token); a request it cannot start is left out of the slots it returns, with its
    ``error`` set. ``step`` runs every active slot once (a slot that cannot go on yet, waiting
    for its upstream, sits the step out; a stage that ``polls`` returns whether it took
    anything in). ``update`` settles one slot after a step: its ``finish``, and the events it
    adds when asked (text, frames, audio, Finished). ``consume`` takes an event its upstream
    stage emitted for the slot's request (stages with ``consumes`` true: the vocoder reads the
    talker's frames, the talker its thinker's rows). ``retire`` writes a finished request's
    outputs; ``discard`` drops a slot whose request failed elsewhere; ``move`` puts a slot in
    another (free) row, its cache rows with it (a span's first row: its rows move together,
    in ascending order, into rows that may overlap its own). ``S`` is the stage's own slot
    type (its ``StageSlot``).

    A stage whose requests may hold more than one row has ``rows_for(state)``: the rows the
    request needs there (a stage without it: one). The loop gives it a contiguous span of that
    many free rows, counts rows against the stage's width, and moves whole spans."""

    stage_id: str
    consumes: bool

    def ready(self, state: R_contra, upstream_done: bool, events: Sequence[Event]) -> bool: ...
    def admit(self, entries: Sequence[tuple[R_contra, int, Sequence[Event]]]) -> list[S]: ...
    def step(self, slots: Mapping[int, S]) -> bool | None: ...
    def update(self, slot: S, events: bool) -> list[Event]: ...
    def consume(self, slot: S, event: Event) -> None: ...
    def move(self, slot: S, row: int) -> None: ...
    def retire(self, slot: S) -> None: ...
    def discard(self, slot: S) -> None: ...


@dataclass(frozen=True)
class Cohorts(Generic[R]):
    """``run_graph``'s cohort admission (TensorRT Edge-LLM's multistage_inference batching):
    the graph holds one cohort at a time, requests of at most ``width`` rows (each its most
    ``rows_for`` over its stages) with equal ``key(state)`` taken greedily in input order
    (``make_cohorts``); each stage admits the cohort's requests
    together, once every one of them still to come is ready there, and no later request joins
    until the whole cohort has left the graph."""

    key: Callable[[R], Hashable]
    width: int


class Stuck(RuntimeError):
    """Requests wait at a stage whose upstream will never make them ready (a stage's bug)."""


class Feed(Protocol[R_co]):
    """``run_graph``'s ``feed``: requests that come while the graph runs (``Arrivals``)."""

    @property
    def closed(self) -> bool: ...

    def take(self, wait: bool) -> Sequence[R_co]: ...


class Arrivals(Generic[R]):
    """Requests that come while the graph runs (a server's), for ``run_graph``'s ``feed``:
    ``put`` from any thread, ``close`` once no more will come; the loop ``take``s them at the
    start of each turn, and waits in ``take`` when it has nothing else to do."""

    def __init__(self) -> None:
        self._queue: list[R] = []
        self._closed = False
        self._cond = threading.Condition()

    def put(self, state: R) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("the graph takes no more requests (its arrivals are closed)")
            self._queue.append(state)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    @property
    def closed(self) -> bool:
        """No more will come and none are left to take."""
        with self._cond:
            return self._closed and not self._queue

    def take(self, wait: bool) -> list[R]:
        """The requests put since the last take, in order; ``wait``: block until there are
        some or the arrivals close."""
        with self._cond:
            if wait and not self._queue and not self._closed:
                self._cond.wait()
            out, self._queue = self._queue, []
            return out


def span(slot: Any) -> int:
    """The rows a slot holds from its ``row`` on (``StageSlot``)."""
    return int(getattr(slot, "rows", 1))


def rows_for(stage: Any, state: Any) -> int:
    """The rows a request needs at a stage (``SlotStage``'s optional ``rows_for``)."""
    ask = getattr(stage, "rows_for", None)
    return 1 if ask is None else int(ask(state))


def place(taken: set[int], needs: Sequence[int], width: int) -> list[int] | None:
    """Where spans of these sizes go, in order, among rows 0..width-1 of which ``taken`` are
    held: each at the lowest free run of its rows; None when one finds none."""
    held, out = set(taken), []
    for need in needs:
        start = next((r for r in range(width - need + 1)
                      if held.isdisjoint(range(r, r + need))), None)  # fmt: skip
        if start is None:
            return None
        held.update(range(start, start + need))
        out.append(start)
    return out


def run_graph(
    stages: Mapping[str, SlotStage[R, Any]],  # each stage has a slot type of its own
    states: Sequence[R],
    widths: Mapping[str, int],
    *,
    listener: Callable[[Event], None] | None = None,
    done: Callable[[R], None] | None = None,
    seconds: dict[str, float] | None = None,
    patience: int = 0,
    feed: Feed[R] | None = None,
    cancelled: Callable[[R], bool] | None = None,
    cohorts: Cohorts[R] | None = None,
    idle: Callable[[], None] | None = None,
) -> None:
    """Run every request through the stages of its plan (``state.plan.stages``, each one of
    ``stages``, which are in graph order), each stage with at most ``widths[id]`` in flight.

    ``feed``: more requests, taken at the start of each turn, which join the stages' running
    batches as rows free up; the loop runs until the feed is closed and every request has left
    (with nothing to do it waits for the feed). Request indices must be unique over the run.
    ``cancelled(state)``, asked each turn for every request still in the graph: true fails the
    request with CANCELLED (its client went away), which frees its rows for the next turn.

    Each turn visits the stages in order: admit the waiting requests that are ready into free
    rows (each a span of ``rows_for`` rows: the lowest free run first, in input order; a ready
    request whose span does not fit stops the ones after it, so a wide request is never
    starved by narrow ones; free rows that are enough but apart are first moved together;
    a request wider than the stage fails), step the active slots, settle them (events, then
    retire the finished, which frees their rows); once no request can still come to a stage,
    its rows left are moved down (``compact``). A request that fails anywhere leaves the whole
    graph alone (its ``error`` set, Failed emitted, its slots in other stages discarded); a
    step that fails fails the rows it ran. Events go to ``listener`` in order per request, and
    to the request's next stage when it ``consumes`` them (held until it is admitted there).
    ``done(state)`` is called as each request leaves; ``seconds`` adds each stage's time.

    ``patience``: a stage that requests are still coming to (from the stages before it) and
    whose rows are not all taken waits up to that many turns for them before it steps the rows
    it has (0: it steps every turn). A step's cost is mostly fixed (the weights it reads), so
    a talker fed one request at a time by a busy thinker would otherwise run nearly empty
    steps; waiting trades a request's latency for the batch's throughput.

    ``cohorts``: requests enter the graph a cohort at a time and each stage admits a cohort's
    requests together (``Cohorts``); there is then nothing to wait for (no patience).

    ``idle``: called at the end of a turn in which only stages that ``polls`` (an attribute,
    true for a stage whose rows wait on another process: edge-serve's relays) stepped, and
    none of their steps took anything in (their ``step`` returns whether it did); it waits
    a while for something to come, so the loop does not spin on empty polls.
    """
    from edgeomni.runtime.events import Failed, HiddenRows

    order = list(stages)
    waiting: dict[str, list[R]] = {sid: [] for sid in order}
    active: dict[str, dict[int, StageSlot[R]]] = {sid: {} for sid in order}
    slot_of: dict[str, dict[int, StageSlot[R]]] = {sid: {} for sid in order}  # index -> slot
    held: dict[str, dict[int, list[Event]]] = {sid: {} for sid in order}  # events not yet taken
    to_come: dict[str, set[int]] = {sid: set() for sid in order}  # may still be admitted
    finished: set[tuple[int, str]] = set()
    times = seconds if seconds is not None else {}
    nxt: dict[tuple[int, str], str | None] = {}
    live: dict[int, R] = {}  # the requests still in the graph, by index
    pending: list[R] = []  # cohort admission: requests not in the graph yet, in input order
    queued: set[int] = set()
    if cohorts is not None:
        patience = 0

    def register(state: R) -> None:
        path = state.plan.stages
        if state.index in live or any((state.index, sid) in nxt for sid in path):
            raise ValueError(f"request index {state.index} is already in this run")
        for a, b in zip(path, (*path[1:], None), strict=True):
            nxt[(state.index, a)] = b
            to_come[a].add(state.index)
        waiting[path[0]].append(state)
        live[state.index] = state

    def enter(state: R) -> None:
        if cohorts is None:
            register(state)
        elif state.index in queued:
            raise ValueError(f"request index {state.index} is already in this run")
        else:
            queued.add(state.index)
            pending.append(state)

    def next_cohort() -> None:
        """Cohort admission: once the graph is empty, the next cohort enters it."""
        if cohorts is None or live or not pending:
            return
        rows = [max(rows_for(stages[sid], s) for sid in s.plan.stages) for s in pending]
        taken = make_cohorts([cohorts.key(s) for s in pending], cohorts.width, rows)[0]
        chosen = [pending[i] for i in taken]
        for i in reversed(taken):
            del pending[i]
        for state in chosen:
            register(state)

    for state in states:
        enter(state)

    def emit(state: R, sid: str, event: Event) -> None:
        if listener is not None and not isinstance(event, HiddenRows):  # an edge's, not news
            listener(event)
        after = nxt[(state.index, sid)]
        if after is None or not stages[after].consumes:
            return
        slot = slot_of[after].get(state.index)
        if slot is None:
            held[after].setdefault(state.index, []).append(event)
        else:
            stages[after].consume(slot, event)

    def fail(state: R, sid: str, error: str) -> None:
        live.pop(state.index, None)
        state.error = state.error or (error if error == CANCELLED else f"{sid}: {error}")
        for other in order:
            to_come[other].discard(state.index)
            held[other].pop(state.index, None)
            if state in waiting[other]:
                waiting[other].remove(state)
            slot = slot_of[other].pop(state.index, None)
            if slot is not None and active[other].get(slot.row) is slot:
                del active[other][slot.row]
                stages[other].discard(slot)
        if listener is not None:
            listener(Failed(state.index, sid, state.error))
        if done is not None:
            done(state)

    def settle(sid: str, rows: Sequence[int]) -> None:
        stage = stages[sid]
        for row in rows:
            slot = active[sid].get(row)
            if slot is None:  # failed elsewhere while this stage settled
                continue
            state = slot.state
            after = nxt[(state.index, sid)]
            want = listener is not None or (after is not None and stages[after].consumes)
            try:
                for event in stage.update(slot, want):
                    emit(state, sid, event)
                if slot.finish is None:
                    continue
                stage.retire(slot)
            except Exception as e:  # this request's own update failed: it leaves alone
                log.debug("request %d failed in %s", state.index, sid, exc_info=True)
                fail(state, sid, failure(e))
                continue
            del active[sid][row]
            del slot_of[sid][state.index]
            finished.add((state.index, sid))
            if after is None:
                live.pop(state.index, None)
                if done is not None:
                    done(state)

    def held_rows(sid: str) -> set[int]:
        return {r for row, slot in active[sid].items() for r in range(row, row + span(slot))}

    def admit(sid: str) -> bool:
        stage, width = stages[sid], widths[sid]
        wide = [(s, n) for s in waiting[sid] if (n := rows_for(stage, s)) > width]
        for state, need in wide:  # it could never start here
            fail(state, sid, f"it needs {need} rows; the stage has {width}")
        free = width - len(held_rows(sid))
        if not free or not waiting[sid]:
            return bool(wide)
        # a cohort goes in together: every request of it still to come here, waiting and ready
        together = cohorts is not None
        if together and len(waiting[sid]) < len(to_come[sid]):
            return bool(wide)
        chosen: list[tuple[R, int]] = []
        for state in waiting[sid]:
            if not free and not together:
                break
            path = state.plan.stages
            before = path[path.index(sid) - 1] if path[0] != sid else None
            upstream_done = before is None or (state.index, before) in finished
            if stage.ready(state, upstream_done, held[sid].get(state.index, ())):
                need = rows_for(stage, state)
                if need > free:  # it waits for its rows, and the ones after it with it
                    break
                chosen.append((state, need))
                free -= need
            elif together:
                return bool(wide)
        if not chosen:
            return bool(wide)
        needs = [need for _, need in chosen]
        starts = place(held_rows(sid), needs, width)
        if starts is None:  # enough rows, but apart: the held spans move down first
            pack(active[sid], stage)
            starts = place(held_rows(sid), needs, width)
            assert starts is not None, "packed spans leave the free rows in one run"
        entries = [(state, row, held[sid].pop(state.index, []))
                   for (state, _), row in zip(chosen, starts, strict=True)]  # fmt: skip
        for state, row, _ in entries:
            waiting[sid].remove(state)
            if state.plan.stages[0] == sid:  # its row in its first stage's batch; its start
                state.batch_idx = row if state.batch_idx is None else state.batch_idx
                state.started = state.started or time.perf_counter()
            to_come[sid].discard(state.index)
        try:
            admitted = stage.admit(entries)
        except Exception as e:  # a prefill call failed: the requests it held fail
            log.debug("admitting into %s failed", sid, exc_info=True)
            for state, _, _ in entries:
                fail(state, sid, failure(e))
            return True
        taken = {id(slot.state) for slot in admitted}
        for state, _, _ in entries:
            if id(state) not in taken:
                fail(state, sid, state.error or "not admitted")
        later: set[str] = set()
        for slot in admitted:
            active[sid][slot.row] = slot
            slot_of[sid][slot.state.index] = slot
            after = nxt[(slot.state.index, sid)]
            if after is not None:  # it waits there from now on: a streaming stage may start
                waiting[after].append(slot.state)
                later.add(after)
        for after in later:  # in input order
            waiting[after].sort(key=lambda s: s.index)
        settle(sid, [slot.row for slot in admitted])
        return True

    def where(state: R) -> str:
        """The stage a request is at: where it holds a slot, or else the first it waits at."""
        for sid in reversed(order):
            if state.index in slot_of[sid]:
                return sid
        return next((sid for sid in order if state in waiting[sid]), state.plan.stages[0])

    waited = dict.fromkeys(order, 0)  # turns each stage has waited with rows to step
    def busy() -> bool:
        return bool(pending) or any(waiting.values()) or any(active.values())

    polls = {sid for sid in order if getattr(stages[sid], "polls", False)}
    relays = {sid for sid in order if getattr(stages[sid], "relay", False)}  # no patience
    while busy() or (feed is not None and not feed.closed):
        worked = False  # something besides empty polls happened this turn
        if feed is not None:  # with nothing in the graph, wait for the next request
            for state in feed.take(wait=not live and not pending):
                enter(state)
                worked = True
        next_cohort()
        if not live:
            continue
        if cancelled is not None:
            for state in [s for s in live.values() if cancelled(s)]:
                fail(state, where(state), CANCELLED)
        moved = False
        for sid in order:
            t = time.perf_counter()
            admitted = admit(sid)
            moved = admitted or moved
            worked = worked or admitted
            coming = to_come[sid] or waiting[sid]  # more rows are on their way: wait a while
            full = len(held_rows(sid)) >= widths[sid] or sid in relays
            if active[sid] and waited[sid] < patience and not full and coming:
                waited[sid] += 1
                moved = worked = True
            elif active[sid]:
                moved = True
                waited[sid] = 0
                try:
                    took = stages[sid].step(active[sid])
                    worked = worked or sid not in polls or bool(took)
                except Exception as e:  # an engine call on these rows failed: they fail
                    log.debug("a step of %s failed", sid, exc_info=True)
                    for slot in list(active[sid].values()):
                        fail(slot.state, sid, failure(e))
                else:
                    settle(sid, sorted(active[sid]))
                if not to_come[sid] and not waiting[sid]:  # draining: rows move down
                    compact(active[sid], stages[sid])
            times[sid] = times.get(sid, 0.0) + time.perf_counter() - t
        if idle is not None and not worked and live:
            idle()
        if not moved:  # nothing runs and nothing waiting can start: it never will
            for sid in order:
                for state in list(waiting[sid]):
                    fail(state, sid, failure(Stuck("its upstream stage never made it ready")))


def compact(active: dict[int, S], stage: SlotStage[R, S]) -> None:
    """Move the slots whose rows reach ``n`` (the rows held) or past into the free rows below
    it, the highest first into the lowest free run, so the held rows are 0..n-1 (a decode
    step calls rows 0..highest held: its fixed cost, the weights read, is paid once, and each
    row it calls costs compute). Spans that find no free run there are packed (``pack``)."""
    n = sum(span(s) for s in active.values())
    held = {r for row, s in active.items() for r in range(row, row + span(s))}
    for src in sorted((r for r, s in active.items() if r + span(s) > n), reverse=True):
        k = span(active[src])
        dst = place(held, [k], n)
        if dst is None:
            pack(active, stage)
            return
        slot = active.pop(src)
        stage.move(slot, dst[0])
        active[dst[0]] = slot
        held.difference_update(range(src, src + k))
        held.update(range(dst[0], dst[0] + k))


def pack(active: dict[int, S], stage: SlotStage[R, S]) -> None:
    """Move every slot down, in row order, onto the one before it: the held rows become
    0..n-1 and the free ones one run above them (each move goes down, onto free rows or its
    own)."""
    at = 0
    for row in sorted(active):
        slot = active[row]
        if row != at:
            del active[row]
            stage.move(slot, at)
            active[at] = slot
        at += span(slot)


def failure(e: BaseException) -> str:
    """An unexpected exception as a request's error: its type and message."""
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
