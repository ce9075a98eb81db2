"""Where a graph's stages run when edge-serve deploys them on Ray Serve (``--placement FILE``):
groups of stages, each group one Ray Serve deployment, with its replicas and what each replica
needs. Pure standard library, so a placement file is checked before Ray is imported.

A placement file (JSON)::

    {"groups": [
        {"name": "thinker", "stages": ["audio", "visual", "thinker"], "num_gpus": 1},
        {"name": "speech", "stages": ["talker", "code2wav"], "replicas": 2, "num_gpus": 0.5,
         "num_cpus": 2, "resources": {"jetson": 1}, "max_ongoing_requests": 8,
         "max_queued_requests": 32}
    ]}

Every stage of the graph is in exactly one group, and the groups follow the graph: listed in
the order requests pass them (each group's stages come after every stage of the groups before
it, in the graph's order), so a request's stages split into one run of stages per group it
visits. Errors name the file's JSON path (``$.groups[1].stages[0]``). Without a file every
stage is in one group, ``all``. ``check_fits`` holds a placement against a cluster's resources
before anything is deployed (Ray Serve would wait for them forever).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from edgeomni import graph_schema

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,47}$")
KEYS = ("name", "stages", "replicas", "num_gpus", "num_cpus", "resources",
        "max_ongoing_requests", "max_queued_requests")  # fmt: skip


class PlacementError(ValueError):
    """What is wrong with a placement (``message``) and where in its file (``path``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message

    def __reduce__(self):  # picklable despite the 2-argument __init__
        return (type(self), (self.path, self.message))


@dataclass(frozen=True)
class Group:
    """One deployment: its stages (in graph order), replicas and each replica's resources.
    ``max_ongoing_requests`` None: every request edge-serve admits (its batch size + queue;
    ray_app.application); ``max_queued_requests`` -1: Ray Serve's default (no limit)."""

    name: str
    stages: tuple[str, ...]
    replicas: int = 1
    num_gpus: float = 0.0
    num_cpus: float = 1.0
    resources: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    max_ongoing_requests: int | None = None
    max_queued_requests: int = -1


@dataclass(frozen=True)
class Placement:
    groups: tuple[Group, ...]

    def group_of(self, stage: str) -> Group:
        return next(g for g in self.groups if stage in g.stages)

    def segments(self, stages: Sequence[str]) -> list[tuple[Group, tuple[str, ...]]]:
        """A request's stages (its plan's, in order) as runs of stages, one per group it
        visits, in order; a ValueError if a group would be visited twice (the plan's order
        left the placement's)."""
        out: list[tuple[Group, tuple[str, ...]]] = []
        for sid in stages:
            group = self.group_of(sid)
            if out and out[-1][0] is group:
                out[-1] = (group, (*out[-1][1], sid))
            elif any(g is group for g, _ in out):
                raise ValueError(f"the request's stages {list(stages)} visit group "
                                 f"{group.name!r} twice")  # fmt: skip
            else:
                out.append((group, (sid,)))
        return out


def single(graph: graph_schema.Graph) -> Placement:
    """Every stage in one group (the default)."""
    return Placement((Group("all", tuple(graph_schema.topological_order(graph))),))


def load(path: str | Path, graph: graph_schema.Graph) -> Placement:
    """Read and check a placement file against ``graph``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise PlacementError("$", f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise PlacementError("$", f"not JSON: {e}") from None
    return parse(data, graph)


def parse(data: Any, graph: graph_schema.Graph) -> Placement:
    """Check a placement's JSON against ``graph``: a PlacementError naming the first fault."""
    if not isinstance(data, dict):
        raise PlacementError("$", "must be an object with a list of groups")
    extra = sorted(set(data) - {"groups"})
    if extra:
        raise PlacementError(f"$.{extra[0]}", "unknown key (a placement has only groups)")
    items = data.get("groups")
    if not isinstance(items, list) or not items:
        raise PlacementError("$.groups", "must be a non-empty list of groups")
    order = graph_schema.topological_order(graph)
    rank = {sid: i for i, sid in enumerate(order)}
    groups, seen, names = [], {}, set()
    for i, item in enumerate(items):
        groups.append(_group(f"$.groups[{i}]", item, rank, seen, names))
    missing = [sid for sid in order if sid not in seen]
    if missing:
        raise PlacementError("$.groups", f"stage(s) {', '.join(missing)} of the graph are in no "
                                         "group")  # fmt: skip
    for i in range(1, len(groups)):
        before = max(rank[s] for s in groups[i - 1].stages)
        first = min(rank[s] for s in groups[i].stages)
        if first < before:
            late = next(s for s in groups[i - 1].stages if rank[s] > first)
            raise PlacementError(
                f"$.groups[{i}].stages",
                f"{order[first]!r} comes before {late!r} (group {groups[i - 1].name!r}) in the "
                f"graph's order ({', '.join(order)}): list the groups in the order requests "
                "pass them, each group's stages after the earlier groups'",
            )
    return Placement(tuple(groups))


def _group(at: str, item: Any, rank: Mapping[str, int], seen: dict[str, str],
           names: set[str]) -> Group:  # fmt: skip
    if not isinstance(item, dict):
        raise PlacementError(at, "must be an object")
    extra = sorted(set(item) - set(KEYS))
    if extra:
        raise PlacementError(f"{at}.{extra[0]}", f"unknown key (known: {', '.join(KEYS)})")
    name = item.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise PlacementError(f"{at}.name", "must be a name of letters, digits, _ and - "
                                           "(a letter first, at most 48)")  # fmt: skip
    if name in names:
        raise PlacementError(f"{at}.name", f"{name!r} names another group too")
    names.add(name)
    stages = item.get("stages")
    if not isinstance(stages, list) or not stages:
        raise PlacementError(f"{at}.stages", "must be a non-empty list of stage ids")
    for j, sid in enumerate(stages):
        where = f"{at}.stages[{j}]"
        if sid not in rank:
            raise PlacementError(where, f"{sid!r} is no stage of the graph (its stages: "
                                        f"{', '.join(rank)})")  # fmt: skip
        if sid in seen:
            raise PlacementError(where, f"{sid!r} is in group {seen[sid]!r} already")
        seen[sid] = name
    ordered = tuple(sorted(stages, key=rank.__getitem__))
    ranks = [rank[s] for s in ordered]
    if ranks != list(range(ranks[0], ranks[0] + len(ranks))):
        gap = next(s for s, r in rank.items() if ranks[0] < r < ranks[-1] and s not in ordered)
        raise PlacementError(f"{at}.stages", f"its stages are not consecutive in the graph's "
                                             f"order: {gap!r} runs between them")  # fmt: skip
    resources = item.get("resources", {})
    if not isinstance(resources, dict) or not all(
        isinstance(k, str) and _number(v) and v >= 0 for k, v in resources.items()
    ):
        raise PlacementError(f"{at}.resources", "must map resource names to numbers >= 0")
    return Group(
        name, ordered,
        replicas=_count(f"{at}.replicas", item.get("replicas", 1), 1),
        num_gpus=_amount(f"{at}.num_gpus", item.get("num_gpus", 0.0)),
        num_cpus=_amount(f"{at}.num_cpus", item.get("num_cpus", 1.0)),
        resources=MappingProxyType({k: float(v) for k, v in resources.items()}),
        max_ongoing_requests=None if item.get("max_ongoing_requests") is None else _count(
            f"{at}.max_ongoing_requests", item["max_ongoing_requests"], 1),
        max_queued_requests=_count(f"{at}.max_queued_requests",
                                   item.get("max_queued_requests", -1), -1),
    )  # fmt: skip


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _amount(at: str, v: Any) -> float:
    if not _number(v) or v < 0:
        raise PlacementError(at, f"must be a number >= 0 (a fraction shares a device), not {v!r}")
    return float(v)


def _count(at: str, v: Any, least: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise PlacementError(at, f"must be an integer >= {least}, not {v!r}")
    return v


# Ray counts resources in steps of 1e-4: a sum of fractions may be off by a rounding error
SLACK = 5e-5
FIELDS = {"CPU": "num_cpus", "GPU": "num_gpus"}  # Ray's resource names: the placement's keys


def needs(group: Group) -> dict[str, float]:
    """What one replica of ``group`` asks Ray for, by Ray's resource names (none of zero)."""
    want = {"CPU": group.num_cpus, "GPU": group.num_gpus, **group.resources}
    return {k: v for k, v in want.items() if v > 0}


def check_fits(placement: Placement, nodes: Sequence[Mapping[str, float]], *,
               unknown: Collection[str] = (), cluster: str = "the cluster") -> None:
    """A PlacementError, at the JSON path of the first group the cluster cannot hold, where
    Ray would wait for resources forever: a replica larger than every node (``nodes``: each
    one's resources, by Ray's names), a group's replicas, or all the groups together, more
    than the nodes have in all. Resources in ``unknown`` are not checked (a local cluster's
    GPUs before it starts). Ray packs replicas onto nodes; what passes may still not fit,
    which edge-serve's bounded wait for the deployments reports."""
    total: dict[str, float] = {}
    for node in nodes:
        for k, v in node.items():
            total[k] = total.get(k, 0.0) + v
    where = cluster if len(nodes) == 1 else f"{cluster} ({len(nodes)} nodes)"
    together: dict[str, list[tuple[Group, float]]] = {}
    for i, group in enumerate(placement.groups):
        one = {k: v for k, v in needs(group).items() if k not in unknown}
        for k, v in one.items():
            largest = max((node.get(k, 0.0) for node in nodes), default=0.0)
            if v > largest + SLACK:
                most = f"has {_amount_of(k, largest)}" if len(nodes) == 1 else (
                    f"has no node with more than {_amount_of(k, largest)}")
                raise PlacementError(_path(i, k), f"group {group.name!r} needs "
                                     f"{_amount_of(k, v)} a replica; {where} {most}")
            if group.replicas * v > total.get(k, 0.0) + SLACK:
                raise PlacementError(f"$.groups[{i}].replicas", f"group {group.name!r} needs "
                                     f"{_amount_of(k, group.replicas * v)} ({group.replicas} "
                                     f"replicas x {v:g}); {where} has "
                                     f"{_amount_of(k, total.get(k, 0.0))}")
            together.setdefault(k, []).append((group, group.replicas * v))
        if one and not any(all(n.get(k, 0.0) + SLACK >= v for k, v in one.items())
                           for n in nodes):
            raise PlacementError(f"$.groups[{i}]", f"group {group.name!r} needs "
                                 f"{_amounts(one)} a replica; no node of {where} has all of it")
    for k, parts in together.items():
        if len(parts) > 1 and sum(v for _, v in parts) > total.get(k, 0.0) + SLACK:
            each = " + ".join(f"{g.name} {v:g}" for g, v in parts)
            raise PlacementError("$.groups", f"the groups need "
                                 f"{_amount_of(k, sum(v for _, v in parts))} together ({each}); "
                                 f"{where} has {_amount_of(k, total.get(k, 0.0))}")


def _path(i: int, resource: str) -> str:
    return f"$.groups[{i}].{FIELDS[resource]}" if resource in FIELDS else (
        f"$.groups[{i}].resources.{resource}")


def _amount_of(resource: str, v: float) -> str:
    return f"{v:g} {resource}" if resource in FIELDS else f"{v:g} of resource {resource!r}"


def _amounts(want: Mapping[str, float]) -> str:
    return ", ".join(_amount_of(k, v) for k, v in want.items())
