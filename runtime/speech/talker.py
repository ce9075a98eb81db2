"""The talker both speech families run (``SpeechTalker``), the decoder stage's spec for speech
(runtime/decoder_stage.py): the talker engine gives each frame's first code, the code
predictor (a per-step sub-stage) its residual codes, and the frame's summed embedding plus the
next text row is the talker's next input. A family subclasses it: its prefill and text rows
(``_plan``, ``_prefills``, ``_text_rows``), its sampling defaults (``sampling_defaults``,
``follows_talker``), when a request may start (``ready``), and ``setup`` for its own tables.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime import safetensors_np
from edgeomni.runtime.decoder import StepOutputs, right_pad, text_positions
from edgeomni.runtime.decoder_stage import DecoderStage, Slot
from edgeomni.runtime.engine import DEFAULT_ENGINES, Engines
from edgeomni.runtime.events import CodecFrames, Event
from edgeomni.runtime.requests import SPEECH_STAGE_KEYS
from edgeomni.runtime.row_state import RowState
from edgeomni.runtime.sampling import SamplingParams, draw_marks
from edgeomni.runtime.speech.code_predictor import CodePredictor, QueuedFrame
from edgeomni.runtime.stage import RequestError, RequestState, StageRunner

__all__ = ["GREEDY", "SpeechTalker"]

GREEDY = SamplingParams(temperature=0.0, top_k=1, top_p=1.0)


@dataclass
class _Speech:
    """A talker slot's own: its prefill (the family's: ``can_step``, ``embeds``, ``positions``,
    ``delta``), its code predictor's settings, its frames so far."""

    prefill: Any
    residual: SamplingParams  # the code predictor's settings
    max_frames: int
    min_frames: int
    # [H] the talker's latest state, the next frame's input, as a host array; None: it is row
    # ``row`` of the last decode step's output, where the engine left it (on a GPU, the device)
    hidden: np.ndarray | None = None
    frames: np.ndarray | None = None  # completed frames [max_frames, G], the first ``made``
    made: int = 0
    sent: int = 0  # frames its events gave
    cp_s: float = 0.0  # its code predictor calls'
    cp_engine_s: float = 0.0
    cp_steps_s: float = 0.0  # every code predictor call of the steps it took part in
    host_frames: int = 0
    device_sums: int = 0  # frames summed where the code predictor drew them (queue_frame)
    device_draws: int = 0  # first codes drawn on the device (SpeechTalker.draw)


class _Drawing:
    """SpeechTalker.draw's first codes, queued on the device: ``tokens`` waits for them
    (the frame queued behind them runs on) and hands the next step its frame; ``cancel`` drops
    both, every generator put back to its state before the draw."""

    def __init__(self, owner: SpeechTalker, ready: list[Slot], rngs: list[Any],
                 before: list[Any], reader: Any, ahead: _Ahead | None) -> None:  # fmt: skip
        self._owner, self._ready, self._rngs, self._before = owner, ready, rngs, before
        self._reader, self._ahead = reader, ahead

    def tokens(self) -> np.ndarray | None:
        """The drawn first codes; None (cancelled) where the top K could not decide a row:
        the host then draws the step from the same numbers."""
        code0 = self._reader.wait()
        if (code0 < 0).any():
            self.cancel()
            return None
        if self._ahead is not None:
            self._ahead.frame.first(code0, self._owner.codec_embedding[code0])
            self._owner._ahead = self._ahead
        for s in self._ready:
            s.data.device_draws += 1
        return code0

    def cancel(self) -> None:
        for r, state in zip(self._rngs, self._before, strict=True):
            r.bit_generator.state = state
        self._ahead = None


@dataclass
class _Ahead:
    """The next step's frame, queued on the device behind this step's first-code draws
    (SpeechTalker.draw): the slots of its rows in order, and the time it took to queue."""

    frame: QueuedFrame
    slots: list[Slot]
    spent: float


