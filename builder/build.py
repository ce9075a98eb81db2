"""Orchestrate one build: checkpoint -> export -> lower -> engine -> artifacts -> graph."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import posixpath
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edgeomni.builder import interrupts, manifest
from edgeomni.builder.errors import BuildError
from edgeomni.builder.workspace import Workspace, workspace
from edgeomni.export.common.checkpoint import open_checkpoint
from edgeomni.export.family import BuildArgs, Component
from edgeomni.export.registry import family_for
from edgeomni.plugins.backends import BACKENDS, load

GRAPH_FILE = "multistage_config.json"
log = logging.getLogger("edge-build")


# (raw ONNX, engine path, args, dim ranges, seeds) -> config.json fields; seeds are folders of
# engines built before (the replaced engine dir's, this build's earlier components') that a
# backend may learn from (TensorRT's timing cache). A backend's build (plugins/backends.py's
# table) makes one from the build's args, refusing before any export what it lacks
Build = Callable[[Path, Path, BuildArgs, Any, Sequence[Path]], dict[str, Any]]
CODE2WAV_STREAMING = ("stateful", "windows")


@contextmanager
def step(what: str) -> Any:
    """Progress for the long steps: one line when a step starts, one with its time when done."""
    log.info("%s ...", what)
    start = time.perf_counter()
    yield
    interrupts.check()  # in case the library that ran the step swallowed an interrupt
    log.info("%s done in %.1f s", what, time.perf_counter() - start)


def select_components(
    available: Sequence[Component],
    wanted: Sequence[str] | None,
    left_out: Mapping[str, str] | None = None,
) -> list[Component]:
    """The components to build: ``wanted`` by name, or all of them but those ``left_out``
    (name -> why this build leaves it out, which naming it reports)."""
    left_out = left_out or {}
    if not wanted or list(wanted) == ["all"]:
        return [c for c in available if c.name not in left_out]
    if "all" in wanted:
        raise BuildError("--components: 'all' cannot be combined with component names")
    refused = [f"{w} ({left_out[w]})" for w in wanted if w in left_out]
    if refused:
        raise BuildError(f"--components: this build leaves out {', '.join(refused)}")
    by_name = {c.name: c for c in available}
    unknown = [w for w in wanted if w not in by_name]
    if unknown:
        raise BuildError(
            f"--components: unknown {', '.join(unknown)}; this checkpoint has {', '.join(by_name)}"
        )
    return [c for c in available if c.name in wanted]


def check_flags(args: BuildArgs) -> None:
    """The size flags, alone and together; before anything is read or exported."""
    for flag, value in (
        ("--max-batch-size", args.max_batch_size),
        ("--max-input-len", args.max_input_len),
        ("--max-kv-cache-capacity", args.max_kv_cache_capacity),
    ):
        if value < 1:
            raise BuildError(f"{flag} must be at least 1, got {value}")
    spec = BACKENDS.get(args.backend)
    if spec is None:
        raise BuildError(f"unknown backend {args.backend!r}; choose {', '.join(BACKENDS)}")
    if args.device not in spec.devices:
        raise BuildError(f"--backend {args.backend} builds engines for a GPU: use --device cuda")
    if args.backend == "fused":
        from edgeomni.builder import fused

        fused.check_args(args)
    if args.code2wav_streaming not in CODE2WAV_STREAMING:
        raise BuildError(
            f"--code2wav-streaming {args.code2wav_streaming!r}: choose "
            f"{' or '.join(CODE2WAV_STREAMING)}"
        )
    if args.code2wav_streaming == "stateful" and args.backend.startswith("tensorrt"):
        raise BuildError(
            f"--code2wav-streaming stateful: the stateful code2wav step has no {args.backend} "
            "lowering yet; build it with --backend onnxruntime, or use windows"
        )
    if args.quantization:  # the method, the group and the calibration text, before any export
        from edgeomni.builder import awq, quantize

        quantize.Quantization(args.quantization, args.group_size, args.quantize_lm_head)
        if args.quantization == "int4_awq":
            awq.calibration_texts(Path(args.calibration) if args.calibration else None)
    if args.max_input_len > args.max_kv_cache_capacity:
        raise BuildError(
            f"--max-input-len {args.max_input_len} exceeds --max-kv-cache-capacity "
            f"{args.max_kv_cache_capacity}: a prompt must fit in the KV cache"
        )


def left_out(hooks: Any, ckpt: Any, args: BuildArgs) -> Mapping[str, str]:
    """The family's optional ``left_out``: components these args leave out, with the reason."""
    hook = getattr(hooks, "left_out", None)
    return hook(ckpt, args) if callable(hook) else {}


