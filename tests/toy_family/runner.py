"""The toy family's stage: a request's last user message, each character's code point shifted by
the engine (and by the request's ``rot``), as one call; a StageRunner whose stage is a
``CallStage`` (runtime/call_stage.py): one call per request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime.artifacts import Artifact, check_folder
from edgeomni.runtime.call_stage import CallStage
from edgeomni.runtime.engine import DEFAULT_ENGINES, Engines
from edgeomni.runtime.events import TextDelta
from edgeomni.runtime.stage import RequestError, RequestState, StageRunner, stage_source


class Shift(StageRunner):
    kind = "iterative"
    reads = frozenset({"shift_seed"})

    def __init__(self, stage: Any, folder: Path, *, engines: Engines = DEFAULT_ENGINES) -> None:
        self.stage = stage
        self.config = self.check(stage, folder).config
        self.engine = engines.open(folder, self.config, replay=False)

    @classmethod
    def check(cls, stage: Any, folder: Path) -> Any:
        stage_source(stage, "text")
        return check_folder(folder, Artifact(keys=("builder_config",)))

    def answer(self, state: RequestState) -> list[Any]:
        """Writes the request's text output and report, and returns its text as an event; a
        RequestError fails it alone."""
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
        return [TextDelta(state.index, self.stage.id, answer, ())]

    def slot_stage(self, *, stream_upstream: bool = False) -> CallStage:
        return CallStage(self.stage.id, self.answer)
