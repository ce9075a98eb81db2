"""What a parsed graph means: references, cycles, terminals, runners and artifacts.

``validate`` stops at the first fault and raises ``GraphError`` with its JSON path. The runner
table is an argument (runner name -> declared kind), so this module stays free of the runtime
that owns that table.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from .model import REQUEST, SCHEMA_VERSION, Graph, GraphError, Stage, graph_file, load

# Ids of stages and ports, and input names: no ':' (the source separator) and no spaces.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
# Request fields are identifiers, as in ``request:messages``.
FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_name(value: str, path: str, what: str) -> None:
    if not NAME.fullmatch(value):
        raise GraphError(
            path,
            f"{what} {value!r} must start with a letter or '_' and hold only letters, "
            "digits, '_', '.', '-'",
        )


def _check_unique(values: list[str], path_of: list[str], what: str, where: str = "") -> None:
    seen: dict[str, int] = {}
    for i, v in enumerate(values):
        if v in seen:
            first = path_of[seen[v]]
            raise GraphError(path_of[i], f"duplicate {what} {v!r}{where} (first at {first})")
        seen[v] = i


def _check_artifact(artifact: str, path: str, engine_dir: str | os.PathLike[str] | None) -> None:
    # "" is the engine dir itself, as "." is (TensorRT Edge-LLM writes it so); os.path.join
    # and the runtime's Path join both resolve it there.
    if artifact.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", artifact):
        raise GraphError(path, f"artifact {artifact!r} must be relative to the engine dir")
    if ".." in re.split(r"[\\/]", artifact):
        raise GraphError(path, f"artifact {artifact!r} must not contain '..'")
    if engine_dir is None:
        return
    root = os.path.realpath(engine_dir)
    real = os.path.realpath(os.path.join(root, artifact))
    if os.path.commonpath([root, real]) != root:
        raise GraphError(path, f"artifact {artifact!r} resolves to {real}, outside {root}")
    if not os.path.isdir(real):
        state = "is not a directory" if os.path.exists(real) else "does not exist"
        raise GraphError(path, f"artifact {artifact!r} {state} ({real})")


def _check_stage(
    i: int,
    stage: Stage,
    runners: Mapping[str, str] | None,
    engine_dir: str | os.PathLike[str] | None,
) -> None:
    at = f"$.stages[{i}]"
    _check_name(stage.id, f"{at}.id", "stage id")
    if stage.id == REQUEST:
        raise GraphError(f"{at}.id", f"stage id {REQUEST!r} is reserved for request fields")
    for key in ("runner", "kind"):
        if not getattr(stage, key):
            raise GraphError(f"{at}.{key}", f"{key} must not be empty")
    if runners is not None:
        if stage.runner not in runners:
            known = ", ".join(sorted(runners)) or "none"
            raise GraphError(f"{at}.runner", f"unknown runner {stage.runner!r} (known: {known})")
        declared = runners[stage.runner]
        if stage.kind != declared:
            raise GraphError(
                f"{at}.kind",
                f"kind {stage.kind!r} does not match runner {stage.runner!r}, "
                f"which is {declared!r}",
            )
    _check_artifact(stage.artifact, f"{at}.artifact", engine_dir)
    for j, inp in enumerate(stage.inputs):
        _check_name(inp.name, f"{at}.inputs[{j}].name", "input name")
    _check_unique(
        [x.name for x in stage.inputs],
        [f"{at}.inputs[{j}].name" for j in range(len(stage.inputs))],
        "input name",
        f" in stage {stage.id!r}",
    )
    for k, emit in enumerate(stage.emits):
        _check_name(emit.id, f"{at}.emits[{k}].id", "emit id")
        for key in ("kind", "transport"):
            if not getattr(emit, key):
                raise GraphError(f"{at}.emits[{k}].{key}", f"{key} must not be empty")
    _check_unique(
        [e.id for e in stage.emits],
        [f"{at}.emits[{k}].id" for k in range(len(stage.emits))],
        "emit id",
        f" in stage {stage.id!r}",
    )


def _check_sources(graph: Graph) -> None:
    stages = {s.id: s for s in graph.stages}
    for i, stage in enumerate(graph.stages):
        for j, inp in enumerate(stage.inputs):
            at = f"$.stages[{i}].inputs[{j}].from"
            head, sep, tail = inp.source.partition(":")
            if not sep or not head or not tail:
                raise GraphError(
                    at, f"expected 'request:<field>' or '<stage>:<port>', got {inp.source!r}"
                )
            if head == REQUEST:
                if not FIELD.fullmatch(tail):
                    raise GraphError(at, f"request field {tail!r} must be an identifier")
                continue
            if head not in stages:
                known = ", ".join(stages) or "none"
                raise GraphError(at, f"unknown stage {head!r} (stages: {known})")
            if head == stage.id:
                raise GraphError(at, f"stage {stage.id!r} reads its own output {inp.source!r}")
            upstream = stages[head]
            if upstream.emit(tail) is None:
                emits = ", ".join(e.id for e in upstream.emits) or "none"
                raise GraphError(at, f"stage {head!r} has no emit {tail!r} (emits: {emits})")


def _check_cycles(graph: Graph) -> None:
    """Depth-first over "reads from" edges, in file order, so the reported cycle is stable."""
    index = {s.id: i for i, s in enumerate(graph.stages)}
    state = [0] * len(graph.stages)  # 0 new, 1 on the stack, 2 done

    def edges(i: int) -> list[tuple[int, int]]:
        out = []
        for j, inp in enumerate(graph.stages[i].inputs):
            up = inp.upstream
            if up is not None:
                out.append((j, index[up[0]]))
        return out

    for start in range(len(graph.stages)):
        if state[start]:
            continue
        stack: list[tuple[int, list[tuple[int, int]]]] = [(start, edges(start))]
        state[start] = 1
        while stack:
            node, todo = stack[-1]
            if not todo:
                state[node] = 2
                stack.pop()
                continue
            j, up = todo.pop(0)
            if state[up] == 1:
                on_stack = [n for n, _ in stack]
                loop = on_stack[on_stack.index(up) :]
                # Each stage on the stack reads from the next one; data flows the other way.
                flow = [graph.stages[n].id for n in reversed(loop)]
                names = " -> ".join([*flow, flow[0]])
                raise GraphError(f"$.stages[{node}].inputs[{j}].from", f"cycle: {names}")
            if state[up] == 0:
                state[up] = 1
                stack.append((up, edges(up)))


def _check_terminals(graph: Graph) -> None:
    if not graph.terminals:
        raise GraphError("$.terminals", "the graph needs at least one terminal")
    marked = set(graph.terminal_ports())
    ports = set(graph.ports())
    paths = [f"$.terminals[{k}]" for k in range(len(graph.terminals))]
    _check_unique(list(graph.terminals), paths, "terminal")
    for k, t in enumerate(graph.terminals):
        if t not in ports:
            raise GraphError(paths[k], f"terminal {t!r} is not an output port of any stage")
        if t not in marked:
            raise GraphError(paths[k], f"port {t!r} is listed but not marked terminal: true")
    listed = set(graph.terminals)
    for i, stage in enumerate(graph.stages):
        for k, emit in enumerate(stage.emits):
            port = stage.port(emit.id)
            if emit.terminal and port not in listed:
                raise GraphError(
                    f"$.stages[{i}].emits[{k}].terminal",
                    f"port {port!r} is marked terminal but missing from $.terminals",
                )


def validate(
    graph: Graph,
    runners: Mapping[str, str] | None = None,
    engine_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Raise GraphError at the first fault of ``graph``.

    ``runners`` maps runner name -> declared kind; when given, each stage's runner must be in it
    with the same kind. ``engine_dir`` is the folder holding the file; when given, each artifact
    must be a directory inside it (symlinks resolved; ``""`` and ``"."`` are the folder itself).
    """
    if graph.schema_version != SCHEMA_VERSION:
        raise GraphError(
            "$.schema_version",
            f"unsupported schema_version {graph.schema_version} (expected {SCHEMA_VERSION})",
        )
    for k, t in enumerate(graph.terminals):
        stage_id, sep, port = t.partition(":")
        if not sep or not NAME.fullmatch(stage_id) or not NAME.fullmatch(port):
            raise GraphError(f"$.terminals[{k}]", f"expected '<stage>:<port>', got {t!r}")
    first: dict[str, int] = {}
    for i, stage in enumerate(graph.stages):
        if stage.id in first:
            raise GraphError(
                f"$.stages[{i}].id",
                f"duplicate stage id {stage.id!r} (first at $.stages[{first[stage.id]}].id)",
            )
        first[stage.id] = i
        _check_stage(i, stage, runners, engine_dir)
    _check_sources(graph)
    _check_cycles(graph)
    _check_terminals(graph)


def validate_file(path: str | os.PathLike[str], runners: Mapping[str, str] | None = None) -> Graph:
    """Load and validate a graph file (or an engine dir holding one); artifacts are checked
    against the file's folder. Returns the graph."""
    file = graph_file(path)
    graph = load(file)
    validate(graph, runners, engine_dir=os.path.dirname(os.path.abspath(file)))
    return graph