def preflight(hooks: Any, ckpt: Any, selected: Sequence[Component], args: BuildArgs) -> None:
    """The family's optional check of what needs only the checkpoint's config and small files,
    so a missing tokenizer fails in a second, not after the exports."""
    hook = getattr(hooks, "preflight", None)
    if callable(hook):
        hook(ckpt, tuple(selected), args)


def warn_position_limits(
    hooks: Any, ckpt: Any, selected: Sequence[Component], args: BuildArgs
) -> None:
    """One line when --max-kv-cache-capacity lets a decoder's positions run past the limit its
    config declares (the family's optional ``position_limits``). A warning, not a refusal:
    every family's positions are rotary (default RoPE, the only kind exported), which computes
    the same past the limit as transformers does; the model was just not trained there."""
    hook = getattr(hooks, "position_limits", None)
    limits = hook(ckpt, tuple(selected)) if callable(hook) else {}
    past = [
        f"{name} {limit} ({key})"
        for name, (key, limit) in limits.items()
        if args.max_kv_cache_capacity > limit
    ]
    if past:
        log.warning(
            "--max-kv-cache-capacity %d is past the model's position limit: %s; the model was "
            "not trained on positions past it",
            args.max_kv_cache_capacity,
            ", ".join(past),
        )


def build(
    model_dir: Path,
    engine_dir: Path,
    args: BuildArgs,
    components: Sequence[str] | None = None,
) -> Path | None:
    """Build every selected component into engine_dir; returns the graph file (None if no graph).

    Cheap checks come first (flags, checkpoint, the family's preflight, the engine dir); the
    engines are then built in a workspace beside engine_dir (builder/workspace.py) and swapped
    in only when every step succeeded, so a failed or interrupted build leaves a previous one
    untouched, and nothing of the user's in engine_dir is ever deleted.
    """
    check_flags(args)
    backend: Build = load(BACKENDS[args.backend].build)(args)
    ckpt = open_checkpoint(model_dir)
    family = family_for(ckpt.model_type)
    hooks = family.hooks()
    ckpt.weight_files  # noqa: B018 - fail on missing or unreadable weights before building
    selected = select_components(hooks.components(ckpt), components, left_out(hooks, ckpt, args))
    check_checkpoint_quantization(ckpt, args)
    preflight(hooks, ckpt, selected, args)
    if args.quantization == "int4_awq":
        from edgeomni.builder import awq_graph

        awq_graph.check_requests(hooks, ckpt, selected, args)
    warn_position_limits(hooks, ckpt, selected, args)
    engine_dir = engine_dir.resolve()
    with workspace(engine_dir) as ws:
        log.info("building %s (%s family) into %s", model_dir, family.name, engine_dir)
        graph_path = _build_in(ws, hooks, ckpt, selected, backend, args)
        ordinary_modes(ws.staging)
        manifest.write(ws.staging, manifest.record(ws.staging))  # last: it lists all the rest
        shutil.rmtree(ws.work)  # the raw ONNX, before the swap, so what runs held is short
        ws.commit()
    return engine_dir / GRAPH_FILE if graph_path else None


def estimate_only(model_dir: Path, args: BuildArgs, components: Sequence[str] | None = None) -> str:
    """edge-build --estimate: the memory table for this build, from config.json alone (no
    weights read, nothing exported or written)."""
    from edgeomni.builder import estimate

    check_flags(args)
    ckpt = open_checkpoint(model_dir)
    hooks = family_for(ckpt.model_type).hooks()
    selected = select_components(hooks.components(ckpt), components, left_out(hooks, ckpt, args))
    check_checkpoint_quantization(ckpt, args, log_it=False)
    rows = estimate.estimate(ckpt, hooks, selected, args)
    return estimate.report(model_dir, rows, args, ckpt)


