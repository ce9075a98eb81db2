"""The core types every stage, the pipeline and the server share: what a stage runner is, and
the request state it works on. Low in the import order: no runner table, family or engine."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeomni.graph_schema import Plan, Stage

if TYPE_CHECKING:  # none of these loads for a stage's types
    from edgeomni.runtime.artifacts import Checked
    from edgeomni.runtime.engine import Engine, Engines
    from edgeomni.runtime.requests import Request
    from edgeomni.runtime.scheduler import SlotStage

Output = str | np.ndarray  # a finished port's value: text, or a host array (codes, audio)


class RequestError(ValueError):
    """A request this stage cannot serve (too long for the build, wrong input); only that
    request fails."""


def stage_source(stage: Stage, name: str) -> str:
    """Where the stage's input ``name`` comes from; a ValueError when the stage has none."""
    for inp in stage.inputs:
        if inp.name == name:
            return inp.source
    raise ValueError(f"{stage.id}: the stage has no {name!r} input")


def load_factory(factory: str) -> Any:
    """What a "module:attribute" declaration names, its module imported now."""
    module, attr = factory.split(":")
    return getattr(importlib.import_module(module), attr)


@dataclass
class RequestState:
    """One request on its way through the graph: what stages produced and what they reported."""

    index: int
    request: Request
    plan: Plan
    outputs: dict[str, Output] = field(default_factory=dict)  # "stage:port" -> value
    # stage id -> its report (JSON values: counts, times, reasons)
    details: dict[str, dict[str, Any]] = field(default_factory=dict)
    # stage id -> that runner's own input (its ``prepare``'s result: only it reads it)
    prepared: dict[str, object] = field(default_factory=dict)
    wanted: frozenset[str] = frozenset()  # ports some planned stage reads or the request asked for
    started: float = 0.0  # perf_counter when its cohort started: the origin of first-audio times
    batch_idx: int | None = None  # its row in the cohort it ran in
    # fields of its predictions entry a stage adds in llm_inference's terms (the formatted
    # prompt, logprobs; JSON values)
    entry: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class StageRunner:
    """What every stage runner has: per-request preparation before any batch runs, the rows
    its engine was built for, and ``slot_stage``, the stage the scheduler loop steps."""

    kind: str = "iterative"
    # the request keys this stage reads besides its graph inputs (sampling keys, limits): a key
    # given that no stage of a run reads changes nothing, and edge-infer says so
    reads: frozenset[str] = frozenset()
    max_batch: int | None = None  # None: no engine limit on the rows of a call
    stage: Stage
    config: dict[str, Any]  # its folder's config.json
    engine: Engine

    def open_stage(self, stage: Stage, folder: Path, engines: Engines, **options: Any) -> Checked:
        """What a runner's constructor starts with: its folder checked (the class's ``check``),
        then its engine opened (``options``: ``Engines.open``'s ``spin``, ``replay``). Returns
        what the check read (a text model's tokenizer)."""
        self.stage = stage
        self.folder = folder
        checked = self.check(stage, folder)
        self.config = checked.config
        self.engine = engines.open(folder, self.config, **options)
        return checked

    @classmethod
    def check(cls, stage: Stage, folder: Path) -> Checked:
        """What opening the stage reads, checked without loading an engine (--validate-config,
        and the first step of opening)."""
        raise NotImplementedError

    def prepare(self, state: RequestState) -> object:
        """This stage's own input for a request, made before any batch runs (None: none); a
        RequestError fails the request."""
        return None

    def prepare_many(self, states: list[RequestState]) -> list[object]:
        """``prepare`` for requests that arrived together, one result each: the input, or the
        exception that fails that request alone. A stage whose preparation runs an engine
        (a media encoder) batches it across them here."""
        out: list[object] = []
        for state in states:
            try:
                out.append(self.prepare(state))
            except Exception as e:
                out.append(e)
        return out

    def slot_stage(self, *, stream_upstream: bool = False) -> SlotStage:
        """This stage for the scheduler loop (scheduler.SlotStage); ``stream_upstream``: a
        request may start before its upstream stage is done with it, where the stage can."""
        raise NotImplementedError
