"""Scheduling, pure Python: cohorts of requests that run as one batch, and the in-flight loop
that admits requests into a running batch and retires them as they finish.

A cohort's requests must run the same stages with the same request fields and share
batch-wide settings (sampling, chat-template flags); the caller folds all of that into one
hashable key per request. Grouping is greedy in input order so results are deterministic and
early requests are never starved by later ones.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["SlotCapable", "SlotStage", "make_cohorts", "run_slots"]
log = logging.getLogger("edge-infer")


def make_cohorts(keys: Sequence[Hashable], width: int) -> list[list[int]]:
    """Split request indices into cohorts of at most ``width`` requests with equal keys.

    Walking the requests in order, each cohort starts at the first unassigned request and
    takes the following unassigned requests with an equal key until it is full; requests that
    do not fit wait for a later cohort. Every index appears exactly once, in increasing order
    within its cohort, and cohorts are ordered by their first request.
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"cohort width must be an integer >= 1, got {width!r}")
    # Per key, its requests in input order: a cohort always takes from the front, so the
    # front is the earliest unassigned request with that key.
    queues: dict[Hashable, deque[int]] = {}
    for i, key in enumerate(keys):
        queues.setdefault(key, deque()).append(i)
    assigned = [False] * len(keys)
    cohorts: list[list[int]] = []
    for i, key in enumerate(keys):
        if assigned[i]:
            continue
        queue = queues[key]
        cohort = [queue.popleft() for _ in range(min(width, len(queue)))]
        for j in cohort:
            assigned[j] = True
        cohorts.append(cohort)
    return cohorts


# ---------------------------------------------------------------------------------------------
# In-flight batching: one loop of schedule -> execute -> update over a stage whose requests hold
# slots (a cache row each, their own settings), so requests join and leave a running batch.


@runtime_checkable
class SlotStage(Protocol):
    """A stage the in-flight loop steps. ``admit`` prefills requests into free rows and draws
    each one's first token; ``step`` decodes every active row once and draws its next token;
    ``update`` settles one slot after its newest token (its ``finish``, and when asked the
    events the token adds: text, Finished); ``retire`` writes a finished request's outputs;
    ``move`` puts a slot in another (free) row, its cache rows with it.
    A slot's ``finish`` is set once it is done and ``state`` is its request's."""

    stage_id: str

    def admit(self, entries: Sequence[tuple[Any, int]]) -> list[Any]: ...

    def step(self, slots: Mapping[int, Any]) -> None: ...

    def update(self, slot: Any, events: bool) -> list[Any]: ...

    def move(self, slot: Any, row: int) -> None: ...

    def retire(self, slot: Any) -> None: ...


@runtime_checkable
class SlotCapable(Protocol):
    """A stage runner that can serve the in-flight loop."""

    def slot_stage(self) -> SlotStage: ...


def run_slots(
    stage: SlotStage,
    states: Sequence[Any],
    width: int,
    *,
    listener: Callable[[Any], None] | None = None,
    done: Callable[[Any], None] | None = None,
) -> None:
    """Run every request through ``stage`` with at most ``width`` in flight, in input order.

    Each turn admits waiting requests into the free rows (the lowest first), then steps the
    active ones, then retires those that finished, freeing their rows for the next turn; once
    nothing waits, the rows left are moved down (``compact``). A
    request whose admission or update fails leaves alone (its ``error`` set, Failed emitted);
    a step that fails fails the rows it ran. ``done(state)`` is called as each request
    leaves; ``listener`` gets every event, in order per request.
    """
    from edgeomni.runtime.events import Failed

    waiting: deque[Any] = deque(states)
    active: dict[int, Any] = {}

    def emit(event: Any) -> None:
        if listener is not None:
            listener(event)

    def fail(state: Any, error: str) -> None:
        state.error = state.error or f"{stage.stage_id}: {error}"
        emit(Failed(state.index, stage.stage_id, state.error))
        if done is not None:
            done(state)

    def settle(rows: Sequence[int]) -> None:
        for row in rows:
            slot = active[row]
            try:
                for event in stage.update(slot, listener is not None):
                    emit(event)
                if slot.finish is None:
                    continue
                stage.retire(slot)
            except Exception as e:  # this request's own update failed: it leaves alone
                log.debug("request %d failed in %s", slot.state.index, stage.stage_id,
                          exc_info=True)  # fmt: skip
                del active[row]
                fail(slot.state, _failure(e))
                continue
            del active[row]
            if done is not None:
                done(slot.state)

    while waiting or active:
        free = [r for r in range(width) if r not in active][: len(waiting)]
        entries = [(waiting.popleft(), row) for row in free]
        for state, row in entries:  # its row in the running batch
            state.batch_idx = row if state.batch_idx is None else state.batch_idx
        if entries:
            try:
                admitted = stage.admit(entries)
            except Exception as e:  # a prefill call failed: the requests it held fail
                log.debug("admitting into %s failed", stage.stage_id, exc_info=True)
                for state, _ in entries:
                    fail(state, _failure(e))
                admitted = []
            for slot in admitted:
                active[slot.row] = slot
            settle([slot.row for slot in admitted])
        if not active:
            continue
        try:
            stage.step(active)
        except Exception as e:  # an engine call on these rows failed: they fail
            log.debug("a step of %s failed", stage.stage_id, exc_info=True)
            for row in list(active):
                fail(active.pop(row).state, _failure(e))
            continue
        settle(sorted(active))
        if not waiting:  # draining: the rows left move down, so each step calls fewer rows
            compact(active, stage)


def compact(active: dict[int, Any], stage: SlotStage) -> None:
    """Move the slots in rows at or past ``len(active)`` into the free rows below it, so the
    active rows are 0..n-1 (a decode step calls rows 0..highest active: its fixed cost, the
    weights read, is paid once, and each row it calls costs compute)."""
    n = len(active)
    free = [r for r in range(n) if r not in active]
    high = sorted((r for r in active if r >= n), reverse=True)
    for src, dst in zip(high, free, strict=True):
        slot = active.pop(src)
        stage.move(slot, dst)
        active[dst] = slot


def _failure(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
