"""Which stages one request runs: the ones it supplies inputs for and whose outputs reach a
requested terminal.

Per input, ``on_missing`` says what a missing source means: ``skip`` runs the stage without it;
``fail`` and ``prune`` leave the stage out. A requested terminal that then cannot be produced
fails the request when a ``fail`` input blocks it, and is dropped when only ``prune`` inputs do.
Pure data in, pure data out, so the scheduler can plan every request of a cohort cheaply.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .model import Graph, GraphError, Input
from .validate import validate

Chain = list[tuple[str, Input]]  # (stage id, its input without a source), walking upstream


def _empty() -> Mapping[str, tuple[str, ...]]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Plan:
    """The stages one request runs, in order, and the terminals it gets back.

    When ``error`` is set the request cannot run: ``stages`` and ``terminals`` are empty so a
    caller that forgets to check ``ok`` runs nothing.
    """

    stages: tuple[str, ...]
    terminals: tuple[str, ...]
    skipped_inputs: Mapping[str, tuple[str, ...]] = field(default_factory=_empty, hash=False)
    pruned_terminals: tuple[str, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def topological_order(graph: Graph, only: Collection[str] | None = None) -> tuple[str, ...]:
    """Stage ids with every stage after the ones it reads from; ties keep file order.

    ``only`` restricts the order to those stages (edges from other stages are ignored). The
    graph must be free of cycles (``validate`` checks that).
    """
    index = {s.id: i for i, s in enumerate(graph.stages)}
    keep = set(index) if only is None else set(only)
    deps: dict[str, set[str]] = {}
    users: dict[str, list[str]] = {sid: [] for sid in keep}
    for s in graph.stages:
        if s.id not in keep:
            continue
        deps[s.id] = {inp.upstream[0] for inp in s.inputs if inp.upstream} & keep
        for up in deps[s.id]:
            users[up].append(s.id)
    ready = [index[sid] for sid, d in deps.items() if not d]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        sid = graph.stages[heapq.heappop(ready)].id
        order.append(sid)
        for user in users[sid]:
            deps[user].discard(sid)
            if not deps[user]:
                heapq.heappush(ready, index[user])
    if len(order) != len(keep):
        raise GraphError("$.stages", "the graph has a cycle")
    return tuple(order)


def _describe(terminal: str, chain: Chain, supplied: set[str]) -> str:
    """Say why ``terminal`` cannot be produced, from its stage up to the missing request field."""
    parts = []
    for k, (sid, inp) in enumerate(chain):
        note = " (on_missing: prune)" if inp.on_missing == "prune" else ""
        head = f"terminal {terminal} needs stage {sid}" if k == 0 else f"stage {sid} does not run"
        verb = ", whose" if k == 0 else ": its"
        parts.append(f"{head}{verb} input {inp.name!r}{note} has no source ({inp.source})")
    field_name = chain[-1][1].request_field
    given = ", ".join(sorted(supplied)) or "nothing"
    parts.append(f"the request does not supply {field_name!r} (it supplies: {given})")
    return "; ".join(parts)


class _Blockers:
    """Walks upstream from a stage that cannot run to the request fields that stop it."""

    def __init__(self, blocked: Mapping[str, list[Input]]) -> None:
        self.blocked = blocked
        self._fail: dict[str, Chain | None] = {}

    def first(self, sid: str) -> Chain:
        """Any one chain (the first blocked input at each step)."""
        inp = self.blocked[sid][0]
        up = inp.upstream
        return [(sid, inp)] + ([] if up is None else self.first(up[0]))

    def failing(self, sid: str) -> Chain | None:
        """The first chain holding an on_missing 'fail' input, or None if all are 'prune'."""
        if sid not in self._fail:
            found: Chain | None = None
            for inp in self.blocked[sid]:
                up = inp.upstream
                if inp.on_missing == "fail":
                    found = [(sid, inp)] + ([] if up is None else self.first(up[0]))
                elif up is not None and (rest := self.failing(up[0])) is not None:
                    found = [(sid, inp), *rest]
                if found is not None:
                    break
            self._fail[sid] = found
        return self._fail[sid]


def _names(arg: Collection[str] | None, what: str) -> set[str] | None:
    if isinstance(arg, str):  # "messages" would otherwise plan for fields m, e, s, ...
        raise TypeError(f"{what} must be a collection of names, not the string {arg!r}")
    return None if arg is None else set(arg)


def plan(graph: Graph, supplied: Collection[str], requested: Collection[str] | None = None) -> Plan:
    """Plan one request.

    ``supplied``: the request fields the request provides (e.g. ``{"messages", "audio"}``).
    ``requested``: the terminal ports asked for; None asks for all of ``graph.terminals``.
    Raises GraphError when the graph is invalid or a requested terminal is not one of its
    terminals; a request that cannot be served is a Plan with ``error`` set.
    """
    fields = _names(supplied, "supplied") or set()
    asked = _names(requested, "requested")
    validate(graph)
    if asked is None:
        asked = set(graph.terminals)
    for t in sorted(asked):
        if t not in graph.terminals:
            known = ", ".join(graph.terminals)
            raise GraphError(
                "$.terminals", f"requested terminal {t!r} is not one (terminals: {known})"
            )
    wanted = [t for t in graph.terminals if t in asked]  # file order, for stable output
    if not wanted:
        return Plan((), (), error="no terminal requested")

    stages = {s.id: s for s in graph.stages}
    available: dict[str, bool] = {}
    blocked: dict[str, list[Input]] = {}
    skipped: dict[str, tuple[str, ...]] = {}
    for sid in topological_order(graph):
        missing = []
        for inp in stages[sid].inputs:
            up = inp.upstream
            present = available[up[0]] if up else inp.request_field in fields
            if not present:
                missing.append(inp)
        blocked[sid] = [i for i in missing if i.on_missing != "skip"]
        skipped[sid] = tuple(i.name for i in missing if i.on_missing == "skip")
        available[sid] = not blocked[sid]

    walker = _Blockers(blocked)
    produced: list[str] = []
    pruned: list[str] = []
    reasons: list[str] = []
    for t in wanted:
        sid = t.partition(":")[0]
        if available[sid]:
            produced.append(t)
            continue
        chain = walker.failing(sid)
        if chain is not None:
            return Plan((), (), pruned_terminals=tuple(pruned), error=_describe(t, chain, fields))
        pruned.append(t)
        reasons.append(_describe(t, walker.first(sid), fields))
    if not produced:
        error = "every requested terminal was pruned: " + " | ".join(reasons)
        return Plan((), (), pruned_terminals=tuple(pruned), error=error)

    # Needed: emits a produced terminal, or feeds a needed stage (which, being available, has a
    # source for every input it reads from this stage).
    needed: set[str] = set()
    targets = set(produced)
    for sid in reversed(topological_order(graph)):
        s = stages[sid]
        if not available[sid]:
            continue
        if any(s.port(e.id) in targets for e in s.emits) or any(
            inp.upstream and inp.upstream[0] == sid for n in needed for inp in stages[n].inputs
        ):
            needed.add(sid)
    order = topological_order(graph, only=needed)
    return Plan(
        stages=order,
        terminals=tuple(produced),
        skipped_inputs=MappingProxyType({s: skipped[s] for s in order if skipped[s]}),
        pruned_terminals=tuple(pruned),
    )
