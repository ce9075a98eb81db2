"""The one decoder stage: every autoregressive model of a graph (the text model or thinker, the
talkers) runs under the scheduler loop through it.

A request holds a slot: a KV cache row, its own sampling settings and generator, its limits. It
is prefilled into a free row while the others decode (each contiguous run of new rows one call),
draws its first token there, and leaves the batch the step it finishes. A decode step calls
rows [0, highest active]: a row that cannot step yet (a talker waiting for its thinker's next
token) or is free sits the call out with query length 0, its cache untouched.

What differs between models is a small spec (``DecoderSpec``): the prefill rows, the next
step's inputs (a token's embedding; for a talker, its code predictor's frame, a per-step
sub-stage, plus the next text row), which tokens are banned, the finish rule, the events and
outputs a request makes. The loop, cache rows, sampling, logprobs and timing live here once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np

from edgeomni.runtime.decoder import TOPK_OUTPUTS, DecoderSession, StepOutputs, text_positions
from edgeomni.runtime.engine import Engine
from edgeomni.runtime.events import Event, Finished
from edgeomni.runtime.row_state import RowState
from edgeomni.runtime.sampling import SamplingParams, StepLogits, log_softmax_top, sample_rows
from edgeomni.runtime.stage import RequestState

__all__ = ["DecoderSpec", "DecoderStage", "Slot", "StepPlan", "plan_step", "prefill_runs", "rows_of"]

_NONE = np.zeros(0, np.int64)
D = TypeVar("D")  # a spec's own per-request data


@dataclass
class Slot(Generic[D]):
    """One request decoding in one cache row. ``data`` is the spec's own (a prompt, a talker's
    frames so far); ``history`` is what the repetition penalty sees: ``prefix`` ids (a text
    model's prompt), then the tokens drawn."""

    state: RequestState
    row: int
    data: D
    sampling: SamplingParams
    rng: np.random.Generator
    length: int  # prompt positions
    delta: int = 0  # decode positions are past + delta
    bias: tuple[np.ndarray, np.ndarray] | None = None
    history: np.ndarray | None = None
    prefix: int = 0
    top_logprobs: int = 0  # candidates reported for each token drawn
    generated: list[int] = field(default_factory=list)
    logprobs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    finish: str | None = None
    past: int = 0
    steps: int = 0
    prefill_s: float = 0.0
    prefill_engine_s: float = 0.0
    decode_s: float = 0.0
    decode_engine_s: float = 0.0
    full_rows: int = 0  # rows whose full logits came to the host for it
    widest: int = 1  # the most rows that stepped together while it decoded

    def __post_init__(self) -> None:
        self.past = self.past or self.length


@dataclass(frozen=True)
class StepPlan:
    """One decode step as the stage runs it: the rows that step (ascending) and the call's
    width (rows 0..width-1, up to the highest active row; the others sit it out with query
    length 0, their cache untouched), with each row's cache length, position offset and
    query length, as the engine is fed them."""

    rows: tuple[int, ...]
    width: int
    past: np.ndarray  # int32 [width]
    deltas: np.ndarray  # int32 [width]: decode positions are past + delta
    query: np.ndarray  # int32 [width]: 1 for the rows that step


def plan_step(slots: Mapping[int, Slot[D]], can_step: Callable[[Slot[D]], bool]) -> StepPlan | None:
    """The step of these active slots (by row) whose ``can_step(slot)`` holds; None: none."""
    rows = sorted(r for r, s in slots.items() if can_step(s))
    if not rows:
        return None
    width = max(slots) + 1
    past = np.zeros(width, np.int32)
    deltas = np.zeros(width, np.int32)
    for row, s in slots.items():
        past[row], deltas[row] = s.past, s.delta
    query = np.zeros(width, np.int32)
    query[rows] = 1
    return StepPlan(tuple(rows), width, past, deltas, query)


def prefill_runs(slots: Sequence[Slot[D]]) -> list[list[Slot[D]]]:
    """New slots (by ascending row) in runs of contiguous rows: each run is one prefill call."""
    runs: list[list[Slot[D]]] = []
    for slot in slots:
        if runs and slot.row == runs[-1][-1].row + 1:
            runs[-1].append(slot)
        else:
            runs.append([slot])
    return runs


class DecoderSpec(Protocol[D]):
    """A model's part of the decoder stage. ``outputs``: decode outputs (name -> shape after the
    batch axis), ``per_position`` those also [rows, S, ...]; ``prefill_fetch``: outputs read on
    the host after a prefill, with the top-K in one sync; ``consumes``: it takes its upstream
    stage's events (a talker, its thinker's). ``D``: its slots' ``data``."""

    stage_id: str
    engine: Engine
    state: RowState  # its rows' declared state (row_state.py)
    hidden_size: int
    mrope: bool
    consumes: bool

    @property  # read-only: a spec's own may be narrower (a dict, a tuple of one)
    def outputs(self) -> Mapping[str, tuple[int, ...]]: ...
    @property
    def per_position(self) -> tuple[str, ...]: ...
    @property
    def prefill_fetch(self) -> tuple[str, ...]: ...

    def ready(self, state: RequestState, upstream_done: bool, events: Sequence[Event]) -> bool:
        """Whether a request waiting here can start now (``events``: its upstream's so far)."""
        ...

    def open(self, entries: Sequence[tuple[RequestState, int, Sequence[Event]]]) -> list[Slot[D]]:
        """Slots for these requests in these rows; one it cannot start is left out, its
        ``error`` set."""
        ...

    def prefill(
        self, run: Sequence[Slot[D]]
    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """A run of new rows' right-padded prefill: embeddings, positions, extra inputs."""
        ...

    def prefilled(self, run: Sequence[Slot[D]], out: StepOutputs) -> None: ...

    def consume(self, slot: Slot[D], event: Event) -> None: ...

    def can_step(self, slot: Slot[D]) -> bool: ...

    def inputs(
        self, ready: Sequence[Slot[D]], slots: Mapping[int, Slot[D]], last: StepOutputs | None
    ) -> np.ndarray:
        """The ready rows' next inputs [len(ready), H]; ``last``: the last decode step's
        outputs (None before the first)."""
        ...

    def decode_feeds(self, rows: int) -> dict[str, np.ndarray]: ...

    def stepped(self, ready: Sequence[Slot[D]]) -> None: ...

    def banned(self, slot: Slot[D]) -> np.ndarray | None: ...

    def finished(self, slot: Slot[D]) -> str | None: ...

    def events(self, slot: Slot[D]) -> list[Event]: ...

    def move(self, slot: Slot[D], last: StepOutputs | None) -> None: ...

    def retire(self, slot: Slot[D]) -> None: ...


class DecoderStage(Generic[D]):
    """``scheduler.SlotStage`` over a decoder engine, its cache and a model's spec."""

    def __init__(self, spec: DecoderSpec[D]) -> None:
        self.spec = spec
        self.stage_id = spec.stage_id
        self.consumes = spec.consumes
        self._last: StepOutputs | None = None  # the last decode step's outputs
        self._decode: dict[int, DecoderSession] = {}

    def _session(self, rows: int, first: int) -> DecoderSession:
        s = self.spec
        return DecoderSession(s.engine, s.state, rows, s.outputs, per_position=s.per_position,
                              first_row=first)  # fmt: skip

    def _decode_session(self, rows: int) -> DecoderSession:
        """Decode steps over rows 0..rows-1 are one token wide: their sessions (and output
        buffers) are kept, one per row count. A prefill's session is made for its call: its
        buffers are as wide as the prompt, so keeping them would keep a set per length seen."""
        if rows not in self._decode:
            self._decode[rows] = self._session(rows, 0)
        return self._decode[rows]

    # -- the scheduler's calls ---------------------------------------------------------------
    def ready(self, state: RequestState, upstream_done: bool, events: Sequence[Event]) -> bool:
        return self.spec.ready(state, upstream_done, events)

    def consume(self, slot: Slot[D], event: Event) -> None:
        self.spec.consume(slot, event)

    def discard(self, slot: Slot[D]) -> None:
        """A request that failed elsewhere: its row is simply free again."""

    def admit(self, entries: Sequence[tuple[RequestState, int, Sequence[Event]]]) -> list[Slot[D]]:
        """Prefill these requests into their rows (each contiguous run of rows one call) and
        draw each one's first token."""
        slots = self.spec.open(sorted(entries, key=lambda e: e[1]))
        for run in prefill_runs(slots):
            self.spec.state.reset_rows(run[0].row, len(run))  # no earlier request's state
            self._prefill(run)
        return slots

    def _prefill(self, run: Sequence[Slot[D]]) -> None:
        embeds, positions, extra = self.spec.prefill(run)
        lens = np.array([s.length for s in run], np.int32)
        session = self._session(len(run), run[0].row)
        start = time.perf_counter()
        zeros = np.zeros(len(run), np.int32)
        # mypy matches a **dict of arrays against run's tag and wait: the feeds never name them
        out = session.run(embeds, positions, zeros, lens, lens - 1, **extra)  # type: ignore[arg-type]
        out.fetch(*self.spec.prefill_fetch, *TOPK_OUTPUTS)
        self._draw(run, out.logits())
        self.spec.prefilled(run, out)
        elapsed = time.perf_counter() - start
        for slot in run:
            slot.prefill_s += elapsed
            slot.prefill_engine_s += session.engine_seconds

    def step(self, slots: Mapping[int, Slot[D]]) -> None:
        """One decode step of every row that can step: rows [0, highest active] in one call."""
        spec = self.spec
        plan = plan_step(slots, spec.can_step)
        if plan is None:
            return
        rows, hi = list(plan.rows), plan.width
        ready = [slots[r] for r in rows]
        start = time.perf_counter()
        embeds = np.zeros((hi, 1, spec.hidden_size), np.float32)
        embeds[rows, 0] = spec.inputs(ready, slots, self._last)
        session = self._decode_session(hi)
        engine = session.engine_seconds
        out = session.run(embeds, text_positions(plan.past + plan.deltas, 1, spec.mrope),
                          plan.past, plan.query, np.zeros(hi, np.int64),
                          **spec.decode_feeds(hi))  # type: ignore[arg-type]  # fmt: skip
        logits = out.logits()
        self._draw(ready, rows_of(logits, np.array(rows, np.int64)) if len(rows) != hi else logits)
        self._last = out
        spec.stepped(ready)
        elapsed, engine = time.perf_counter() - start, session.engine_seconds - engine
        for s in ready:
            s.past += 1
            s.steps += 1
            s.decode_s += elapsed
            s.decode_engine_s += engine
            s.widest = max(s.widest, len(slots))

    def _draw(self, slots: Sequence[Slot[D]], step: StepLogits) -> None:
        """Each slot's next token from its own settings, penalty history, bans, bias and
        generator; its logprobs (from the model's logits, before bias and penalty)."""
        seen = None
        if any(s.history is not None for s in slots):
            seen = [s.history[: s.prefix + len(s.generated)] if s.history is not None else _NONE
                    for s in slots]  # fmt: skip
        bias = [s.bias for s in slots]
        tokens, fetched = sample_rows(
            step, [s.sampling for s in slots], [s.rng for s in slots], seen,
            [self.spec.banned(s) for s in slots],
            bias if any(x is not None for x in bias) else None,
        )  # fmt: skip
        asked = [j for j, s in enumerate(slots) if s.top_logprobs]
        if asked:
            top = max(slots[j].top_logprobs for j in asked)
            ids, values = log_softmax_top(step.full(np.array(asked, np.int64)), top)
            for k, j in enumerate(asked):
                n = slots[j].top_logprobs
                slots[j].logprobs.append((ids[k, :n], values[k, :n]))
        for j, slot in enumerate(slots):
            token = int(tokens[j])
            slot.generated.append(token)
            slot.full_rows += fetched + len(asked)
            if slot.history is not None:
                slot.history[slot.prefix + len(slot.generated) - 1] = token

    def update(self, slot: Slot[D], events: bool) -> list[Event]:
        """After the slot's newest token: whether it finished and, when ``events``, what it
        adds to the stream, then Finished."""
        slot.finish = self.spec.finished(slot)
        if not events:
            return []
        out = self.spec.events(slot)
        if slot.finish is not None:
            out.append(Finished(slot.state.index, self.stage_id, slot.finish))
        return out

    def move(self, slot: Slot[D], row: int) -> None:
        """The slot's cache into ``row`` (free), and the slot with it."""
        self.spec.move(slot, self._last)
        self.spec.state.move_row(slot.row, row, slot.past)
        slot.row = row

    def retire(self, slot: Slot[D]) -> None:
        self.spec.retire(slot)


def rows_of(step: StepLogits, rows: np.ndarray) -> StepLogits:
    """A step's logits for some of its rows (the active ones of a call over a wider range)."""

    def full(r: np.ndarray) -> np.ndarray:
        return step.full(rows[np.asarray(r, np.int64)])

    values, indices = step.topk_values, step.topk_indices
    return StepLogits(
        len(rows), full,
        None if values is None else values[rows], None if indices is None else indices[rows],
    )  # fmt: skip