def ordinary_modes(root: Path) -> None:
    """Files 0644 and folders 0755, as a copied folder would have: some writers make theirs
    private (safetensors' save_file writes 0600), and an engine dir is often built by one
    user and run by another (a service account on the board)."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


def _build_in(
    ws: Workspace,
    hooks: Any,
    ckpt: Any,
    selected: Sequence[Component],
    backend: Build,
    args: BuildArgs,
) -> Path | None:
    """Export, build and write each component into the workspace's staging dir, then the graph."""
    done: list[Path] = []
    later = []  # int4_awq's decoders whose inputs the graph makes: calibrated once it is built

    def build_engine(comp: Component, model: Path, out_dir: Path, fields: dict[str, Any]) -> None:
        with step(f"build {comp.name} engine ({args.backend}, {args.device})"):
            seeds = [ws.engine_dir / comp.subdir, *(d for d in done if d != out_dir)]
            built = backend(model, out_dir / comp.engine, args,
                            dim_ranges(hooks, ckpt, comp, args), seeds)  # fmt: skip
        record_build(out_dir, {**(built or {}), **fields})

    for comp in selected:
        out_dir = ws.staging / comp.subdir
        out_dir.mkdir(parents=True, exist_ok=True)
        with step(f"export {comp.name} to ONNX"):
            exported = hooks.export_component(ckpt, comp, ws.work / comp.name, args)
        # the artifacts first: int4_awq calibrates with the stage's tokenizer and table
        with step(f"write {comp.name} artifacts"):
            hooks.write_artifacts(ckpt, comp, out_dir, args)
        in_graph = _awq_in_graph(comp, args, exported)  # rounded plainly now, calibrated later
        raw, quantized = quantize_component(exported, comp, args, out_dir, ckpt, in_graph)
        build_engine(comp, raw, out_dir, quantized)
        done.append(out_dir)
        if in_graph and quantized.get("quantization"):
            later.append((comp, exported, out_dir))
    warn_unplaced(ckpt, args)
    graph = write_graph(hooks, ckpt, ws.staging, selected, args)
    if later:
        from edgeomni.builder import awq_graph

        hook = getattr(hooks, "calibration_fields", None)
        fields = hook(ckpt) if callable(hook) else {}
        awq_graph.requantize(ws.staging, graph, later, args, build_engine, fields)
    return graph


def _awq_in_graph(comp: Component, args: BuildArgs, exported: Path) -> bool:
    """int4_awq on a decoder that is not the text model: its inputs are the graph's to make."""
    import onnx

    from edgeomni.builder.quantize import is_decoder
    from edgeomni.export.registry import LLM_RUNNER

    if args.quantization != "int4_awq" or comp.runner == LLM_RUNNER:
        return False
    return is_decoder(onnx.load(str(exported), load_external_data=False))


def quantize_component(
    raw: Path, comp: Component, args: BuildArgs, artifacts: Path, ckpt: Any = None,
    plainly: bool = False,
) -> tuple[Path, dict[str, Any]]:  # fmt: skip
    """The exported graph with its weights quantized as --quantization asks (builder/quantize.py)
    or as the checkpoint stores them (builder/prequant.py), and the config.json field that says
    so; the graph as it is for a float build or a component the pass leaves float.
    ``plainly``: round as int4_rtn for now (int4_awq calibrates it once the graph is built)."""
    stored: dict[str, Any] = {}
    pq = getattr(ckpt, "prequantized", None)
    if pq is not None and pq.scheme.int4:
        raw, stored = _prequantized(raw, comp, pq)
        if not args.quantization:
            return raw, ({"quantization": stored} if stored else {})
    if not args.quantization:
        return raw, {}
    from edgeomni.builder import quantize

    calibration = Path(args.calibration) if args.calibration else None
    spec = quantize.Quantization(
        args.quantization, args.group_size, args.quantize_lm_head, calibration,
        args.quantize_encoders,
    )  # fmt: skip
    # int4_awq calibrates on text only where the text model's runner embeds tokens with the
    # stage's own table; other decoders take what the graph hands them
    from edgeomni.export.registry import LLM_RUNNER

    text = artifacts if comp.runner == LLM_RUNNER else None
    if plainly:  # int4_awq calibrates it once the graph is built (builder/awq_graph.py)
        spec = dataclasses.replace(spec, method="int4_rtn")
    with step(f"quantize {comp.name} ({spec.method}, group {spec.group_size})"):
        out = raw.with_name(raw.stem + ".rounded.onnx")
        report = quantize.quantize_file(raw, out, spec, text)
    if report is None:
        log.info("%s stays float: --quantization applies to decoders (and with "
                 "--quantize-encoders to every component's linear layers)", comp.name)  # fmt: skip
        return raw, {"quantization": stored or None}
    if stored:  # an int4 checkpoint's weights as stored, and what --quantization rounded
        return out, {"quantization": {**stored, "rounded": report}}
    return out, {"quantization": report}


