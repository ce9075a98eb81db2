"""The one decoder stage: every autoregressive model of a graph (the text model or thinker, the
talkers) runs under the scheduler loop through it.

A request holds a slot: a span of cache rows (one; two for classifier-free guidance), its own
sampling settings and generator, its limits. It is prefilled into free rows while the others
decode (each contiguous run of new rows one call), draws its first token there, and leaves the
batch the step it finishes. A decode step calls rows [0, highest active]: a row that cannot step
yet (a talker waiting for its thinker's next token) or is free sits the call out with query
length 0, its cache untouched.

Guidance (a spec's optional ``guidance(state) -> float | None`` hook: a request's scale, None
for one row) gives a request two adjacent rows, its conditional prompt's first and its
unconditional prompt's second, each with its own prompt length. Every step feeds both the
same token, and one token is drawn per request from the guided logits

    guided = uncond + scale * (cond - uncond)

(``guide``), combined on the host from the two rows' full logits, or in the engine when it was
exported with guidance (decoder.WithGuidance: inputs ``guidance_rows`` int64 [B], each row's
unconditional row within the call, itself for an unguided row, and ``guidance_scale`` float32
[B]; its ``logits``, and a top-K taken from them, are then a cond row's guided ones), so a
GPU's top-K stays on the device. Sampling (runtime/sampling.py) draws from them as from any
row's.

What differs between models is a small spec (``DecoderSpec``): the prefill rows, the next
step's inputs (a token's embedding; for a talker, its code predictor's frame, a per-step
sub-stage, plus the next text row), which tokens are banned, the finish rule, the events and
outputs a request makes. The loop, cache rows, sampling, logprobs and timing live here once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from edgeomni.runtime.cached_prefill import Assembled, CachedRow, assemble, phase_feeds, plan_rows
from edgeomni.runtime.context_cache import ContextCache, PrefixCache, build_identity
from edgeomni.runtime.decoder import TOPK_OUTPUTS, DecoderSession, StepOutputs, text_positions
from edgeomni.runtime.engine import Engine
from edgeomni.runtime.events import Event, Finished
from edgeomni.runtime.row_state import RowState
from edgeomni.runtime.sampling import SamplingParams, StepLogits, log_softmax_top, sample_rows
from edgeomni.runtime.stage import RequestState

__all__ = ["GUIDANCE_INPUTS", "DecoderSpec", "DecoderStage", "Slot", "StepPlan", "guide",
           "guidance_feeds", "plan_step", "prefill_runs", "rows_of", "span_logits"]  # fmt: skip

_NONE = np.zeros(0, np.int64)
D = TypeVar("D")  # a spec's own per-request data
# the inputs of an engine that combines a guided span's logits itself (decoder.WithGuidance)
GUIDANCE_INPUTS = ("guidance_rows", "guidance_scale")


@dataclass
class Slot(Generic[D]):
    """One request decoding in a span of cache rows from ``row`` on (one; a guided request's
    two: ``lengths`` gives each row's prompt positions, ``length`` being the first's, and
    ``guidance`` its scale). ``data`` is the spec's own (a prompt, a talker's frames so far);
    ``history`` is what the repetition penalty sees: ``prefix`` ids (a text model's prompt),
    then the tokens drawn."""

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
    lengths: tuple[int, ...] = ()  # each row's prompt positions in a span (): ``length``'s row
    guidance: float | None = None  # a guided span's scale (the stage sets it)
    cached: int = 0  # prompt positions its first row took from the context cache

    def __post_init__(self) -> None:
        self.past = self.past or self.length

    @property
    def rows(self) -> int:
        """The rows it holds from ``row`` on (scheduler.span)."""
        return len(self.lengths) or 1

    def pasts(self) -> list[int]:
        """Each of its rows' cache length: every row of a span advances with the first."""
        return [self.past + n - self.length for n in self.lengths or (self.length,)]


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
    slots: tuple[int, ...] = ()  # the first rows of the slots that step (ascending)


def plan_step(slots: Mapping[int, Slot[D]], can_step: Callable[[Slot[D]], bool]) -> StepPlan | None:
    """The step of these active slots (by first row) whose ``can_step(slot)`` holds, each with
    every row of its span; None: none."""
    ready = sorted(r for r, s in slots.items() if can_step(s))
    if not ready:
        return None
    width = max(r + s.rows for r, s in slots.items())
    past = np.zeros(width, np.int32)
    deltas = np.zeros(width, np.int32)
    for row, s in slots.items():
        past[row : row + s.rows], deltas[row : row + s.rows] = s.pasts(), s.delta
    rows = [r + i for r in ready for i in range(slots[r].rows)]
    query = np.zeros(width, np.int32)
    query[rows] = 1
    return StepPlan(tuple(rows), width, past, deltas, query, tuple(ready))


def prefill_runs(slots: Sequence[Slot[D]]) -> list[list[Slot[D]]]:
    """New slots (by ascending row) in runs of contiguous rows: each run is one prefill call."""
    runs: list[list[Slot[D]]] = []
    for slot in slots:
        if runs and slot.row == runs[-1][-1].row + runs[-1][-1].rows:
            runs[-1].append(slot)
        else:
            runs.append([slot])
    return runs


class QueuedDraw(Protocol):
    """A step's tokens a spec's ``draw`` queued where the outputs are."""

    def tokens(self) -> np.ndarray | None:
        """The tokens [ready rows], or None where the host must draw the step after all (the
        numbers the draw took put back)."""
        ...

    def cancel(self) -> None:
        """Drop them (the step runs again), the numbers they took put back."""
        ...


class DecoderSpec(Protocol[D]):
    """A model's part of the decoder stage. ``outputs``: decode outputs (name -> shape after the
    batch axis), ``per_position`` those also [rows, S, ...]; ``prefill_fetch``: outputs read on
    the host after a prefill, with the top-K in one sync; ``consumes``: it takes its upstream
    stage's events (a talker, its thinker's). ``D``: its slots' ``data``.

    Optional: ``guidance(state) -> float | None``, a request's guidance scale (None: it takes
    one row). A guided request's slot, opened with two ``lengths``, holds its conditional
    and unconditional rows; its ``prefill`` gives both rows' inputs, its ``inputs`` one row per
    slot (both rows take it)."""

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
        """A run of new slots' rows' right-padded prefill (a span's rows in order, each its
        own prompt): embeddings, positions, extra inputs."""
        ...

    def prefilled(self, run: Sequence[Slot[D]], out: StepOutputs) -> None: ...

    def consume(self, slot: Slot[D], event: Event) -> None: ...

    def can_step(self, slot: Slot[D]) -> bool: ...

    def inputs(
        self, ready: Sequence[Slot[D]], slots: Mapping[int, Slot[D]], last: StepOutputs | None
    ) -> Any:
        """The ready rows' next inputs [len(ready), H]; ``last``: the last decode step's
        outputs (None before the first). Or, where every row of the step is ready (rows 0 to
        n-1, no spans), the step's whole input [n, 1, H] in the engine's input type (on a GPU a
        buffer made there), which ``confirm`` says is final once the step is queued."""
        ...

    def confirm(self, ready: Sequence[Slot[D]]) -> np.ndarray | None:
        """After the step ran on what ``inputs`` gave: None where that stands, else the host
        inputs [len(ready), H] to run the step again with (an input made on the device that
        the host had to make again)."""
        ...

    def draw(
        self, ready: Sequence[Slot[D]], slots: Mapping[int, Slot[D]], out: StepOutputs
    ) -> QueuedDraw | None:
        """Right after the step is queued (before ``confirm``): each ready row's next token
        drawn where the outputs are (a speech talker on a GPU), from the numbers the host would
        have drawn, queued; None, and the stage draws on the host."""
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
        self._guides_in_graph: bool | None = None
        self.prefix: PrefixCache | None = None  # its prompts' blocks (use_context_cache)

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

    @property
    def guides_in_graph(self) -> bool:
        """Whether the engine combines guided spans itself (decoder.WithGuidance): asked of the
        engine when a call first needs it."""
        if self._guides_in_graph is None:
            names = self.spec.engine.input_names
            self._guides_in_graph = all(n in names for n in GUIDANCE_INPUTS)
        return self._guides_in_graph

    def guidance(self, state: RequestState) -> float | None:
        """The request's guidance scale (the spec's optional hook); None: one row."""
        hook: Callable[[RequestState], float | None] | None = getattr(self.spec, "guidance", None)
        return None if hook is None else hook(state)

    def _feeds(self, slots: Sequence[Slot[D]], first: int, rows: int) -> dict[str, np.ndarray]:
        return guidance_feeds(slots, first, rows) if self.guides_in_graph else {}

    # -- the scheduler's calls ---------------------------------------------------------------
    def rows_for(self, state: RequestState) -> int:
        """A guided request holds two rows, any other one."""
        return 1 if self.guidance(state) is None else 2

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
        for slot in slots:
            slot.guidance = self.guidance(slot.state)
            if slot.rows != self.rows_for(slot.state):
                raise ValueError(f"{self.stage_id}: a request of {self.rows_for(slot.state)} "
                                 f"rows opened with {slot.rows}")  # fmt: skip
        runs = prefill_runs(slots)
        if self.prefix is not None and self._rows_with_past():
            # rows that resume from the cache have past context: on an engine that takes one
            # such row a call (onnxruntime before 1.32), each request prefills alone
            runs = [[s] for run in runs for s in run]
        for run in runs:
            rows = sum(s.rows for s in run)
            self.spec.state.reset_rows(run[0].row, rows)  # no earlier request's state
            self._prefill(run, rows)
        return slots

    @property
    def on_host(self) -> bool:
        """Whether its rows live in host memory (a CPU engine's)."""
        return bool(self.spec.engine.buffers.on_host)

    def use_context_cache(self, cache: ContextCache) -> None:
        """Prefill through a prefix cache in ``cache`` (runtime/context_cache.py): its part is
        this stage's, under its build's identity."""
        spec = self.spec
        identity = build_identity(getattr(spec, "folder", None), getattr(spec, "config", {}))
        self.prefix = PrefixCache(cache.part(self.stage_id, identity), spec.state)

    def _prefill(self, run: Sequence[Slot[D]], rows: int) -> None:
        embeds, positions, extra = self.spec.prefill(run)
        lens = np.array([n for s in run for n in s.lengths or (s.length,)], np.int32)
        first = run[0].row
        session = self._session(rows, first)
        start = time.perf_counter()
        guidance = self._feeds(run, first, rows)
        planned = self._plan_cached(run, embeds, positions, extra, lens, first)
        if planned is None:
            zeros = np.zeros(rows, np.int32)
            # mypy matches a **dict of arrays against run's tag and wait: feeds never name them
            out = session.run(embeds, positions, zeros, lens, lens - 1,
                              **extra, **guidance)  # type: ignore[arg-type]  # fmt: skip
            out.fetch(*self.spec.prefill_fetch, *TOPK_OUTPUTS)
        else:
            out = self._run_cached(session, planned, embeds, positions, extra, guidance)
        self._draw(run, self._per_slot(out.logits(), run, first))
        self.spec.prefilled(run, out)
        elapsed = time.perf_counter() - start
        for slot in run:
            slot.prefill_s += elapsed
            slot.prefill_engine_s += session.engine_seconds

    # -- the prefix cache (runtime/cached_prefill.py) ------------------------------------------
    def _axes(self, extra: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Each prefill feed's row axis (its positions the next): the embeddings', the
        positions' (three axes first with MRoPE), and the extras' the spec declares."""
        return {"inputs_embeds": 0, "position_ids": 1 if self.spec.mrope else 0,
                **getattr(self.spec, "prefill_axes", {})}  # fmt: skip

    def _rows_with_past(self) -> int:
        """The rows a call may hold where they have past context and more than one token (0:
        any; the engine's ``rows_with_past``, onnxruntime's GroupQueryAttention before 1.32)."""
        return int(getattr(self.spec.engine, "rows_with_past", 0) or 0)

    def _per_position(self) -> list[str]:
        """The per-position outputs the engine gives (a spec may name one its build lacks)."""
        return [n for n in self.spec.per_position if n in self.spec.outputs]

    def _plan_cached(
        self, run: Sequence[Slot[D]], embeds: np.ndarray, positions: np.ndarray,
        extra: Mapping[str, np.ndarray], lens: np.ndarray, first: int,
    ) -> list[CachedRow] | None:  # fmt: skip
        """Each row's lookup, what it found restored into its row; None: no cache, or a feed
        it cannot key (the run prefills whole)."""
        cap = self._rows_with_past()
        if self.prefix is None or (cap and len(lens) > cap):
            return None
        owners = [s for s in run for _ in range(s.rows)]
        wants: Callable[[Slot[D]], bool] | None = getattr(self.spec, "wants_positions", None)
        feeds = {"inputs_embeds": embeds, "position_ids": positions, **extra}
        planned = plan_rows(
            self.prefix, feeds, self._axes(extra), [int(n) for n in lens], first,
            [getattr(s.state.request, "context_cache_key", None) for s in owners],
            [bool(wants and wants(s)) for s in owners], self._per_position(),
        )  # fmt: skip
        if planned is not None:
            for s in run:
                s.cached = planned[s.row - first].start
        return planned

    def _run_cached(
        self, session: DecoderSession, planned: list[CachedRow], embeds: np.ndarray,
        positions: np.ndarray, extra: Mapping[str, np.ndarray],
        guidance: Mapping[str, np.ndarray],
    ) -> Any:  # fmt: skip
        """The rows' segments as right-aligned calls, the states and blocks they make
        published; the last call's outputs, per-position ones assembled."""
        prefix = self.prefix
        assert prefix is not None
        feeds = {"inputs_embeds": embeds, "position_ids": positions, **extra}
        axes = self._axes(extra)
        phases = max(len(r.ends) for r in planned)
        first = session.first_row
        out: Any = None
        for phase in range(phases):
            part, past, query = phase_feeds(planned, phase, phases, feeds, axes)
            last = np.maximum(query - 1, 0).astype(np.int64)
            out = session.run(part.pop("inputs_embeds"), part.pop("position_ids"), past, query,
                              last, **part, **guidance)  # type: ignore[arg-type]  # fmt: skip
            for r in planned:
                span = r.segment(phase, phases)
                if span is None:
                    continue
                for name in r.outputs:
                    r.kept[name].append(np.array(out[name][r.row, : span[1] - span[0]]))
                end = span[1]
                if prefix.hybrid and end % prefix.block == 0 and end // prefix.block <= len(r.keys):
                    prefix.publish_state(first + r.row, r.keys[end // prefix.block - 1])
        out.fetch(*self.spec.prefill_fetch, *TOPK_OUTPUTS)
        per_position = {}
        if any(r.start or len(r.ends) > 1 for r in planned):
            width = max(r.length for r in planned)
            for name in self._per_position():
                tail = tuple(self.spec.outputs[name])
                per_position[name] = assemble(planned, name, width, tail)
        for r in planned:
            prefix.publish(first + r.row, r.keys, r.length)
            for name in r.outputs:
                prefix.publish_outputs(name, r.keys, np.concatenate(r.kept[name]), 0)
        return Assembled(out, per_position) if per_position else out

    def step(self, slots: Mapping[int, Slot[D]]) -> None:
        """One decode step of every row that can step: rows [0, highest active] in one call."""
        spec = self.spec
        plan = plan_step(slots, spec.can_step)
        if plan is None:
            return
        rows, hi = list(plan.rows), plan.width
        ready = [slots[r] for r in plan.slots]
        start = time.perf_counter()
        fed = spec.inputs(ready, slots, self._last)
        session = self._decode_session(hi)
        engine = session.engine_seconds
        feeds = {**spec.decode_feeds(hi), **self._feeds(list(slots.values()), 0, hi)}

        def run(fed: Any) -> StepOutputs:
            if len(fed.shape) == 2:  # the ready rows' inputs
                embeds = np.zeros((hi, 1, spec.hidden_size), np.float32)
                if len(rows) != len(ready):  # a span's rows all take its input
                    fed = np.repeat(fed, [s.rows for s in ready], axis=0)
                embeds[rows, 0] = fed
            elif tuple(fed.shape) == (hi, 1, spec.hidden_size) and rows == list(range(hi)):
                embeds = fed  # the step's whole input (on a GPU made there): read as it is
            else:
                raise RuntimeError(f"{self.stage_id}: an input {tuple(fed.shape)} for a step "
                                   f"of rows {rows}")  # fmt: skip
            return session.run(embeds, text_positions(plan.past + plan.deltas, 1, spec.mrope),
                               plan.past, plan.query, np.zeros(hi, np.int64),
                               **feeds)  # type: ignore[arg-type]  # fmt: skip

        out = run(fed if hasattr(fed, "shape") else np.asarray(fed))
        queued = spec.draw(ready, slots, out)  # before confirm waits: the device has it
        again = spec.confirm(ready)
        if again is not None:  # the same positions: the cache's entries are written over
            if queued is not None:
                queued.cancel()
                queued = None
            out = run(np.asarray(again))
        tokens = None if queued is None else queued.tokens()
        if tokens is None:
            self._draw(ready, self._per_slot(out.logits(), ready, 0))
        else:
            self._take(ready, tokens, 0)
        self._last = out
        spec.stepped(ready)
        elapsed, engine = time.perf_counter() - start, session.engine_seconds - engine
        for s in ready:
            s.past += 1
            s.steps += 1
            s.decode_s += elapsed
            s.decode_engine_s += engine
            s.widest = max(s.widest, len(slots))

    def _per_slot(self, step: StepLogits, slots: Sequence[Slot[D]], first: int) -> StepLogits:
        """One row of logits per slot (a call's rows start at ``first``): a guided span's
        combined on the host when the engine did not (its two rows' full logits count as
        fetched)."""
        on_host = not self.guides_in_graph
        if on_host:
            for s in slots:
                s.full_rows += s.rows if s.guidance is not None else 0
        return span_logits(step, slots, first, on_host)

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
        self._take(slots, tokens, fetched + len(asked))

    def _take(self, slots: Sequence[Slot[D]], tokens: np.ndarray, fetched: int) -> None:
        """Each slot's token drawn, into its tokens and penalty history (``fetched``: the full
        logit rows each read)."""
        for j, slot in enumerate(slots):
            token = int(tokens[j])
            slot.generated.append(token)
            slot.full_rows += fetched
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
        """The slot's cache rows into its span from ``row`` on (free rows, or its own: row by
        row, ascending, so a span moving down onto itself reads each row before it is
        overwritten), and the slot with it."""
        self.spec.move(slot, self._last)
        for i, past in enumerate(slot.pasts()):
            self.spec.state.move_row(slot.row + i, row + i, past)
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


def guide(cond: np.ndarray, uncond: np.ndarray, scale: float) -> np.ndarray:
    """Classifier-free guidance, ``uncond + scale * (cond - uncond)``, in float32, elementwise
    in that order (decoder.WithGuidance computes the same in the engine)."""
    c, u = np.asarray(cond, np.float32), np.asarray(uncond, np.float32)
    return u + np.float32(scale) * (c - u)


def guidance_feeds(slots: Sequence[Slot[D]], first: int, rows: int) -> dict[str, np.ndarray]:
    """The guidance inputs of a call over rows first..first+rows-1: each row's unconditional
    row within the call (itself for a row that is not a guided span's first, whose logits the
    engine then leaves as they are) and its scale."""
    uncond = np.arange(rows, dtype=np.int64)
    scale = np.ones(rows, np.float32)
    for s in slots:
        if s.guidance is not None and first <= s.row < first + rows:
            uncond[s.row - first] = s.row - first + 1
            scale[s.row - first] = s.guidance
    return {"guidance_rows": uncond, "guidance_scale": scale}


def span_logits(step: StepLogits, slots: Sequence[Slot[D]], first: int, on_host: bool) -> StepLogits:
    """A call's logits (its rows start at ``first``) as one row per slot: a slot's first row's,
    or with ``on_host`` a guided span's ``guide`` of its two rows' full logits, with a top-K of
    its own where the engine gives one (so the other rows keep drawing from theirs)."""
    lead = np.array([s.row - first for s in slots], np.int64)
    guided = [j for j, s in enumerate(slots) if s.guidance is not None] if on_host else []
    if not guided:
        same = len(lead) == step.rows and bool((lead == np.arange(step.rows)).all())
        return step if same else rows_of(step, lead)
    cond = lead[guided]
    both = np.asarray(step.full(np.concatenate([cond, cond + 1])), np.float32)
    n = len(guided)
    combined = {j: guide(both[i], both[n + i], slots[j].guidance or 0.0)
                for i, j in enumerate(guided)}  # fmt: skip
    vocab = both.shape[1]

    def full(r: np.ndarray) -> np.ndarray:
        r = np.asarray(r, np.int64)
        out = np.empty((len(r), vocab), np.float32)
        own = [i for i, j in enumerate(r.tolist()) if j not in combined]
        if own:
            out[own] = step.full(lead[r[own]])
        for i, j in enumerate(r.tolist()):
            if j in combined:
                out[i] = combined[j]
        return out

    values, indices = step.topk_values, step.topk_indices
    if values is None or indices is None:
        return StepLogits(len(slots), full)
    values = np.asarray(values, np.float32)[lead]
    indices = np.asarray(indices, np.int64)[lead]
    k = values.shape[1]
    for j, row in combined.items():  # its own top-K: every token outside is at most its k-th
        top = np.argpartition(-row, k - 1)[:k]
        top = top[np.lexsort((top, -row[top]))]
        values[j], indices[j] = row[top], top
    return StepLogits(len(slots), full, values, indices)
