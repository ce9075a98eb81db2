"""The runner table: which stage implementation serves each `runner` name of a graph (the
generic text model's, and those each family declares in runtime/families/).

Validation reads only the declared kinds, so checking a graph loads no engine or plugin.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the table loads no engine module
    from edgeomni.runtime.artifacts import Checked
    from edgeomni.runtime.engine import Engine, Engines


class RequestError(ValueError):
    """A request this stage cannot serve (too long for the build, wrong input); only that
    request fails."""


def stage_source(stage: Any, name: str) -> str:
    """Where the stage's input ``name`` comes from; a ValueError when the stage has none."""
    for inp in stage.inputs:
        if inp.name == name:
            return inp.source
    raise ValueError(f"{stage.id}: the stage has no {name!r} input")


class StageRunner:
    """What every stage runner has: per-request preparation before any batch runs, the rows
    its engine was built for, and ``slot_stage``, the stage the scheduler loop steps."""

    kind: str = "iterative"
    # the request keys this stage reads besides its graph inputs (sampling keys, limits): a key
    # given that no stage of a run reads changes nothing, and edge-infer says so
    reads: frozenset[str] = frozenset()
    max_batch: int | None = None  # None: no engine limit on the rows of a call
    stage: Any  # graph_schema.Stage
    config: dict[str, Any]  # its folder's config.json
    engine: Engine

    def open_stage(self, stage: Any, folder: Path, engines: Engines, **options: Any) -> Checked:
        """What a runner's constructor starts with: its folder checked (the class's ``check``),
        then its engine opened (``options``: ``Engines.open``'s ``spin``, ``replay``). Returns
        what the check read (a text model's tokenizer)."""
        self.stage = stage
        checked = self.check(stage, folder)
        self.config = checked.config
        self.engine = engines.open(folder, self.config, **options)
        return checked

    def prepare(self, state: RequestState) -> Any:
        """This stage's own input for a request, made before any batch runs (None: none); a
        RequestError fails the request."""
        return None

    def prepare_many(self, states: list[RequestState]) -> list[Any]:
        """``prepare`` for requests that arrived together, one result each: the input, or the
        exception that fails that request alone. A stage whose preparation runs an engine
        (a media encoder) batches it across them here."""
        out: list[Any] = []
        for state in states:
            try:
                out.append(self.prepare(state))
            except Exception as e:
                out.append(e)
        return out

    def slot_stage(self, *, stream_upstream: bool = False) -> Any:
        """This stage for the scheduler loop (scheduler.SlotStage); ``stream_upstream``: a
        request may start before its upstream stage is done with it, where the stage can."""
        raise NotImplementedError


@dataclass(frozen=True)
class RunnerDecl:
    name: str
    kind: str
    factory: str  # "module:attribute", imported when a stage with this runner first runs
    # what the runner makes: emit id -> kind. A graph's emit must be one of these, of its kind
    # (an emit relabelled would carry nothing, or the wrong thing, where it says)
    emits: Mapping[str, str] = field(default_factory=dict)

    def load(self) -> Any:
        """The runner class. It has ``check(stage, folder)``: what opening the stage reads,
        checked without loading an engine (--validate-config, and the first step of opening)."""
        return load_factory(self.factory)


def load_factory(factory: str) -> Any:
    """What a "module:attribute" declaration names, its module imported now."""
    module, attr = factory.split(":")
    return getattr(importlib.import_module(module), attr)


@dataclass
class RequestState:
    """One request on its way through the graph: what stages produced and what they reported."""

    index: int
    request: Any  # runtime.requests.Request
    plan: Any  # graph_schema.Plan
    outputs: dict[str, Any] = field(default_factory=dict)  # "stage:port" -> value
    details: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage id -> report
    prepared: dict[str, Any] = field(default_factory=dict)  # stage id -> runner's own input
    wanted: frozenset[str] = frozenset()  # ports some planned stage reads or the request asked for
    started: float = 0.0  # perf_counter when its cohort started: the origin of first-audio times
    batch_idx: int | None = None  # its row in the cohort it ran in
    # fields of its predictions entry a stage adds in llm_inference's terms (the formatted
    # prompt, logprobs)
    entry: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _table() -> dict[str, RunnerDecl]:
    from edgeomni.export.registry import LLM_RUNNER
    from edgeomni.runtime.families import FAMILIES

    decls = [
        RunnerDecl(LLM_RUNNER, "autoregressive", "edgeomni.runtime.runners.llm:LLMBackbone",
                   {"text": "text", "accept_hidden": "hidden"})  # fmt: skip
    ]
    decls += [RunnerDecl(*decl) for runners in FAMILIES.values() for decl in runners]
    return {decl.name: decl for decl in decls}


RUNNERS: dict[str, RunnerDecl] = _table()
RUNNER_KINDS: dict[str, str] = {name: decl.kind for name, decl in RUNNERS.items()}


def check_emits(graph: Any) -> None:
    """Each stage's emits are outputs its runner makes, of the kind it makes them: a
    GraphError at the emit's JSON path otherwise."""
    from edgeomni.graph_schema import GraphError

    for i, stage in enumerate(graph.stages):
        makes = RUNNERS[stage.runner].emits
        for k, emit in enumerate(stage.emits):
            at = f"$.stages[{i}].emits[{k}]"
            known = ", ".join(f"{e} ({kind})" for e, kind in makes.items())
            if emit.id not in makes:
                raise GraphError(
                    f"{at}.id",
                    f"runner {stage.runner!r} makes no output {emit.id!r} (it makes {known})",
                )
            if emit.kind != makes[emit.id]:
                raise GraphError(
                    f"{at}.kind",
                    f"{emit.id!r} of runner {stage.runner!r} is {makes[emit.id]}, not "
                    f"{emit.kind}",
                )
