"""Orchestrate one build: checkpoint -> export -> lower -> engine -> artifacts -> graph."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edgeomni.builder.errors import BuildError
from edgeomni.export.common.checkpoint import open_checkpoint
from edgeomni.export.family import BuildArgs, Component
from edgeomni.export.registry import family_for

GRAPH_FILE = "multistage_config.json"
log = logging.getLogger("edge-build")


def _backend(name: str) -> Callable[[Path, Path, BuildArgs], None]:
    if name == "onnxruntime":
        from edgeomni.builder.onnxruntime import build_engine
    elif name == "tensorrt":
        from edgeomni.builder.tensorrt import build_engine
    else:
        raise BuildError(f"unknown backend {name!r}; choose onnxruntime or tensorrt")
    return build_engine


@contextmanager
def step(what: str) -> Any:
    """Progress for the long steps: one line when a step starts, one with its time when done."""
    log.info("%s ...", what)
    start = time.perf_counter()
    yield
    log.info("%s done in %.1f s", what, time.perf_counter() - start)


def is_edgeomni_build(path: Path) -> bool:
    if (path / GRAPH_FILE).is_file():
        return True
    cfg = path / "config.json"
    try:
        return json.loads(cfg.read_text()).get("format", "").startswith("edgeomni.engine/")
    except (OSError, ValueError, AttributeError):
        return False


def check_engine_dir(path: Path) -> None:
    """Refuse to write into a directory that holds something other than an edgeomni build."""
    if path.exists() and not path.is_dir():
        raise BuildError(f"--engine-dir {path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not is_edgeomni_build(path):
        found = ", ".join(sorted(p.name for p in path.iterdir())[:5])
        raise BuildError(
            f"--engine-dir {path} holds other files ({found}); use an empty or new directory"
        )


def select_components(
    available: Sequence[Component], wanted: Sequence[str] | None
) -> list[Component]:
    if not wanted or list(wanted) == ["all"]:
        return list(available)
    if "all" in wanted:
        raise BuildError("--components: 'all' cannot be combined with component names")
    by_name = {c.name: c for c in available}
    unknown = [w for w in wanted if w not in by_name]
    if unknown:
        raise BuildError(
            f"--components: unknown {', '.join(unknown)}; this checkpoint has {', '.join(by_name)}"
        )
    return [c for c in available if c.name in wanted]


def build(
    model_dir: Path,
    engine_dir: Path,
    args: BuildArgs,
    components: Sequence[str] | None = None,
) -> Path | None:
    """Build every selected component into engine_dir; returns the graph file (None if no graph).

    The engines are built in a staging directory beside engine_dir and moved into place only when
    every step succeeded, so a failed build leaves a previous one untouched.
    """
    for flag, value in (
        ("--max-batch-size", args.max_batch_size),
        ("--max-input-len", args.max_input_len),
        ("--max-kv-cache-capacity", args.max_kv_cache_capacity),
    ):
        if value < 1:
            raise BuildError(f"{flag} must be at least 1, got {value}")
    backend = _backend(args.backend)
    if args.backend == "tensorrt":
        from edgeomni.builder.tensorrt import NOT_YET

        raise BuildError(NOT_YET)
    ckpt = open_checkpoint(model_dir)
    family = family_for(ckpt.model_type)
    hooks = family.hooks()
    ckpt.weight_files  # noqa: B018 - fail on missing or unreadable weights before building
    selected = select_components(hooks.components(ckpt), components)
    engine_dir = engine_dir.resolve()
    check_engine_dir(engine_dir)
    engine_dir.parent.mkdir(parents=True, exist_ok=True)
    log.info("building %s (%s family) into %s", model_dir, family.name, engine_dir)

    staging = Path(tempfile.mkdtemp(prefix=f".{engine_dir.name}.partial-", dir=engine_dir.parent))
    try:
        with tempfile.TemporaryDirectory(prefix="edgeomni-export-") as work:
            for comp in selected:
                out_dir = staging / comp.subdir
                out_dir.mkdir(parents=True, exist_ok=True)
                comp_work = Path(work) / comp.name
                with step(f"export {comp.name} to ONNX"):
                    raw = hooks.export_component(ckpt, comp, comp_work, args)
                with step(f"build {comp.name} engine ({args.backend}, {args.device})"):
                    backend(raw, out_dir / comp.engine, args)
                with step(f"write {comp.name} artifacts"):
                    hooks.write_artifacts(ckpt, comp, out_dir, args)
        graph_path = write_graph(hooks, ckpt, staging, selected, args)
        _swap_into_place(staging, engine_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return engine_dir / GRAPH_FILE if graph_path else None


def write_graph(
    hooks: Any, ckpt: Any, engine_dir: Path, built: Sequence[Component], args: BuildArgs | None
) -> Path | None:
    """Ask the family for its topology, stamp each stage's limits, validate, and save."""
    from edgeomni import graph_schema

    graph = hooks.multistage_topology(ckpt, {c.name: c.subdir for c in built}, args)
    if graph is None:
        log.warning(
            "no %s written: the %s family cannot run components %s as a graph",
            GRAPH_FILE,
            ckpt.model_type,
            ", ".join(c.name for c in built),
        )
        return None
    graph = stamp_limits(graph, engine_dir)
    graph_schema.validate(graph, engine_dir=engine_dir)
    path = engine_dir / GRAPH_FILE
    graph_schema.save(graph, path)
    return path


def stamp_limits(graph: Any, engine_dir: Path) -> Any:
    """max_batch and max_seq of each stage come from the limits its engine was built with."""
    import dataclasses

    stages = []
    for stage in graph.stages:
        cfg_path = engine_dir / stage.artifact / "config.json"
        limits = json.loads(cfg_path.read_text()).get("builder_config", {})
        stages.append(
            dataclasses.replace(
                stage,
                max_batch=limits.get("max_batch_size", stage.max_batch),
                max_seq=limits.get("max_kv_cache_capacity", stage.max_seq),
            )
        )
    return dataclasses.replace(graph, stages=tuple(stages))


def _swap_into_place(staging: Path, engine_dir: Path) -> None:
    old = None
    if engine_dir.exists():
        old = engine_dir.with_name(f".{engine_dir.name}.old-{os.getpid()}")
        engine_dir.rename(old)
    staging.rename(engine_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