def _prequantized(raw: Path, comp: Component, pq: Any) -> tuple[Path, dict[str, Any]]:
    """The checkpoint's int4 weights of this component into its graph, as stored; and what
    config.json records of them (empty when the component has none)."""
    from edgeomni.builder import prequant

    with step(f"int4 weights of {comp.name} from the checkpoint ({pq.scheme.method})"):
        out = raw.with_name(raw.stem + ".stored.onnx")
        if pq.row_index is None:
            pq.row_index = prequant.RowIndex(pq.linear, pq.linear_names())
        report = prequant.apply_file(raw, out, pq.row_index)
    if report is None:
        return raw, {}
    pq.placed.update(report.pop("placed"))
    report = {"method": pq.scheme.method, "source": "checkpoint", "bits": 4, **report}
    return (out if report["weights"] else raw), report


def warn_unplaced(ckpt: Any, args: BuildArgs) -> None:
    """One line for the checkpoint's int4 weights that no engine holds as stored."""
    pq = getattr(ckpt, "prequantized", None)
    if pq is None or not pq.scheme.int4:
        return
    left = sorted((pq.served & set(pq.linear_names())) - pq.placed)
    if left:
        then = ("rounded anew by --quantization int4_rtn where it reaches them"
                if args.quantization else "add --quantization int4_rtn to round them to int4")  # fmt: skip
        log.warning(
            "%d int4 weights of the checkpoint are not held as stored: they are read as their "
            "dequantized float values (no MatMul of the graphs holds them as they are; MoE "
            "experts are packed per block), %s; first: %s", len(left), then, ", ".join(left[:3]),
        )  # fmt: skip


def check_checkpoint_quantization(ckpt: Any, args: BuildArgs, log_it: bool = True) -> None:
    """An int4 checkpoint builds with its weights as stored (--quantization int4_rtn rounds only
    what it left float); an FP8 one is read to the engine's dtype. Its tensors must be stored
    as its quantization_config declares (checked from the shards' headers; an --estimate of a
    checkpoint without its weights goes by the config alone)."""
    from edgeomni.export.common.checkpoint import CheckpointError
    from edgeomni.export.common.prequantized import check_stored, fp8_note, stored_dtypes

    scheme = ckpt.quantization
    if scheme is None:
        return
    try:
        files = ckpt.weight_files
    except CheckpointError:
        if log_it:  # a build needs them (it read them before this); an estimate does not
            raise
        files = None
    if files is not None:
        check_stored(scheme, stored_dtypes(files))
    if scheme.int4 and args.quantization and args.quantization != "int4_rtn":
        raise BuildError(
            f"--quantization {args.quantization}: {ckpt.path} is already quantized "
            f"({scheme.describe()}) and builds with its own int4 weights; only int4_rtn may "
            "round what it left float (drop the flag, or use int4_rtn)"
        )
    if not log_it:
        return
    if scheme.method == "fp8":
        log.warning(fp8_note(ckpt, args.dtype))
    else:
        log.info("%s: %s weights, built as stored (no new rounding)%s", ckpt.path,
                 scheme.describe(), "; --quantization int4_rtn rounds the float rest"
                 if args.quantization else "")  # fmt: skip


class NoGraph(BuildError):
    """Why no graph can be written for these engines; `edge-build --graph-only` exits 2 with it."""


def no_graph_reason(hooks: Any, ckpt: Any, components: Mapping[str, str]) -> str:
    """The family's own reason (optional hook) or, by default, the components it is missing."""
    hook = getattr(hooks, "no_graph_reason", None)
    reason = hook(components) if callable(hook) else None
    if reason:
        return str(reason)
    missing = [c.name for c in hooks.components(ckpt) if c.name not in components]
    text = (
        f"the {ckpt.model_type} family cannot run components "
        f"{', '.join(components) or '(none)'} as a graph"
    )
    return text + (f" without {', '.join(missing)}" if missing else "")