class SpeechTalker(StageRunner):
    """The talker the speech families share, the decoder stage's spec for speech
    (runtime/decoder_stage.py): the talker engine gives each frame's first code, the code
    predictor (a per-step sub-stage) its residual codes, and the frame's summed embedding plus
    the next text row is the talker's next input. A family's subclass builds the prefill and
    text rows (``_plan``, ``_prefills``, ``_text_rows``), reads its settings (``_sampling``)
    and says when a request can start (``ready``); ``setup`` reads its own tables."""

    kind = "autoregressive"
    # the family's stage keys besides; the request's seed seeds it when the talker's is not given
    reads = frozenset((*SPEECH_STAGE_KEYS, "seed", "sampling_seed"))
    mrope = True  # the talker engine takes 3-axis positions; False: 1-D
    consumes = False
    per_position: tuple[str, ...] = ()
    prefill_fetch = ("last_hidden",)  # the first frame's input, read with the top-K

    def __init__(self, stage: Any, folder: Path, *, engines: Engines = DEFAULT_ENGINES) -> None:
        """``engines``' ``spin`` is not taken: the talker's engine and its code predictor's take
        turns every frame, so neither spins waiting for its next call."""
        self.open_stage(stage, folder, engines, spin=False)
        self.stage_id: str = stage.id
        cfg = self.config
        self.codec_embedding = safetensors_np.load(folder / "embedding.safetensors")["embedding"]
        self.groups = int(cfg["num_code_groups"])
        self.ids: dict[str, int] = cfg["ids"]
        self.vocab_size = int(cfg["vocab_size"])
        self.hidden_size = int(cfg["hidden_size"])
        self.outputs = {"logits": (self.vocab_size,), "last_hidden": (self.hidden_size,)}
        limits = cfg["builder_config"]
        self.max_batch = int(limits["max_batch_size"])
        self.capacity = int(limits["max_kv_cache_capacity"])
        self.state = RowState.for_engine(cfg, self.max_batch, self.engine, self.capacity,
                                         folder / "config.json")
        self.cp = CodePredictor(
            (folder / cfg["code_predictor"]).resolve(), groups=self.groups,
            max_batch=self.max_batch, engines=engines,
        )  # fmt: skip
        self._cp_sessions: dict[int, Any] = {}
        # a frame queued on the device by ``inputs`` (its rows, when), read by ``confirm``
        self._queued: tuple[Any, list[Slot], float] | None = None
        # the next step's frame, queued by ``draw`` behind the first codes it drew
        self._ahead: _Ahead | None = None
        # ``draw``'s device buffers a cohort size (uniforms, marks, drawn codes, their reader)
        # and the codec embedding table there (float32)
        self._draws: dict[int, tuple[Any, Any, Any, Any]] = {}
        self._table: Any = None
        # the talker may not emit the codec's control band, except the end of speech (a GPU
        # build's engine keeps the same band out of its top-K)
        band = np.arange(max(0, self.vocab_size - 1024), self.vocab_size)
        self.suppressed = band[band != self.ids["codec_eos"]]
        self._suppressed_and_eos = np.append(self.suppressed, self.ids["codec_eos"])
        self.stream = False  # a request may start before its upstream is done (slot_stage)
        self.setup(folder, cfg)

    def setup(self, folder: Path, cfg: dict[str, Any]) -> None:
        """The family's own tables and settings, read once the engines are open."""

    # True: the residual codes are greedy when the talker is and no code predictor key says
    # otherwise; False: they follow their own settings only
    follows_talker = False
    # the family's stage-key prefixes (its declaration's ``stage_prefixes``): the talker's
    # first, then the code predictor's in order of precedence
    prefixes: tuple[str, ...] = ()

    def sampling_defaults(self) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        """The family's settings under the keys' names without their prefix: the talker's
        (do_sample, temperature, top_k, top_p, repetition_penalty, max_new_tokens,
        min_new_tokens) and the code predictor's (dosample, temperature, top_k, top_p)."""
        raise NotImplementedError

    def _sampling(self, request: Any) -> tuple[SamplingParams, SamplingParams, int, int]:
        """The talker's keys for the first code, the code predictor's for the residual codes,
        each over ``sampling_defaults``; its max and min frames. A do_sample (dosample) false,
        a temperature 0 or a top-k 1 is greedy."""
        given = request.stage_settings
        (own, *residuals), (first_defaults, rest_defaults) = self.prefixes, self.sampling_defaults()

        def talker(key: str) -> Any:
            return given.get(own + key, first_defaults[key])

        def residual(key: str) -> Any:
            return next((given[p + key] for p in residuals if p + key in given), rest_defaults[key])

        first = SamplingParams(
            temperature=float(talker("temperature")) if talker("do_sample") else 0.0,
            top_k=int(talker("top_k")),
            top_p=float(talker("top_p")),
            repetition_penalty=float(talker("repetition_penalty")),
            seed=given.get(own + "seed", given.get(own + "sampling_seed", request.sampling.seed)),
        )
        cp_given = any(k.startswith(tuple(residuals)) for k in given)
        if not residual("dosample") or (self.follows_talker and first.greedy and not cp_given):
            rest = GREEDY
        else:
            rest = SamplingParams(temperature=float(residual("temperature")),
                                  top_k=int(residual("top_k")), top_p=float(residual("top_p")))
        return first, rest, int(talker("max_new_tokens")), int(talker("min_new_tokens"))

    def voice_of(self, state: RequestState) -> Any:
        """What a request's report says it spoke with."""
        return state.prepared[self.stage.id]

    def slot_stage(self, *, stream_upstream: bool = False) -> DecoderStage:
        """This stage for the scheduler loop; ``stream_upstream``: a request may start before
        its upstream stage is done with it (Qwen3-Omni's: at its reply's first token)."""
        self.stream = stream_upstream
        return DecoderStage(self)

    # -- the decoder stage's spec (runtime/decoder_stage.py) ---------------------------------
    def ready(self, state: RequestState, upstream_done: bool, events: Sequence[Event]) -> bool:
        return upstream_done

    def consume(self, slot: Slot, event: Event) -> None:
        raise TypeError(f"{self.stage_id} takes no events")

    def open(self, entries: Sequence[tuple[RequestState, int, Sequence[Event]]]) -> list[Slot]:
        """Slots for these requests; one whose prompt the talker cannot speak is left out, its
        error set. Every request's projections run in one call (``_prefills``)."""
        plans, rows = [], []
        for state, row, events in entries:
            try:
                plans.append(self._plan(state, events))
            except RequestError as e:
                state.error = f"{self.stage_id}: {e}"
                continue
            rows.append(row)
        slots = []
        for plan, prefill, row in zip(plans, self._prefills(plans), rows, strict=True):
            talker, residual, max_frames, min_frames = self._sampling(plan.state.request)
            max_frames = min(max_frames, self.capacity - len(prefill.embeds))
            slots.append(Slot(
                plan.state, row, _Speech(prefill, residual, max_frames, min_frames), talker,
                np.random.default_rng(talker.seed), len(prefill.embeds), delta=prefill.delta,
                history=np.zeros(max(max_frames, 1), np.int64),  # every first code drawn
            ))  # fmt: skip
        return slots

    def prefill(self, run: Sequence[Slot]) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        embeds = right_pad([s.data.prefill.embeds for s in run])
        positions = text_positions(np.zeros(len(run), np.int32), embeds.shape[1], self.mrope)
        for j, s in enumerate(run):
            if s.data.prefill.positions is not None:
                positions[:, j, : s.length] = s.data.prefill.positions
        return embeds, positions, {}

    def prefilled(self, run: Sequence[Slot], out: StepOutputs) -> None:
        for j, s in enumerate(run):  # the session is this call's alone: its states to the host
            s.data.hidden = np.array(out["last_hidden"][j], np.float32)

    def can_step(self, slot: Slot) -> bool:
        return slot.data.prefill.can_step(slot.steps)

    def _hidden(self, slot: Slot, last: Any) -> np.ndarray:
        """A slot's latest talker state on the host."""
        if slot.data.hidden is None:
            slot.data.hidden = np.array(last["last_hidden"][slot.row], np.float32)
        return slot.data.hidden

    def _cp_session(self, rows: int) -> Any:
        if rows not in self._cp_sessions:  # its cache lives for one frame: any rows will do
            self._cp_sessions[rows] = self.cp.session(rows)
        return self._cp_sessions[rows]

    def inputs(self, ready: Sequence[Slot], slots: Mapping[int, Slot], last: Any) -> Any:
        """Complete each ready row's frame (the code predictor over the ready rows, one call
        per residual setting) and return its summed embedding plus the row's next text row.
        Where every row steps in place and the code predictor sums frames on its device, that
        is a device buffer the frame's graph writes, nothing waited for: ``confirm`` reads the
        codes once the talker's call is queued behind it."""
        self._queued = None  # one a step: an earlier step's, had it failed, is not this one's
        ahead, self._ahead = self._ahead, None
        if ahead is not None:  # queued by the last step's ``draw`` for these rows?
            pairs = enumerate(zip(ahead.slots, ready, strict=False))
            if (len(ahead.slots) == len(ready) == len(slots) and last is not None
                    and last.rows == len(ready)
                    and all(a is s and s.row == j and s.data.hidden is None
                            for j, (a, s) in pairs)):  # fmt: skip
                self._queued = (ahead.frame, list(ready), ahead.spent)
                return ahead.frame.embeds
            ahead.frame.put_back()  # not used: its numbers are this step's frame's again
        codes = np.empty((len(ready), self.groups), np.int64)
        frame_embed = np.empty((len(ready), self.hidden_size), np.float32)
        first = ready[0].data.residual  # mostly one setting: equal objects compare fast
        if all(s.data.residual is first or s.data.residual == first for s in ready):
            groups: dict[SamplingParams, list[int]] = {first: list(range(len(ready)))}
        else:
            groups = {}
            for j, s in enumerate(ready):
                groups.setdefault(s.data.residual, []).append(j)
        # every row steps and reads the last decode step's states in place: the code predictor
        # takes that output buffer as it is (on a GPU it never leaves the device)
        in_place = (len(groups) == 1 and last is not None and len(ready) == last.rows
                    and ready[-1].row == len(ready) - 1
                    and all(s.data.hidden is None for s in ready))  # fmt: skip
        text = self._text_rows([s.data.prefill for s in ready], [s.steps for s in ready],
                               np.ones(len(ready), bool))  # fmt: skip
        if in_place and len(slots) == len(ready) and self.cp.sums_frames:
            session = self._cp_session(len(ready))
            code0 = np.array([s.generated[-1] for s in ready], np.int64)
            t0 = time.perf_counter()
            queued = self.cp.queue_frame(
                session, last.buffer("last_hidden"), code0, self.codec_embedding[code0],
                np.asarray(text, np.float32), first, [s.rng for s in ready],
                self.engine.input_types.get("inputs_embeds", np.dtype(np.float32)),
            )  # fmt: skip
            if queued is not None:  # the time to queue it (its GPU time is the talker's wait)
                self._queued = (queued, list(ready), time.perf_counter() - t0)
                return queued.embeds
        cp_s = 0.0
        for params, js in groups.items():  # one code predictor call per residual setting
            part = [ready[j] for j in js]
            session = self._cp_session(len(part))
            code0 = np.array([s.generated[-1] for s in part], np.int64)
            hidden = (last.buffer("last_hidden") if in_place
                      else np.stack([self._hidden(s, last) for s in part]))  # fmt: skip
            t0, e0 = time.perf_counter(), session.engine_seconds
            got, embed, redrawn = self.cp.frame(session, hidden, code0,
                                                self.codec_embedding[code0], params,
                                                [s.rng for s in part])  # fmt: skip
            spent, engine = time.perf_counter() - t0, session.engine_seconds - e0
            cp_s += spent
            codes[js], frame_embed[js] = got, embed
            for s in part:
                s.data.cp_s += spent
                s.data.cp_engine_s += engine
                s.data.host_frames += int(redrawn)
        stepping = {s.row for s in ready}
        for s in slots.values():  # rows sitting out keep their state: the call overwrites it
            if s.data.hidden is None and s.row not in stepping:
                self._hidden(s, last)
        self._record(ready, codes, cp_s)
        return frame_embed + text

    def confirm(self, ready: Sequence[Slot]) -> np.ndarray | None:
        """After the talker's call on ``inputs``' device buffer was queued: the frame's codes
        (the host waits here, once a frame), and the host's inputs for the call to run again
        where the host had to redraw a frame the engine could not decide; else None."""
        if self._queued is None:
            return None
        queued, rows, spent = self._queued
        self._queued = None
        if [s.row for s in rows] != [s.row for s in ready]:
            raise RuntimeError("a queued frame's rows are not the step's")
        start = time.perf_counter()
        codes, redo = queued.codes()
        if redo is not None:  # the host's frame is the code predictor's time too
            spent += time.perf_counter() - start
        for s in ready:
            s.data.cp_s += spent
            s.data.host_frames += int(redo is not None)
            s.data.device_sums += int(redo is None)
        self._record(ready, codes, spent)
        return redo

    def draw(self, ready: Sequence[Slot], slots: Mapping[int, Slot], out: Any) -> _Drawing | None:
        """Each ready row's first code drawn on the device from the step's top K where the
        whole step allows (``_draws_on_device``), queued right behind the step, before the host
        waits for anything: the draw, then the next step's frame (its first codes' embeddings
        are the draw's, its numbers drawn now in the host's order). Every host input of both
        goes up first, so on the device nothing of the host's sits between the step, the draw
        and the frame; the host reads the codes later (``_Drawing.tokens``), while the frame
        runs. None where the step does not allow it: the host draws (DecoderStage._draw)."""
        params = ready[0].sampling
        if not self._draws_on_device(ready, slots, out, params):
            return None
        n, memory = len(ready), self.engine.buffers
        rngs = [s.rng for s in ready]
        before = [r.bit_generator.state for r in rngs]
        start = time.perf_counter()
        uniform = np.zeros(n) if params.greedy else np.array([r.random() for r in rngs])
        seen = None
        if params.repetition_penalty != 1.0:
            seen = [s.history[: s.prefix + len(s.generated)] for s in ready]  # type: ignore[index]
        marks = draw_marks(self.vocab_size, seen, [self.banned(s) for s in ready])
        uniform_in, marks_in, drawn, reader = self._draw_buffers(n)
        memory.upload(uniform_in, uniform)
        memory.upload(marks_in, marks)
        dtype = self.engine.input_types.get("inputs_embeds", np.dtype(np.float32))
        first, base = self.cp.first_inputs(n, dtype)
        greedy = params.greedy  # as the code predictor's sampler takes greedy
        topk = (out.buffer("topk_values"), out.buffer("topk_indices"))
        settings = {"penalty": params.repetition_penalty,
                    "temperature": 1.0 if greedy else params.temperature,
                    "top_k": 1 if greedy else params.top_k,
                    "top_p": 1.0 if greedy else params.top_p}

        def launch() -> None:  # the draw, then its codes' copy to the host behind it (queue_frame
            # calls it right before the frame's graph where it returns a frame)
            self.engine.draw_first(*topk, marks_in, uniform_in, self._table, drawn, base, first,
                                   **settings)  # fmt: skip
            reader.queue(drawn)

        frame = None
        if all(s.data.prefill.can_step(s.steps + 1) for s in ready):
            text = self._text_rows([s.data.prefill for s in ready], [s.steps + 1 for s in ready],
                                   np.ones(n, bool))  # fmt: skip
            frame = self.cp.queue_frame(self._cp_session(n), out.buffer("last_hidden"), None,
                                        None, np.asarray(text, np.float32),
                                        ready[0].data.residual, rngs, dtype, launch)  # fmt: skip
        if frame is None:  # no frame ahead (a row cannot step next): the draw alone
            launch()
            return _Drawing(self, list(ready), rngs, before, reader, None)
        ahead = _Ahead(frame, list(ready), time.perf_counter() - start)
        return _Drawing(self, list(ready), rngs, before, reader, ahead)

    def _draws_on_device(
        self, ready: Sequence[Slot], slots: Mapping[int, Slot], out: Any, params: SamplingParams
    ) -> bool:
        """Whether ``draw`` can: the engine draws first codes and its code predictor sums
        frames on the device, every row steps in place (rows 0 to n-1, no spans) with one
        setting the top K holds, one residual setting the code predictor draws, and no bias
        or log-probabilities asked."""
        if not (self.engine.draws_first and self.cp.sums_frames and "topk_indices" in out):
            return False
        n = len(ready)
        width = int(out.buffer("topk_indices").shape[-1])
        residual = ready[0].data.residual
        return (n == len(slots) == out.rows
                and (params.greedy or 0 < params.top_k < width)
                and self.cp.draws_in_engine(residual)
                and all(s.row == j and s.rows == 1 and s.sampling == params
                        and s.data.residual == residual and s.bias is None
                        and not s.top_logprobs and s.history is not None
                        for j, s in enumerate(ready)))  # fmt: skip

    def _draw_buffers(self, n: int) -> tuple[Any, Any, Any, Any]:
        """``draw``'s buffers for ``n`` rows, made once a cohort size (the codec embedding
        table too, once)."""
        got = self._draws.get(n)
        if got is None:
            memory = self.engine.buffers
            if self._table is None:
                self._table = memory.zeros(self.codec_embedding.shape, np.float32)
                memory.upload(self._table, np.ascontiguousarray(self.codec_embedding, np.float32))
            got = self._draws[n] = (memory.zeros((n,), np.float64),
                                    memory.zeros((n, self.vocab_size), np.uint8),
                                    memory.zeros((n,), np.int64), memory.reader((n,), np.int64))
        return got

    def _record(self, ready: Sequence[Slot], codes: np.ndarray, cp_s: float) -> None:
        """The ready rows' completed frames."""
        for j, s in enumerate(ready):
            speech = s.data
            if speech.frames is None:
                speech.frames = np.empty((max(speech.max_frames, 1), self.groups), np.int64)
            speech.frames[speech.made] = codes[j]
            speech.made += 1
            speech.cp_steps_s += cp_s

    def decode_feeds(self, rows: int) -> dict[str, Any]:
        return {}

    def stepped(self, ready: Sequence[Slot]) -> None:
        for s in ready:
            s.data.hidden = None  # in this call's output, read when needed

    def banned(self, slot: Slot) -> np.ndarray:
        """The codec's control band; the end of speech too before min_new_tokens."""
        if len(slot.generated) < slot.data.min_frames:
            return self._suppressed_and_eos
        return self.suppressed

    def finished(self, slot: Slot) -> str | None:
        """At the end of speech, or its frame limit."""
        if slot.generated[-1] == self.ids["codec_eos"]:
            return "eos"
        return "length" if len(slot.generated) >= slot.data.max_frames else None

    def events(self, slot: Slot) -> list[Event]:
        """Its new frames (an utterance of no frames still gives one empty event: its codes
        are empty, not absent)."""
        speech = slot.data
        if not (speech.made > speech.sent or (slot.finish is not None and not speech.made)):
            return []
        new = (speech.frames[speech.sent : speech.made].copy() if speech.frames is not None
               else np.zeros((0, self.groups), np.int64))  # fmt: skip
        speech.sent = speech.made
        return [CodecFrames(slot.state.index, self.stage_id, new)]

    def move(self, slot: Slot, last: Any) -> None:
        self._hidden(slot, last)  # its state to the host first: it was found by its row

    def retire(self, slot: Slot) -> None:
        """A finished request's codes and report."""
        state, speech = slot.state, slot.data
        codes = (np.zeros((0, self.groups), np.int64) if speech.frames is None
                 else speech.frames[: speech.made].copy())  # fmt: skip
        state.outputs[f"{self.stage_id}:codes"] = codes
        talker_s = slot.prefill_s + slot.decode_s - speech.cp_steps_s
        state.details[self.stage_id] = {
            "frames": len(codes),
            "prompt_tokens": slot.length,
            "cached_tokens": slot.cached,
            "finish_reason": slot.finish,
            "voice": self.voice_of(state),
            "talker_ms": round(talker_s * 1e3, 3),
            "prefill_ms": round(slot.prefill_s * 1e3, 3),
            # a frame summed on the device: the time to queue it (the talker's step waits for
            # its GPU time)
            "code_predictor_ms": round(speech.cp_s * 1e3, 3),
            "talker_engine_ms": round((slot.prefill_engine_s + slot.decode_engine_s) * 1e3, 3),
            # drawing in the engine, calls are queued, not waited for: then this is the time to
            # queue them, and the GPU's time is in code_predictor_ms
            "code_predictor_engine_ms": round(speech.cp_engine_s * 1e3, 3),
            "code_predictor_draws": "engine" if self.cp.draws_in_engine(speech.residual)
            else "host",
            "code_predictor_host_frames": speech.host_frames,
            # frames whose embedding sum the talker's next step read where it was made
            "frames_summed_on_device": speech.device_sums,
            # steps whose first code the device drew, the next frame queued behind it (draw)
            "first_codes_drawn_on_device": speech.device_draws,
            "cohort_size": slot.widest,
            "full_logit_rows": slot.full_rows,
        }
