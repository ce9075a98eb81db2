"""The toy family's stage: a request's last user message, each character's code point shifted by
the engine (and by the request's ``rot``), as one call; a StageRunner with a slot stage for the
in-flight scheduler (runtime/scheduler.py's SlotStage)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime.artifacts import Artifact, check_folder
from edgeomni.runtime.engine import open_engine
from edgeomni.runtime.events import Finished, TextDelta
from edgeomni.runtime.runners import RequestError, RequestState, StageRunner, stage_source


class Shift(StageRunner):
    kind = "iterative"
    reads = frozenset({"shift_seed"})

    def __init__(self, stage: Any, folder: Path, **engines: Any) -> None:
        self.stage = stage
        self.config = self.check(stage, folder).config
        self.engine = open_engine(folder, self.config, threads=engines.get("threads"))

    @classmethod
    def check(cls, stage: Any, folder: Path) -> Any:
        stage_source(stage, "text")
        return check_folder(folder, Artifact(keys=("builder_config",)))

    def answer(self, state: RequestState) -> str:
        """Writes the request's text output and report; a RequestError fails it alone."""
        text = next((m["content"] for m in reversed(state.request.messages)
                     if m["role"] == "user" and isinstance(m["content"], str)), None)  # fmt: skip
        if not text:
            raise RequestError("the toy answers a text user message")
        codes = np.array([[ord(c) for c in text]], np.float32)
        out = np.empty_like(codes)
        binding = self.engine.binding()
        binding.bind_output("shifted", out)
        binding.run({"codes": codes})
        rot = int(state.request.speech.get("rot", 0))
        answer = "".join(chr(int(round(v)) + rot) for v in out[0])
        state.outputs[f"{self.stage.id}:text"] = answer
        state.details[self.stage.id] = {"finish_reason": "complete"}
        return answer

    def run(self, cohort: Sequence[RequestState], **_: Any) -> None:
        for state in cohort:
            try:
                self.answer(state)
            except RequestError as e:
                state.error = state.error or f"{self.stage.id}: {e}"

    def slot_stage(self, *, stream_upstream: bool = False) -> ShiftSlots:
        return ShiftSlots(self)


@dataclass
class ShiftSlot:
    state: RequestState
    row: int
    text: str = ""
    finish: str | None = None


class ShiftSlots:
    """Each admitted request is answered at once and leaves the same turn."""

    consumes = False

    def __init__(self, runner: Shift) -> None:
        self.r = runner
        self.stage_id: str = runner.stage.id

    def ready(self, state: RequestState, upstream_done: bool) -> bool:
        return upstream_done

    def admit(self, entries: Sequence[tuple[RequestState, int]]) -> list[ShiftSlot]:
        slots = []
        for state, row in entries:
            try:
                slots.append(ShiftSlot(state, row, self.r.answer(state), "complete"))
            except RequestError as e:
                state.error = f"{self.stage_id}: {e}"
        return slots

    def step(self, slots: Mapping[int, ShiftSlot]) -> None:
        """Nothing: a request is answered when it is admitted."""

    def update(self, slot: ShiftSlot, events: bool) -> list[Any]:
        if not events:
            return []
        index = slot.state.index
        return [TextDelta(index, self.stage_id, slot.text, ()),
                Finished(index, self.stage_id, "complete")]  # fmt: skip

    def consume(self, slot: ShiftSlot, event: Any) -> None:
        raise TypeError(f"{self.stage_id} takes no events")

    def move(self, slot: ShiftSlot, row: int) -> None:
        slot.row = row

    def retire(self, slot: ShiftSlot) -> None:
        """Its output was written when it was admitted."""

    def discard(self, slot: ShiftSlot) -> None:
        """It holds nothing."""