def topology(hooks: Any, ckpt: Any, components: Mapping[str, str], args: BuildArgs | None) -> Any:
    """The family's graph for these components (name -> artifact dir); NoGraph says why not."""
    graph = hooks.multistage_topology(ckpt, components, args)
    if graph is None:
        raise NoGraph(no_graph_reason(hooks, ckpt, components))
    return graph


def checked_graph(graph: Any, engine_dir: Path) -> Any:
    """Stamp each stage's limits from its engine's config.json, and validate."""
    from edgeomni import graph_schema

    graph = stamp_limits(graph, engine_dir)
    graph_schema.validate(graph, engine_dir=engine_dir)
    return graph


def save_graph(graph: Any, engine_dir: Path) -> Path:
    """The checked graph, saved atomically."""
    from edgeomni import graph_schema

    path = engine_dir / GRAPH_FILE
    graph_schema.save(checked_graph(graph, engine_dir), path)
    return path


def dim_ranges(hooks: Any, ckpt: Any, comp: Component, args: BuildArgs) -> Any:
    """The sizes the family's runtime calls this component with (export/common/shapes.py), or
    None for a family without the hook (a TensorRT build then refuses it)."""
    hook = getattr(hooks, "dim_ranges", None)
    return hook(ckpt, comp, args) if callable(hook) else None


def record_build(out_dir: Path, fields: dict[str, Any] | None) -> None:
    """Add what the backend's build chose to the engine's config.json: the lowering (what it
    assumed of the backend; the runtime checks it, and adapts how it batches prefill), and for
    TensorRT the engine file and its profiles."""
    if not fields:
        return
    path = out_dir / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(fields)
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def write_graph(
    hooks: Any, ckpt: Any, engine_dir: Path, built: Sequence[Component], args: BuildArgs | None
) -> Path | None:
    """Ask the family for its topology, stamp each stage's limits, validate, and save."""
    try:
        graph = topology(hooks, ckpt, {c.name: c.subdir for c in built}, args)
    except NoGraph as e:
        log.warning("no %s written: %s", GRAPH_FILE, e)
        return None
    return save_graph(graph, engine_dir)


def unrun_components(
    hooks: Any, graph: Any, found: Mapping[str, str], available: Sequence[Component]
) -> list[str]:
    """Found components that no stage runs: no stage has their dir as artifact, and the stage
    the family's optional `served_by` names (default: a stage with the component's runner)
    is not in the graph."""
    artifacts = {posixpath.normpath(s.artifact) for s in graph.stages}
    stage_ids = {s.id for s in graph.stages}
    runners = {s.runner for s in graph.stages}
    served: Mapping[str, str] = getattr(hooks, "served_by", None) or {}
    runner_of = {c.name: c.runner for c in available}
    unrun = []
    for name, rel in found.items():
        if posixpath.normpath(rel) in artifacts:
            continue
        by_runner = served[name] in stage_ids if name in served else runner_of[name] in runners
        if not by_runner:
            unrun.append(name)
    return unrun


def graph_only(model_dir: Path, engine_dir: Path, *, raise_no_graph: bool = False) -> Path | None:
    """Write multistage_config.json for the engines already in engine_dir, building nothing.

    Engines from other tools come without a graph; this finds them by the rules in
    builder/discover.py and asks the checkpoint's family for their topology (args=None).
    Returns the graph file, or None after logging why no graph can be written (or raises
    NoGraph with the reason when raise_no_graph, for the CLI's exit message).
    """
    try:
        return _graph_only(Path(model_dir), Path(engine_dir).resolve())
    except NoGraph as e:
        if (Path(engine_dir) / GRAPH_FILE).is_file():
            e = NoGraph(f"{e} (the {GRAPH_FILE} already there was left as it was)")
        if raise_no_graph:
            raise e from None
        log.warning("no %s written: %s", GRAPH_FILE, e)
        return None


