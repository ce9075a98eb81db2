"""A stage whose work is one call per request: it runs when the request is admitted, and the
request leaves that same turn (it holds no cache row between steps). Encoders (Qwen3-TTS's
clone encoders) and one-shot converters run so; a family brings only the call.

``CallStage(stage_id, call)``: ``call(state)`` does the request's work, writing its outputs and
report, and returns the events it makes (a RequestError fails that request alone).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgeomni.runtime.events import Event, Finished
from edgeomni.runtime.stage import RequestError, RequestState

__all__ = ["CallStage"]


@dataclass
class _Done:
    state: RequestState
    row: int
    events: list[Event] = field(default_factory=list)
    finish: str | None = "complete"


class CallStage:
    """``scheduler.SlotStage`` for a one-call stage (a first stage, or one that starts once the
    stage before is done with the request)."""

    consumes = False

    def __init__(self, stage_id: str, call: Callable[[RequestState], list[Event]]) -> None:
        self.stage_id = stage_id
        self.call = call

    def ready(self, state: RequestState, upstream_done: bool, events: Sequence[Event]) -> bool:
        return upstream_done

    def admit(self, entries: Sequence[tuple[RequestState, int, Sequence[Event]]]) -> list[_Done]:
        slots = []
        for state, row, _ in entries:
            try:
                slots.append(_Done(state, row, list(self.call(state))))
            except RequestError as e:
                state.error = f"{self.stage_id}: {e}"
        return slots

    def step(self, slots: Mapping[int, Any]) -> None:
        """Nothing: a request's call ran when it was admitted."""

    def update(self, slot: _Done, events: bool) -> list[Event]:
        if not events:
            return []
        return [*slot.events, Finished(slot.state.index, self.stage_id, "complete")]

    def consume(self, slot: _Done, event: Event) -> None:
        raise TypeError(f"{self.stage_id} takes no events")

    def move(self, slot: _Done, row: int) -> None:
        slot.row = row

    def retire(self, slot: _Done) -> None:
        """Its outputs were written by its call."""

    def discard(self, slot: _Done) -> None:
        """It holds nothing."""
