"""code2wav under the in-flight scheduler: an iterative stage fed by the talker's frame events.

A request joins the moment the talker admits it; its frames arrive as ``CodecFrames`` events and
each step vocodes the windows that became complete, every request's in one call per shape
(``WindowBatch``). Once the talker's ``Finished`` event comes (or, admitted after its upstream
was done with it, at once), the rest is flushed and it leaves. Vocoding whole utterances, a request joins once its codes are complete instead, and
the requests that join on the same turn are vocoded together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgeomni.runtime.events import AudioChunk, CodecFrames, Event, Finished
from edgeomni.runtime.runners import RequestState
from edgeomni.runtime.speech.code2wav import AudioStream, Whole, WindowBatch

__all__ = ["VocoderSlots"]


@dataclass
class VocoderSlot:
    state: RequestState
    row: int
    stream: AudioStream | None  # None: vocoded whole once its codes are complete
    finish: str | None = None
    audio: np.ndarray | None = None
    whole: Whole | None = None  # its utterance, vocoded with the others admitted with it
    sent: int = 0  # the stream's pieces its events gave
    offset: int = 0  # samples its events gave
    complete: bool = False  # its codes are all made (its upstream is done with it)


class VocoderSlots:
    consumes = True  # the talker's CodecFrames

    def __init__(self, runner: Any) -> None:
        self.r = runner
        self.stage_id: str = runner.stage.id
        self.batch = WindowBatch(runner)
        self._complete: set[int] = set()  # asked while their upstream was done with them

    def ready(self, state: RequestState, upstream_done: bool, events: Sequence[Event]) -> bool:
        if upstream_done:
            self._complete.add(state.index)
        return upstream_done or not self.r.whole

    def admit(
        self, entries: Sequence[tuple[RequestState, int, Sequence[Event]]]
    ) -> list[VocoderSlot]:
        slots = []
        for state, row, _ in entries:
            stream = None if self.r.whole else self.r.stream_for(state, self.batch)
            if stream is not None:
                self.batch.streams.append(stream)
            slot = VocoderSlot(state, row, stream)
            slot.complete = state.index in self._complete
            self._complete.discard(state.index)
            slots.append(slot)
        # vocoding whole utterances, the requests admitted together (a cohort's, which the
        # talker finished on the same step) share engine calls
        together = self.r.vocode_together([s.state for s in slots if s.stream is None])
        for slot, (_, _, events) in zip(slots, entries, strict=True):
            slot.whole = together.get(slot.state.index)
            for event in events:  # what the talker made before it came here
                self.consume(slot, event)
        return slots

    def consume(self, slot: VocoderSlot, event: Event) -> None:
        if isinstance(event, CodecFrames) and slot.stream is not None:
            slot.stream(event.codes)
        elif isinstance(event, Finished):
            slot.complete = True

    def step(self, slots: Mapping[int, VocoderSlot]) -> None:
        """The windows completed since the last step, all requests' together."""
        self.batch.decode_ready()

    def update(self, slot: VocoderSlot, events: bool) -> list[Event]:
        """Once the talker has written the request's codes: the rest of its audio, and it is
        done. When ``events``: the audio made since the last update."""
        state = slot.state
        if slot.audio is None and slot.complete:
            slot.audio = self.r.finish_request(state, slot.stream, slot.whole)
            slot.finish = "complete"
        if not events:
            return []
        pieces: list[np.ndarray] = []
        if slot.finish is not None:
            pieces = [slot.audio[slot.offset :]]
        elif slot.stream is not None:
            pieces = slot.stream.pieces[slot.sent :]
            slot.sent = len(slot.stream.pieces)
        out: list[Event] = []
        for piece in pieces:
            # an utterance of no audio still gives one (empty) chunk: its sample rate
            if piece.size or (slot.finish is not None and not slot.offset):
                out.append(AudioChunk(state.index, self.stage_id, piece, slot.offset,
                                      self.r.sample_rate))  # fmt: skip
                slot.offset += int(piece.size)
        if slot.finish is not None:
            out.append(Finished(state.index, self.stage_id, slot.finish))
        return out

    def move(self, slot: VocoderSlot, row: int) -> None:
        slot.row = row  # it holds no cache

    def retire(self, slot: VocoderSlot) -> None:
        self.discard(slot)

    def discard(self, slot: VocoderSlot) -> None:
        if slot.stream is not None and slot.stream in self.batch.streams:
            self.batch.streams.remove(slot.stream)
