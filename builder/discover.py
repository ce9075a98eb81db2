"""Find the engines already in an engine dir, for `edge-build --graph-only`.

Engines from other tools (exporters, C++ builders) come without a graph. These rules say where
each component's engine may be, so a graph can be written for them without building anything:

- the backbone (component "llm"): the engine dir itself, then ``thinker/``, then ``llm/``
  (the first that holds it wins);
- the encoders ("audio", "visual"): ``audio/`` / ``visual/`` under the engine dir, then under
  ``multimodal/``;
- every other component: its own subdirectory, ``<name>/`` (``talker/``, ``code_predictor/``,
  ``code2wav/``), or the subdir its family builds it into when that differs.

A place holds a component when it has the component's engine file (``Component.engine``, the
TensorRT engine of that name, ``llm.engine`` for ``llm.onnx``, or the fused backend's
``llm.fused.safetensors``) and a ``config.json``. Any other engine file (``*.onnx``,
``*.engine``, ``*.fused.safetensors``) up to two directory levels below the engine dir is left
out of the graph and reported, so a misplaced engine is never silently dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from edgeomni.export.family import Component

log = logging.getLogger("edge-build")

BACKBONE = "llm"
BACKBONE_PLACES = (".", "thinker", "llm")
ENCODERS = ("audio", "visual")
FUSED_SUFFIX = ".fused.safetensors"  # the fused backend's engine files (builder/fused.py)
ENGINE_SUFFIXES = (".onnx", ".engine", FUSED_SUFFIX)
SCAN_DEPTH = 2  # directory levels below the engine dir that are scanned for stray engines


@dataclass(frozen=True)
class Discovery:
    """What --graph-only found: the components it will put in the graph, and what it did not."""

    found: Mapping[str, str]  # component name -> its dir relative to the engine dir ("." = root)
    missing: Mapping[str, tuple[str, ...]]  # component name -> the places that were looked in
    left_out: tuple[str, ...] = field(default=())  # engine files (relative) found elsewhere
    notes: tuple[str, ...] = field(default=())  # one line per left-out file, saying why


def places(component: Component) -> tuple[str, ...]:
    """Where the rules look for this component's engine, in order (relative, '/'-separated)."""
    if component.name == BACKBONE:
        cands: tuple[str, ...] = BACKBONE_PLACES
    elif component.name in ENCODERS:
        cands = (component.name, f"multimodal/{component.name}")
    else:
        cands = (component.name,)
    own = Path(component.subdir).as_posix()
    return cands if own in cands else (*cands, own)


def shown(place: str) -> str:
    """A place as the logs write it: '.' for the engine dir, 'talker/' for a subdirectory."""
    return "." if place == "." else f"{place}/"


def engine_names(component: Component) -> tuple[str, ...]:
    """The files that hold a component's engine: its ONNX file, the TensorRT engine of that
    name, the fused backend's weights (``llm.fused.safetensors`` for ``llm.onnx``)."""
    stem = Path(component.engine).stem
    return (component.engine, f"{stem}.engine", f"{stem}{FUSED_SUFFIX}")


def _engine_in(engine_dir: Path, place: str, component: Component) -> str | None:
    """The component's engine file in this place (beside a config.json), or None."""
    folder = engine_dir / place
    if not (folder / "config.json").is_file():
        return None
    return next((e for e in engine_names(component) if (folder / e).is_file()), None)


def scan(engine_dir: Path, depth: int = SCAN_DEPTH) -> Iterator[Path]:
    """Every file in the engine dir and in directories up to ``depth`` levels below it."""
    level = [engine_dir]
    for d in range(depth + 1):
        subdirs: list[Path] = []
        for folder in level:
            try:
                entries = sorted(folder.iterdir())
            except OSError:
                continue
            for entry in entries:
                if entry.is_file():
                    yield entry
                elif entry.is_dir() and d < depth:
                    subdirs.append(entry)
        level = subdirs


def engine_files(engine_dir: Path) -> list[str]:
    """Engine files up to two levels below the engine dir, relative and '/'-separated."""
    return [
        p.relative_to(engine_dir).as_posix()
        for p in scan(engine_dir)
        if p.name.endswith(ENGINE_SUFFIXES)
    ]


def tensor_parallel_markers(engine_dir: Path) -> list[str]:
    """Signs of a tensor-parallel build (per-rank configs or engines), which a graph cannot run."""
    return [
        p.relative_to(engine_dir).as_posix()
        for p in scan(engine_dir)
        if (p.name.startswith("config_world") and p.name.endswith(".json"))
        or (p.name.endswith(ENGINE_SUFFIXES) and "_rank" in p.name)
    ]


def discover(engine_dir: Path, components: Sequence[Component]) -> Discovery:
    """Find each component's engine where the rules above allow it; log what was left out."""
    engine_dir = Path(engine_dir)
    found: dict[str, str] = {}
    missing: dict[str, tuple[str, ...]] = {}
    used: set[str] = set()
    for comp in components:
        where = places(comp)
        hit = next((p for p in where if _engine_in(engine_dir, p, comp)), None)
        if hit is None:
            missing[comp.name] = where
            continue
        found[comp.name] = hit
        used.add((Path(hit) / str(_engine_in(engine_dir, hit, comp))).as_posix())
        log.info("found %s engine in %s", comp.name, shown(hit))

    left_out: list[str] = []
    notes: list[str] = []
    for rel in engine_files(engine_dir):
        if rel in used:
            continue
        left_out.append(rel)
        note = f"{rel} left out of the graph: {_why_left_out(rel, components, found)}"
        notes.append(note)
        log.warning("%s", note)
    return Discovery(found, missing, tuple(left_out), tuple(notes))


def _why_left_out(rel: str, components: Sequence[Component], found: Mapping[str, str]) -> str:
    """Name the component a stray engine probably belongs to, and where that one is looked for."""
    folder = Path(rel).parent.as_posix()
    owner = next((c for c in components if folder in places(c)), None)
    if owner is None:
        owner = next((c for c in components if c.name == Path(folder).name), None)
    if owner is None:
        return "not a place --graph-only looks for an engine"
    if owner.name in found:
        return f"{owner.name} was already found in {shown(found[owner.name])}"
    if folder in places(owner):
        return f"{owner.name} is looked for as {owner.engine} beside a config.json"
    return f"{owner.name} is looked for in {', '.join(map(shown, places(owner)))} only"
