"""The runner table: which stage implementation serves each `runner` name of a graph (the
generic text model's, and those each family declares in runtime/families/).

Validation reads only the declared kinds, so checking a graph loads no engine or plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgeomni.graph_schema import Graph, GraphError
from edgeomni.runtime.stage import load_factory


@dataclass(frozen=True)
class RunnerDecl:
    name: str
    kind: str
    factory: str  # "module:attribute", imported when a stage with this runner first runs
    # what the runner makes: emit id -> kind. A graph's emit must be one of these, of its kind
    # (an emit relabelled would carry nothing, or the wrong thing, where it says)
    emits: Mapping[str, str] = field(default_factory=dict)

    def load(self) -> Any:
        """The runner class (a stage.StageRunner)."""
        return load_factory(self.factory)


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


def check_emits(graph: Graph) -> None:
    """Each stage's emits are outputs its runner makes, of the kind it makes them: a
    GraphError at the emit's JSON path otherwise."""
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
