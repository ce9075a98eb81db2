"""Walk requests through the graph: plan each, group cohorts, run the stages in order.

Scheduling (plans and cohorts) is pure Python; stage runners own their engine calls and sampling.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeomni import graph_schema
from edgeomni.runtime.requests import BadRequest, Request
from edgeomni.runtime.runners import RUNNER_KINDS, RUNNERS, RequestError, RequestState
from edgeomni.runtime.scheduler import make_cohorts

GRAPH_FILE = "multistage_config.json"


def resolve_config(path: str | Path) -> Path:
    """--config takes the engine dir or the graph file inside it."""
    path = Path(path)
    return path / GRAPH_FILE if path.is_dir() else path


def load_graph(path: str | Path) -> tuple[Path, graph_schema.Graph]:
    """Load and validate the graph against the runners this runtime has (no engine is loaded)."""
    file = resolve_config(path)
    graph = graph_schema.validate_file(file, runners=RUNNER_KINDS)
    return file.parent, graph


@dataclass
class StageProfile:
    calls: int = 0
    seconds: float = 0.0
    requests: int = 0


@dataclass
class Profile:
    stages: dict[str, StageProfile] = field(default_factory=dict)
    load_seconds: float = 0.0
    wall_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {
            "wall_ms": round(self.wall_seconds * 1e3, 3),
            "load_ms": round(self.load_seconds * 1e3, 3),
            "peak_rss_mb": round(peak_kb / 1024, 1),
            "stages": {
                sid: {
                    "cohorts": p.calls,
                    "requests": p.requests,
                    "total_ms": round(p.seconds * 1e3, 3),
                }
                for sid, p in self.stages.items()
            },
        }


class Pipeline:
    def __init__(self, config: str | Path, *, threads: int | None = None) -> None:
        self.engine_dir, self.graph = load_graph(config)
        self.threads = threads
        self._runners: dict[str, Any] = {}
        self.profile = Profile()

    def runner(self, stage_id: str) -> Any:
        """Stage runners load on first use, so a text-only run never loads speech engines."""
        if stage_id not in self._runners:
            start = time.perf_counter()
            stage = self.graph.stage(stage_id)
            factory = RUNNERS[stage.runner].load()
            folder = self.engine_dir / stage.artifact
            self._runners[stage_id] = factory(stage, folder, threads=self.threads)
            self.profile.load_seconds += time.perf_counter() - start
        return self._runners[stage_id]

    def text_terminals(self) -> tuple[str, ...]:
        return tuple(
            stage.port(e.id)
            for stage in self.graph.stages
            for e in stage.emits
            if e.terminal and e.kind == "text"
        )

    def run(
        self,
        requests: Sequence[Request | BadRequest],
        *,
        batch_size: int,
        requested: Collection[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Run every request; returns one predictions entry per request, in input order."""
        start = time.perf_counter()
        states: list[RequestState] = []
        failed: dict[int, str] = {}
        for pos, item in enumerate(requests):
            if isinstance(item, BadRequest):
                failed[pos] = item.error
                continue
            plan = graph_schema.plan(self.graph, item.fields, requested)
            if not plan.ok:
                failed[pos] = plan.error or "the graph cannot serve this request"
                continue
            wanted = {
                inp.source for sid in plan.stages for inp in self.graph.stage(sid).inputs
            } | set(plan.terminals)
            state = RequestState(index=pos, request=item, plan=plan, wanted=frozenset(wanted))
            try:
                for stage_id in plan.stages:
                    prepare = getattr(self.runner(stage_id), "prepare", None)
                    if prepare is not None:
                        state.prepared[stage_id] = prepare(state)
            except RequestError as e:
                failed[pos] = str(e)
                continue
            states.append(state)

        keys = [(s.plan.stages, s.request.fields, s.request.batch_settings) for s in states]
        for cohort_idx in make_cohorts(keys, max(1, batch_size)):
            cohort = [states[i] for i in cohort_idx]
            self._run_cohort(cohort, batch_size)
        self.profile.wall_seconds += time.perf_counter() - start
        return self._entries(len(requests), states, failed)

    def _run_cohort(self, cohort: list[RequestState], batch_size: int) -> None:
        for stage_id in cohort[0].plan.stages:
            runner = self.runner(stage_id)
            width = min(batch_size, getattr(runner, "max_batch", batch_size))
            for lo in range(0, len(cohort), width):  # a cohort never exceeds the build's max_batch
                part = cohort[lo : lo + width]
                t = time.perf_counter()
                runner.run(part)
                prof = self.profile.stages.setdefault(stage_id, StageProfile())
                prof.calls += 1
                prof.requests += len(part)
                prof.seconds += time.perf_counter() - t

    def _entries(
        self, count: int, states: list[RequestState], failed: dict[int, str]
    ) -> list[dict[str, Any]]:
        by_pos = {s.index: s for s in states}
        text_ports = self.text_terminals()
        entries = []
        for pos in range(count):
            if pos in failed:
                entries.append(
                    {"request_idx": pos, "ok": False, "error": failed[pos], "stages": {}}
                )
                continue
            state = by_pos[pos]
            entry: dict[str, Any] = {"request_idx": pos}
            for port in text_ports:
                if port in state.outputs:
                    entry.setdefault("output_text", state.outputs[port])
            entry.update(ok=state.error is None, error=state.error, stages=state.details)
            entries.append(entry)
        return entries
