"""The runner table: which stage implementation serves each `runner` name of a graph (the
generic text model's, and those each family declares in runtime/families/).

Validation reads only the declared kinds, so checking a graph loads no engine or plugin.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


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
    """What every stage runner has, with the defaults of a runner that lacks a capability, so
    the pipeline asks instead of probing: per-request preparation before any batch runs, the
    rows its engine was built for, whether it steps in cohorts a stage after it can follow
    (``steps``) or itself follows one (``reads_upstream``), and callables fed with an upstream
    stage's output as it is made (``stream_sinks``)."""

    kind: str = "iterative"
    # the request keys this stage reads besides its graph inputs (sampling keys, limits): a key
    # given that no stage of a run reads changes nothing, and edge-infer says so
    reads: frozenset[str] = frozenset()
    max_batch: int | None = None  # None: no engine limit on the rows of a call
    streams_steps = False  # has ``steps(cohort)``, a generator of its cohort's decode steps
    reads_upstream = False  # ``run`` takes ``upstream``: the stage before runs as it needs
    feeds_sinks = False  # ``run`` takes ``sinks``: it feeds a later stage's input as it is made

    def prepare(self, state: RequestState) -> Any:
        """This stage's own input for a request, made before any batch runs (None: none); a
        RequestError fails the request."""
        return None

    def stream_sinks(self, cohort: Sequence[RequestState]) -> dict[int, Any]:
        """Request index -> a callable fed this stage's input as an upstream stage makes it
        (none by default: the input is read once it is complete)."""
        return {}


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


@dataclass
class HiddenHandoff:
    """What a thinker hands its talker for one request (the ``accept_hidden`` port, a
    chunk_stream): filled in while the thinker decodes, so the talker can start once it has
    what its first step needs and read the reply's tokens as they are fed.

    ``feed`` appends the input embedding of each token fed to the thinker (the prompt, then each
    generated token but the last); ``fed`` counts them and ``embeds`` reads them. ``done``: the
    thinker has finished this request, so nothing more will be fed.
    """

    prompt_ids: np.ndarray  # int64 [prompt_len]
    hidden: np.ndarray | None  # the prompt's accept-layer states [prompt_len, H], media prompts
    image_grids: Any = ()
    audio_frames: Any = ()
    fed: int = 0
    done: bool = False
    finished_by_eos: bool = False
    _rows: np.ndarray | None = field(default=None, repr=False)  # [capacity, H], grown by doubling

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    def feed(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, np.float32).reshape(-1, np.shape(rows)[-1])
        need = self.fed + len(rows)
        if self._rows is None or need > len(self._rows):  # amortised: appends stay linear
            grown = np.empty((max(need, 2 * self.fed, 64), rows.shape[1]), np.float32)
            if self._rows is not None:
                grown[: self.fed] = self._rows[: self.fed]
            self._rows = grown
        self._rows[self.fed : need] = rows
        self.fed = need

    def feed_one(self, row: np.ndarray) -> None:
        """``feed`` of one embedding [H], without its checks: a thinker step feeds every row
        this way, and ``feed``'s reshaping cost ~10 us a call."""
        if self._rows is None or self.fed == len(self._rows):
            self.feed(row)
            return
        self._rows[self.fed] = row
        self.fed += 1

    def embeds(self, lo: int, hi: int) -> np.ndarray:
        """Fed embeddings [lo, hi) (hi <= fed); a view, never changed by later feeds."""
        if hi > self.fed or self._rows is None:
            raise IndexError(f"embeddings up to {hi} asked for, {self.fed} fed so far")
        return self._rows[lo:hi]


def feed_cohort(handoffs: Sequence[HiddenHandoff], capacity: int, hidden: int) -> FedRows:
    """Give a cohort's (empty) handoffs one buffer [rows, capacity, H], grown by doubling, so
    that a thinker step feeds all its rows in one assignment: per-row ``feed`` calls cost
    ~10-40 us each at H=2048, most of the thinker's host time per step at 32 rows."""
    for handoff in handoffs:
        if handoff.fed:
            raise ValueError("feed_cohort takes handoffs nothing was fed to yet")
    fed = FedRows(list(handoffs), np.empty((len(handoffs), 0, hidden), np.float32))
    fed.reserve(capacity)
    return fed


@dataclass
class FedRows:
    """``feed_cohort``'s buffer: ``step`` appends one embedding to each of some rows."""

    handoffs: list[HiddenHandoff]
    store: np.ndarray  # [rows, capacity, H]; handoff r reads store[r]

    def reserve(self, capacity: int) -> None:
        """Room for ``capacity`` embeddings a row. Views read before stay valid: they keep the
        old buffer, whose rows never change."""
        if capacity <= self.store.shape[1]:
            return
        grown = np.empty((len(self.handoffs), capacity, self.store.shape[2]), np.float32)
        for handoff, rows in zip(self.handoffs, grown, strict=True):
            if handoff.fed:
                rows[: handoff.fed] = handoff._rows[: handoff.fed]
            handoff._rows = rows
        self.store = grown

    def step(self, rows: np.ndarray, embeds: np.ndarray) -> None:
        """Append ``embeds[j]`` [H] to handoff ``rows[j]``."""
        fed = np.fromiter((self.handoffs[r].fed for r in rows), np.int64, len(rows))
        if len(rows) and fed.max() >= self.store.shape[1]:
            self.reserve(2 * self.store.shape[1])
        self.store[rows, fed] = embeds
        for r in rows:
            self.handoffs[r].fed += 1


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
