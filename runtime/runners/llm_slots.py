"""The text model under the in-flight scheduler: each request holds a slot (a KV cache row, its
own sampling settings and generator); a request is prefilled into a free row while the others
decode, and leaves the batch the step it finishes.

``TextSlots`` implements ``scheduler.SlotStage`` over an ``LLMBackbone``'s engine, cache,
tokenizer and stop rules, so its tokens are the cohort path's, row for row.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeomni.runtime.decoder import DecoderSession, text_positions
from edgeomni.runtime.events import Event, Finished, TextDelta
from edgeomni.runtime.runners import HiddenHandoff, RequestState
from edgeomni.runtime.sampling import log_softmax_top, sample_rows

__all__ = ["TextSlots"]


@dataclass
class Slot:
    """One request decoding in one cache row."""

    state: RequestState
    row: int
    prompt: Any  # runtime.prompt.Prompt
    rng: np.random.Generator
    bias: tuple[np.ndarray, np.ndarray] | None
    history: np.ndarray | None  # prompt + generated ids, for the repetition penalty
    generated: list[int] = field(default_factory=list)
    logprobs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    finish: str | None = None
    past: int = 0
    prefill_s: float = 0.0
    prefill_engine_s: float = 0.0
    decode_s: float = 0.0
    decode_engine_s: float = 0.0
    steps: int = 0
    full_rows: int = 0
    widest: int = 1  # the most rows that stepped together while it decoded
    sent: str = ""  # the text its deltas gave so far
    sent_ids: int = 0  # the tokens its deltas covered
    handoff: HiddenHandoff | None = None  # what it feeds its talker (accept_hidden), if wanted

    @property
    def request(self) -> Any:
        return self.state.request


class TextSlots:
    consumes = False  # the first stage of its graphs: nothing upstream sends it events

    def __init__(self, backbone: Any) -> None:
        self.b = backbone
        self.stage_id: str = backbone.stage.id
        self._hidden_port = f"{self.stage_id}:accept_hidden"
        self.max_batch: int = backbone.max_batch
        self._outputs = {"logits": (backbone.vocab_size,)}
        if backbone.hidden_layer is not None:
            self._outputs["hidden_states"] = (backbone.hidden_size,)
        self._sessions: dict[int, DecoderSession] = {}

    def _session(self, rows: int, first: int) -> DecoderSession:
        return DecoderSession(
            self.b.engine, self.b.kv, rows, self._outputs,
            per_position=("hidden_states",), first_row=first,
        )  # fmt: skip

    def _decode_session(self, rows: int) -> DecoderSession:
        """Decode steps over rows 0..rows-1 are one token wide: their sessions (and output
        buffers) are kept, one per row count. A prefill's session is made for its call, as a
        cohort's is: its buffers are as wide as the prompt, so keeping them would keep one set
        for every prompt length seen."""
        if rows not in self._sessions:
            self._sessions[rows] = self._session(rows, 0)
        return self._sessions[rows]

    # -- the scheduler's calls ---------------------------------------------------------------
    def ready(self, state: RequestState, upstream_done: bool) -> bool:
        return upstream_done

    def consume(self, slot: Slot, event: Event) -> None:
        raise TypeError(f"{self.stage_id} takes no events")

    def discard(self, slot: Slot) -> None:
        """A request that failed elsewhere: its row is simply free again."""

    def admit(self, entries: Sequence[tuple[RequestState, int]]) -> list[Slot]:
        """Prefill these requests into their rows (each contiguous run of rows one call) and
        draw each one's first token."""
        slots = []
        by_row = sorted(entries, key=lambda e: e[1])
        run: list[tuple[RequestState, int]] = []
        for state, row in by_row:
            if run and row != run[-1][1] + 1:
                slots += self._prefill(run)
                run = []
            run.append((state, row))
        if run:
            slots += self._prefill(run)
        return slots

    def _prefill(self, run: Sequence[tuple[RequestState, int]]) -> list[Slot]:
        b = self.b
        prompts = [state.prepared[self.stage_id] for state, _ in run]
        ids, embeds, positions, extra = b.prefill_feeds(prompts)
        lens = np.array([len(p) for p in prompts], np.int32)
        session = self._session(len(run), run[0][1])
        start, engine = time.perf_counter(), session.engine_seconds
        out = session.run(embeds, positions, np.zeros(len(run), np.int32), lens, lens - 1, **extra)
        elapsed, engine = time.perf_counter() - start, session.engine_seconds - engine
        slots = []
        for j, (state, row) in enumerate(run):
            request = state.request
            history = None
            if request.sampling.repetition_penalty != 1.0:
                history = np.zeros(len(prompts[j]) + request.max_generate_length, np.int64)
                history[: lens[j]] = ids[j, : lens[j]]
            slot = Slot(
                state, row, prompts[j], np.random.default_rng(request.sampling.seed),
                _bias(request), history, past=int(lens[j]), prefill_s=elapsed,
                prefill_engine_s=engine,
            )  # fmt: skip
            if b.hidden_layer is not None and self._hidden_port in state.wanted:
                # the talker reads the accept-layer state of a prompt's media positions only
                p = prompts[j]
                hidden = out["hidden_states"][j, : lens[j]].copy() if p.spans else None
                slot.handoff = HiddenHandoff(
                    np.asarray(p.ids, np.int64), hidden, p.image_grids, p.audio_frames
                )
                slot.handoff.feed(embeds[j, : lens[j]])
                state.outputs[self._hidden_port] = slot.handoff
            slots.append(slot)
        self._sample(slots, out.logits())
        return slots

    def step(self, slots: Mapping[int, Slot]) -> None:
        """One decode step of every active row: rows [0, highest active] in one call, a free
        row in between sitting it out (query length 0, its cache untouched)."""
        b = self.b
        hi = max(slots) + 1
        tokens = np.zeros(hi, np.int64)
        past = np.zeros(hi, np.int32)
        deltas = np.zeros(hi, np.int32)
        active = np.zeros(hi, np.int32)
        for row, slot in slots.items():
            tokens[row], past[row], deltas[row] = slot.generated[-1], slot.past, slot.prompt.delta
            active[row] = 1
        session = self._decode_session(hi)
        start, engine = time.perf_counter(), session.engine_seconds
        step_embeds = b.embedding[tokens][:, None, :]
        out = session.run(
            step_embeds, text_positions(past + deltas, 1, b.mrope), past,
            active, np.zeros(hi, np.int64), **b.decode_feeds(hi),
        )  # fmt: skip
        for row, slot in slots.items():  # the token fed: the talker reads it as it comes
            if slot.handoff is not None:
                slot.handoff.feed_one(step_embeds[row, 0])
        ordered = [slots[r] for r in sorted(slots)]
        rows = np.array(sorted(slots), np.int64)
        step = out.logits()
        sub = rows_of(step, rows) if len(rows) != hi else step
        self._sample(ordered, sub)
        elapsed, engine = time.perf_counter() - start, session.engine_seconds - engine
        for slot in ordered:
            slot.past += 1
            slot.steps += 1
            slot.decode_s += elapsed
            slot.decode_engine_s += engine
            slot.widest = max(slot.widest, len(ordered))

    def _sample(self, slots: Sequence[Slot], step: Any) -> None:
        """Each slot's next token from its own settings and generator; its logprobs."""
        b = self.b
        seen = None
        if any(s.history is not None for s in slots):
            seen = [s.history[: len(s.prompt) + len(s.generated)] if s.history is not None
                    else np.zeros(0, np.int64) for s in slots]  # fmt: skip
        banned = [b._eos_ids if len(s.generated) < s.request.min_generate_length else None
                  for s in slots]  # fmt: skip
        bias = [s.bias for s in slots]
        tokens, fetched = sample_rows(
            step, [s.request.sampling for s in slots], [s.rng for s in slots], seen, banned,
            bias if any(x is not None for x in bias) else None,
        )  # fmt: skip
        asked = [j for j, s in enumerate(slots) if s.request.num_logprobs]
        if asked:  # from the model's logits, before bias and penalty
            top = max(slots[j].request.num_logprobs for j in asked)
            ids, values = log_softmax_top(step.full(np.array(asked, np.int64)), top)
            for k, j in enumerate(asked):
                n = slots[j].request.num_logprobs
                slots[j].logprobs.append((ids[k, :n], values[k, :n]))
        for j, slot in enumerate(slots):
            token = int(tokens[j])
            slot.generated.append(token)
            slot.full_rows += fetched + len(asked)  # of the calls it took part in, as a cohort's
            if slot.history is not None:
                slot.history[len(slot.prompt) + len(slot.generated) - 1] = token

    def update(self, slot: Slot, events: bool) -> list[Event]:
        """After the slot's newest token: whether it finished (eos, a stop string, its length)
        and, when ``events``, what it adds to the stream: new text (held back while it may
        still be half a character or the start of a stop string), then Finished."""
        b = self.b
        slot.finish = b.finished(slot.request, slot.generated, slot.request.max_generate_length)
        if slot.finish is not None and slot.handoff is not None:  # its last token is never fed
            slot.handoff.done = True
            slot.handoff.finished_by_eos = slot.finish == "eos"
        if not events:
            return []
        if slot.finish is None:
            text = b.tokenizer.decode(slot.generated)
            stops = slot.request.stop
            hold = max((len(s) for s in stops), default=1) - 1
            safe = text[: len(text) - hold] if hold else text
            safe = safe.rstrip("\ufffd")
        else:
            safe = b.finish_text(slot.request, slot.generated, slot.finish)
        out: list[Event] = []
        if len(safe) > len(slot.sent) and safe.startswith(slot.sent):
            ids = tuple(slot.generated[slot.sent_ids :])
            out.append(TextDelta(slot.state.index, self.stage_id, safe[len(slot.sent) :], ids))
            slot.sent, slot.sent_ids = safe, len(slot.generated)
        if slot.finish is not None:
            out.append(Finished(slot.state.index, self.stage_id, slot.finish))
        return out

    def move(self, slot: Slot, row: int) -> None:
        """The slot's cache into ``row`` (free), and the slot with it."""
        self.b.kv.move_row(slot.row, row, slot.past)
        slot.row = row

    def retire(self, slot: Slot) -> None:
        """A finished request's outputs and report, as the cohort path writes them."""
        b, state = self.b, slot.state
        state.outputs[f"{self.stage_id}:text"] = b.finish_text(
            state.request, slot.generated, slot.finish
        )
        if state.request.num_logprobs:
            state.entry["logprobs"] = [b.logprob_step(*pair) for pair in slot.logprobs]
        decode_s = slot.decode_s
        state.details[self.stage_id] = {
            "prompt_tokens": len(slot.prompt),
            "output_tokens": list(slot.generated),
            "generated_tokens": len(slot.generated),
            "finish_reason": slot.finish,
            "prefill_ms": round(slot.prefill_s * 1e3, 3),
            "prefill_engine_ms": round(slot.prefill_engine_s * 1e3, 3),
            "decode_ms": round(decode_s * 1e3, 3),
            "decode_engine_ms": round(slot.decode_engine_s * 1e3, 3),
            "decode_steps": slot.steps,
            "decode_tokens_per_s": round(slot.steps / decode_s, 2) if decode_s > 0 else None,
            "full_logit_rows": slot.full_rows,
            "cohort_size": slot.widest,
            "batching": "inflight",
        }


def _bias(request: Any) -> tuple[np.ndarray, np.ndarray] | None:
    from edgeomni.runtime.runners.llm import request_bias

    return request_bias(request)


def rows_of(step: Any, rows: np.ndarray) -> Any:
    """A step's logits for some of its rows (the active ones of a call over a wider range)."""
    from edgeomni.runtime.sampling import StepLogits

    def full(r: np.ndarray) -> np.ndarray:
        return step.full(rows[np.asarray(r, np.int64)])

    values, indices = step.topk_values, step.topk_indices
    return StepLogits(
        len(rows), full,
        None if values is None else values[rows], None if indices is None else indices[rows],
    )  # fmt: skip
