"""The talker under the in-flight scheduler: each request holds a talker cache row, its own
talker and code predictor settings and its own generator; it starts in a free row when its
thinker is done with it (or, streamed, once its reply's first token is fed) and leaves the batch
the step it finishes.

A step completes each row's frame through the code predictor (its per-frame sub-stage: the rows
that step, with equal residual settings, in one call per group) and feeds the talker the frame's
summed embedding plus the row's next text row; a row whose next reply token the thinker has not
fed yet sits the step out. The codes, row for row, are the cohort path's (``Talker.run``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeomni.runtime.decoder import TOPK_OUTPUTS, DecoderSession, right_pad, text_positions
from edgeomni.runtime.events import CodecFrames, Event, Finished
from edgeomni.runtime.runners import RequestError, RequestState
from edgeomni.runtime.runners.llm_slots import rows_of
from edgeomni.runtime.sampling import SamplingParams, StepLogits, sample_rows

__all__ = ["TalkerSlots"]


@dataclass
class TalkerSlot:
    """One request speaking in one talker cache row."""

    state: RequestState
    row: int
    prefill: Any  # talker._Prefill
    talker: SamplingParams  # the first code's settings
    residual: SamplingParams  # the code predictor's
    max_frames: int
    min_frames: int
    rng: np.random.Generator  # both the first and the residual codes draw from it
    past: int
    seen: np.ndarray  # every first code drawn, end of speech too (the first ``count``)
    count: int = 0
    # [H] the talker's latest state, the next frame's input, as a host array; None: it is row
    # ``row`` of the last decode step's output, where the engine left it (on a GPU, the device)
    hidden: np.ndarray | None = None
    frames: np.ndarray | None = None  # completed frames [max_frames, G], the first ``made``
    made: int = 0
    finish: str | None = None
    steps: int = 0
    sent: int = 0  # frames its events gave
    talker_s: float = 0.0
    talker_engine_s: float = 0.0
    cp_s: float = 0.0
    cp_engine_s: float = 0.0
    host_frames: int = 0
    full_rows: int = 0
    widest: int = 1


class TalkerSlots:
    consumes = False  # it reads the thinker's handoff (accept_hidden), not its events

    def __init__(self, talker: Any, *, stream: bool = False) -> None:
        self.t = talker
        self.stage_id: str = talker.stage.id
        self.max_batch: int = talker.max_batch
        self.stream = stream
        self._last: Any = None  # the last decode step's outputs (decoder.StepOutputs)
        self._outputs = {"logits": (talker.vocab_size,), "last_hidden": (talker.hidden_size,)}
        self._decode: dict[int, DecoderSession] = {}
        self._cp: dict[int, DecoderSession] = {}

    def _decode_session(self, rows: int) -> DecoderSession:
        if rows not in self._decode:
            self._decode[rows] = DecoderSession(self.t.engine, self.t.kv, rows, self._outputs)
        return self._decode[rows]

    def _cp_session(self, rows: int) -> DecoderSession:
        if rows not in self._cp:  # its cache lives for one frame: any rows will do
            self._cp[rows] = self.t.cp.session(rows)
        return self._cp[rows]

    # -- the scheduler's calls ---------------------------------------------------------------
    def ready(self, state: RequestState, upstream_done: bool) -> bool:
        return self.t.slot_ready(state, upstream_done, self.stream)

    def consume(self, slot: TalkerSlot, event: Event) -> None:
        raise TypeError(f"{self.stage_id} takes no events")

    def discard(self, slot: TalkerSlot) -> None:
        """A request that failed elsewhere: its row is simply free again."""

    def admit(self, entries: Sequence[tuple[RequestState, int]]) -> list[TalkerSlot]:
        """Prefill these requests into their rows (each contiguous run of rows one call) and draw
        each one's first code. A request whose prompt the talker cannot speak is left out, its
        error set."""
        t = self.t
        plans, rows = [], []
        for state, row in sorted(entries, key=lambda e: e[1]):
            try:
                plans.append(t._plan(state, None))
            except RequestError as e:
                state.error = f"{self.stage_id}: {e}"
                continue
            rows.append(row)
        if not plans:
            return []
        prefills = t._prefills(plans)  # every request's projections in one call
        slots = []
        for plan, prefill, row in zip(plans, prefills, rows, strict=True):
            talker, residual, max_frames, min_frames = t._sampling(plan.state.request)
            max_frames = min(max_frames, t.capacity - len(prefill.embeds))
            slots.append(TalkerSlot(
                plan.state, row, prefill, talker, residual, max_frames, min_frames,
                np.random.default_rng(talker.seed), past=len(prefill.embeds),
                seen=np.zeros(max(max_frames, 1), np.int64),
            ))  # fmt: skip
        lo = 0
        for hi in range(1, len(slots) + 1):
            if hi == len(slots) or slots[hi].row != slots[hi - 1].row + 1:
                self._prefill(slots[lo:hi])
                lo = hi
        return slots

    def _prefill(self, run: Sequence[TalkerSlot]) -> None:
        t = self.t
        n = len(run)
        lens = np.array([len(s.prefill.embeds) for s in run], np.int32)
        embeds = right_pad([s.prefill.embeds for s in run])
        zeros = np.zeros(n, np.int32)
        positions = text_positions(zeros, embeds.shape[1], t.mrope)
        for j, s in enumerate(run):
            if s.prefill.positions is not None:
                positions[:, j, : lens[j]] = s.prefill.positions
        session = DecoderSession(t.engine, t.kv, n, self._outputs, first_row=run[0].row)
        start = time.perf_counter()
        out = session.run(embeds, positions, zeros, lens, lens - 1)
        out.fetch("last_hidden", *TOPK_OUTPUTS)
        self._draw(run, out.logits())
        for j, s in enumerate(run):  # the session is this call's alone: its states to the host
            s.hidden = np.array(out["last_hidden"][j], np.float32)
        elapsed = time.perf_counter() - start
        for s in run:
            s.talker_s += elapsed
            s.talker_engine_s += session.engine_seconds

    def _draw(self, slots: Sequence[TalkerSlot], step: StepLogits) -> None:
        """Each slot's next first code, from its settings, its codes so far (the repetition
        penalty) and its generator."""
        t = self.t
        seen = [s.seen[: s.count] for s in slots]
        banned = [t._suppressed_and_eos if s.count < s.min_frames else t.suppressed
                  for s in slots]  # fmt: skip
        codes, fetched = sample_rows(step, [s.talker for s in slots], [s.rng for s in slots],
                                     seen, banned)  # fmt: skip
        for j, s in enumerate(slots):
            s.seen[s.count] = codes[j]
            s.count += 1
            s.full_rows += fetched

    def _hidden(self, slot: TalkerSlot) -> np.ndarray:
        """A slot's latest talker state on the host."""
        if slot.hidden is None:
            slot.hidden = np.array(self._last["last_hidden"][slot.row], np.float32)
        return slot.hidden

    def step(self, slots: Mapping[int, TalkerSlot]) -> None:
        """Complete each ready row's frame and feed it back: the code predictor over the ready
        rows, then one talker call over rows [0, highest active] (a row that sits out has query
        length 0, its cache untouched), then each ready row's next first code."""
        t = self.t
        rows = sorted(r for r, s in slots.items() if s.prefill.can_step(s.steps))
        if not rows:
            return
        ready = [slots[r] for r in rows]
        start = time.perf_counter()
        codes = np.empty((len(rows), t.groups), np.int64)
        frame_embed = np.empty((len(rows), t.hidden_size), np.float32)
        first = ready[0].residual  # mostly one setting: equal objects compare fast
        if all(s.residual is first or s.residual == first for s in ready):
            groups: dict[SamplingParams, list[int]] = {first: list(range(len(ready)))}
        else:
            groups = {}
            for j, s in enumerate(ready):
                groups.setdefault(s.residual, []).append(j)
        # every row steps and reads the last decode step's states in place: the code predictor
        # takes that output buffer as it is (on a GPU it never leaves the device)
        in_place = (len(groups) == 1 and self._last is not None and len(rows) == self._last.rows
                    and rows[-1] == len(rows) - 1 and all(s.hidden is None for s in ready))  # fmt: skip
        cp_s = 0.0
        for params, js in groups.items():  # one code predictor call per residual setting
            part = [ready[j] for j in js]
            session = self._cp_session(len(part))
            code0 = np.array([s.seen[s.count - 1] for s in part], np.int64)
            hidden = (self._last.buffer("last_hidden") if in_place
                      else np.stack([self._hidden(s) for s in part]))  # fmt: skip
            t0, e0 = time.perf_counter(), session.engine_seconds
            got, embed, redrawn = t.cp.frame(
                session, hidden, code0, t.codec_embedding[code0],
                np.ones(len(part), bool), params, [s.rng for s in part],
            )  # fmt: skip
            spent, engine = time.perf_counter() - t0, session.engine_seconds - e0
            cp_s += spent
            codes[js], frame_embed[js] = got, embed
            for s in part:
                s.cp_s += spent
                s.cp_engine_s += engine
                s.host_frames += int(redrawn)
        text = t._text_rows([s.prefill for s in ready], [s.steps for s in ready],
                            np.ones(len(ready), bool), None)  # fmt: skip
        hi = max(slots) + 1
        embeds = np.zeros((hi, 1, t.hidden_size), np.float32)
        embeds[rows, 0] = frame_embed + text
        past = np.zeros(hi, np.int32)
        deltas = np.zeros(hi, np.int32)
        for row, s in slots.items():
            past[row], deltas[row] = s.past, s.prefill.delta
        query = np.zeros(hi, np.int32)
        query[rows] = 1
        stepping = set(rows)
        for s in slots.values():  # rows sitting out keep their state: the call overwrites it
            if s.hidden is None and s.row not in stepping:
                self._hidden(s)
        session = self._decode_session(hi)
        engine = session.engine_seconds
        out = session.run(embeds, text_positions(past + deltas, 1, t.mrope), past, query,
                          np.zeros(hi, np.int64))  # fmt: skip
        out.fetch(*TOPK_OUTPUTS)
        logits = out.logits()
        self._draw(ready, rows_of(logits, np.array(rows, np.int64)) if len(rows) != hi else logits)
        self._last = out
        for s in ready:
            s.hidden = None  # in this call's output, read when needed
        talker_s = time.perf_counter() - start - cp_s
        engine = session.engine_seconds - engine
        for j, s in enumerate(ready):
            if s.frames is None:
                s.frames = np.empty((max(s.max_frames, 1), t.groups), np.int64)
            s.frames[s.made] = codes[j]
            s.made += 1
            s.past += 1
            s.steps += 1
            s.talker_s += talker_s
            s.talker_engine_s += engine
            s.widest = max(s.widest, len(slots))

    def update(self, slot: TalkerSlot, events: bool) -> list[Event]:
        """After the slot's newest first code: finished at the end of speech or its frame
        limit; when ``events``, its new frames, then Finished."""
        last = slot.seen[slot.count - 1]
        if last == self.t.ids["codec_eos"]:
            slot.finish = "eos"
        elif slot.count >= slot.max_frames:
            slot.finish = "length"
        if not events:
            return []
        out: list[Event] = []
        # an utterance of no frames still gives one (empty) event: its codes are empty, not absent
        if slot.made > slot.sent or (slot.finish is not None and not slot.made):
            new = (
                slot.frames[slot.sent : slot.made].copy()
                if slot.frames is not None
                else np.zeros((0, self.t.groups), np.int64)
            )
            out.append(CodecFrames(slot.state.index, self.stage_id, new))
            slot.sent = slot.made
        if slot.finish is not None:
            out.append(Finished(slot.state.index, self.stage_id, slot.finish))
        return out

    def move(self, slot: TalkerSlot, row: int) -> None:
        self._hidden(slot)  # its state to the host first: it was found by its row
        self.t.kv.move_row(slot.row, row, slot.past)
        slot.row = row

    def retire(self, slot: TalkerSlot) -> None:
        """A finished request's codes and report, as the cohort path writes them."""
        t, state = self.t, slot.state
        codes = (
            np.zeros((0, t.groups), np.int64)
            if slot.frames is None
            else slot.frames[: slot.made].copy()
        )
        state.outputs[f"{self.stage_id}:codes"] = codes
        state.details[self.stage_id] = {
            "frames": len(codes),
            "finish_reason": slot.finish,
            "voice": t.voice_of(state),
            "talker_ms": round(slot.talker_s * 1e3, 3),
            "code_predictor_ms": round(slot.cp_s * 1e3, 3),
            "talker_engine_ms": round(slot.talker_engine_s * 1e3, 3),
            "code_predictor_engine_ms": round(slot.cp_engine_s * 1e3, 3),
            "code_predictor_draws": "engine" if t.cp.draws_in_engine(slot.residual) else "host",
            "code_predictor_host_frames": slot.host_frames,
            "cohort_size": slot.widest,
            "full_logit_rows": slot.full_rows,
            "batching": "inflight",
        }