def _graph_only(model_dir: Path, engine_dir: Path) -> Path:
    """graph_only's work; every reason not to write a graph is a NoGraph, raised here."""
    from edgeomni import graph_schema
    from edgeomni.builder.discover import (
        BACKBONE,
        discover,
        places,
        shown,
        tensor_parallel_markers,
    )

    ckpt = open_checkpoint(model_dir)
    family = family_for(ckpt.model_type)
    hooks = family.hooks()
    if not engine_dir.is_dir():
        raise BuildError(f"--engine-dir {engine_dir} is not a directory")
    log.info("writing the graph for the engines in %s (%s family)", engine_dir, family.name)
    markers = tensor_parallel_markers(engine_dir)
    if markers:
        listed = ", ".join(markers[:3]) + (", ..." if len(markers) > 3 else "")
        raise NoGraph(
            f"{engine_dir} holds a tensor-parallel build ({listed}); a multi-stage graph runs "
            "each stage's engine on one device, without tensor parallelism"
        )
    available = hooks.components(ckpt)
    disc = discover(engine_dir, available)
    stray = f"; left out: {', '.join(disc.left_out)}" if disc.left_out else ""

    def looked(name: str) -> str:
        return f"{name} (looked in {', '.join(map(shown, disc.missing[name]))})"

    for name, rel in disc.found.items():
        cfg = _read_json(engine_dir / rel / "config.json")
        built_for = cfg.get("model_type") if isinstance(cfg, dict) else None
        if built_for and built_for != ckpt.model_type:
            raise NoGraph(
                f"the {name} engine in {shown(rel)} was built from a {built_for} checkpoint, "
                f"but --model-dir is {ckpt.model_type}"
            )
    backbone = next((c for c in available if c.name == BACKBONE), None)
    if backbone is not None and BACKBONE not in disc.found:
        where = ", ".join(map(shown, places(backbone)))
        raise NoGraph(
            f"a {ckpt.model_type} build without its {BACKBONE} component cannot run as a graph: "
            f"no {backbone.engine} beside a config.json in {where}{stray}"
        )
    if not disc.found:
        raise NoGraph(f"no {ckpt.model_type} engine found in {engine_dir}{stray}")
    found = {c.name: disc.found[c.name] for c in available if c.name in disc.found}
    not_found = f"; not found: {', '.join(looked(n) for n in disc.missing)}" if disc.missing else ""
    try:
        graph = topology(hooks, ckpt, found, None)
    except NoGraph as e:
        raise NoGraph(f"{e}{not_found}{stray}") from None
    unrun = unrun_components(hooks, graph, found, available)
    if unrun:
        them = ", ".join(f"{n} (in {shown(found[n])})" for n in unrun)
        stages = ", ".join(s.id for s in graph.stages)
        raise NoGraph(
            f"no stage runs {them}: the {family.name} graph for these engines has only "
            f"stages {stages}{not_found}{stray}"
        )
    for name in disc.missing:
        log.info("no %s engine, left out of the graph: %s", name, looked(name))
    path = engine_dir / GRAPH_FILE
    try:
        graph = checked_graph(graph, engine_dir)
        keep_foreign(path)
        graph_schema.save(graph, path)
        manifest.add(engine_dir, [GRAPH_FILE])  # so a later full build knows it as its own
    except (graph_schema.GraphError, OSError, ValueError) as e:
        raise BuildError(f"cannot write {GRAPH_FILE}: {e}") from e
    log.info(
        "graph stages: %s",
        ", ".join(f"{s.id} ({s.artifact})" for s in graph.stages),
    )
    return path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stamp_limits(graph: Any, engine_dir: Path) -> Any:
    """max_batch and max_seq of each stage come from the limits its engine was built with."""
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


def keep_foreign(path: Path) -> Path | None:
    """A file edge-build did not write (not in the manifest with this sha256) that is about to
    be replaced is kept as NAME.orig (.orig.1, .orig.2, ... when taken). It is hard-linked
    there, so the file stays in place until the new one replaces it atomically."""
    if not os.path.lexists(path) or manifest.is_own(path.parent, path.name):
        return None
    kept = _free_orig(path)
    try:
        os.link(path, kept, follow_symlinks=False)
    except OSError:  # a file system without hard links
        shutil.copy2(path, kept, follow_symlinks=False)
    log.info("%s was not written by edge-build: kept it as %s", path.name, kept.name)
    return kept


def _free_orig(path: Path) -> Path:
    """NAME.orig, or NAME.orig.1, NAME.orig.2, ... when taken."""
    names = (f"{path.name}.orig" + (f".{n}" if n else "") for n in itertools.count())
    return next(path.with_name(n) for n in names if not os.path.lexists(path.with_name(n)))
