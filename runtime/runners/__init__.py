"""The runner table: which stage implementation serves each `runner` name of a graph.

Validation reads only the declared kinds, so checking a graph loads no engine or plugin.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any


class RequestError(ValueError):
    """A request this stage cannot serve (too long for the build, wrong input); only that
    request fails."""


@dataclass(frozen=True)
class RunnerDecl:
    name: str
    kind: str
    factory: str  # "module:attribute", imported when a stage with this runner first runs

    def load(self) -> Any:
        module, attr = self.factory.split(":")
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
    error: str | None = None


RUNNERS: dict[str, RunnerDecl] = {
    decl.name: decl
    for decl in (
        RunnerDecl("llm.backbone", "autoregressive", "edgeomni.runtime.runners.llm:LLMBackbone"),
        RunnerDecl("qwen3_omni.talker", "autoregressive", "edgeomni.runtime.runners.talker:Talker"),
        RunnerDecl(
            "qwen3_omni.code2wav", "iterative", "edgeomni.runtime.runners.code2wav:Code2Wav"
        ),
    )
}
RUNNER_KINDS: dict[str, str] = {name: decl.kind for name, decl in RUNNERS.items()}
