"""The TensorRT backends: TensorRT 10/11 (module ``tensorrt``) and TensorRT-RTX (``tensorrt_rtx``),
one builder over the API they share.

Each component's exported ONNX has its plugin ops lowered for TensorRT (plugins/: attention as
ONNX Attention with the KV cache updated in place by TensorScatter, which the parsers of
TensorRT >= 10.15 and TensorRT-RTX >= 1.7 read; rotary as ONNX RotaryEmbedding), its fixed
dimensions (the
KV cache's capacity) made static, and is parsed into a strongly typed network (precision
comes from the ONNX types: ``--dtype`` decides it at export). One optimisation profile is
built per phase the family declares (``dim_ranges``: decode and prefill for decoders,
windows and whole utterances for a vocoder); the engine's config.json records the flavour and
version, the GPU's compute capability, the profiles and the lowering, which the runtime checks at
load. Before parsing, builder/tensorrt_graph.py edits the graph into forms TensorRT's builder
takes (the same values). The timing cache is kept beside the engine and seeds later builds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeomni.builder.errors import BuildError
from edgeomni.builder.tensorrt_graph import allow_decomposed_attention, conv1d_as_conv2d
from edgeomni.export.common.shapes import DimRanges, Range
from edgeomni.export.family import BuildArgs

log = logging.getLogger("edge-build")
Shape = tuple[int, ...]
Profiles = dict[str, dict[str, tuple[Shape, Shape, Shape]]]  # phase -> input -> (min, opt, max)

ENGINE_SUFFIX = ".engine"
TIMING_CACHE = "timing.cache"


@dataclass(frozen=True)
class Flavour:
    """One TensorRT product: where its Python module is, and its first version whose ONNX parser
    reads Attention (opset 23) and TensorScatter (24), which the attention lowering writes."""

    backend: str
    label: str
    modules: tuple[str, ...]
    native_since: tuple[int, int]
    install: str

    def supports(self, version: str) -> bool:
        return version_tuple(version)[:2] >= self.native_since


FLAVOURS = {
    "tensorrt": Flavour(
        "tensorrt", "TensorRT", ("tensorrt",), (10, 15),
        "install TensorRT 10.15 or later with its Python bindings (JetPack 7.2 has 10.16)",
    ),
    "tensorrt-rtx": Flavour(
        "tensorrt-rtx", "TensorRT-RTX", ("tensorrt_rtx", "tensorrt_rtx_bindings"), (1, 7),
        "pip install tensorrt-rtx (1.7 or later; the libraries must be on LD_LIBRARY_PATH)",
    ),
}  # fmt: skip


def version_tuple(text: str) -> tuple[int, ...]:
    """Version text as numbers: "10.16.1.11" -> (10, 16, 1); a piece's leading digits only ("0rc1" -> 0)."""
    import re

    return tuple(int(re.match(r"\d*", p).group() or 0) for p in text.split(".")[:3])


def backend(args: BuildArgs) -> Callable[..., dict[str, Any]]:
    """The build of each component (plugins/backends.py), once this machine's TensorRT is
    found new enough: before any export, a missing or old TensorRT is a bad input."""
    load(args.backend)
    return build_engine


def load(backend: str) -> tuple[Any, Flavour]:
    """The flavour's Python module, checked new enough for the attention lowering; BuildError
    says what to install otherwise."""
    import importlib

    flavour = FLAVOURS[backend]
    errors = []
    for name in flavour.modules:
        try:
            trt = importlib.import_module(name)
            break
        except ImportError as e:  # a module that is there but cannot load its libraries, too
            errors.append(f"{name}: {e}")
    else:
        raise BuildError(
            f"--backend {backend} needs {flavour.label}'s Python module, which does not import "
            f"here ({'; '.join(errors)}): {flavour.install}"
        )
    version = str(getattr(trt, "__version__", "0"))
    if not flavour.supports(version):
        raise BuildError(
            f"{flavour.label} {version} is older than {'.'.join(map(str, flavour.native_since))}"
            f", the first version edgeomni's attention lowering takes: {flavour.install}"
        )
    return trt, flavour


def engine_name(onnx_name: str) -> str:
    return Path(onnx_name).with_suffix(ENGINE_SUFFIX).name


# the plugin lowerings' record in config.json: ONNX's own Attention and RotaryEmbedding
LOWERING = {"attention": "native", "rotary": "native"}


def prepare(
    model: Any, ranges: DimRanges, base_dir: Path | None = None
) -> tuple[Profiles, dict[str, Any]]:
    """A raw component model (edgeomni ops) as TensorRT's parser gets it, edited in place: plugin
    ops lowered, fixed dims static, the graph edits of builder/tensorrt_graph.py. Returns its
    optimisation profiles and the lowering record for config.json (without the version floor)."""
    from edgeomni.plugins import lower_model

    lower_model(model, "tensorrt", LOWERING, base_dir=base_dir)
    profiles = input_profiles(model, ranges)
    fix_static_dims(model, ranges)
    return profiles, {
        **LOWERING,
        "decomposable_attention_nodes": allow_decomposed_attention(model),
        "conv1d_as_conv2d": conv1d_as_conv2d(model),
    }


def build_engine(
    raw: Path,
    out_path: Path,
    args: BuildArgs,
    ranges: DimRanges | None = None,
    seeds: Sequence[Path] = (),
) -> dict[str, Any]:
    """raw ONNX (edgeomni ops) -> lowered for TensorRT -> serialized engine beside out_path
    (``llm.onnx`` -> ``llm.engine``); returns the fields the engine's config.json gains.
    ``seeds``: folders of engines built before (this component's in the engine dir the build
    replaces, this build's earlier components) whose timing caches this build starts from."""
    import onnx

    if not ranges:
        raise BuildError(f"{out_path.name}: its family gives no dimension ranges (dim_ranges)")
    trt, flavour = load(args.backend)
    model = onnx.load(str(raw), load_external_data=False)
    profiles, lowering = prepare(model, ranges, raw.parent)
    lowered = raw.with_name(raw.stem + ".tensorrt.onnx")
    onnx.save(model, str(lowered))  # external tensors keep pointing at raw's data file

    logger = _logger(trt)
    builder = trt.Builder(logger)
    flag = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flag)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(lowered)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise BuildError(
            f"{flavour.label} {trt.__version__} could not parse {out_path.name}: "
            + "; ".join(errors[:5])
        )
    config = builder.create_builder_config()
    for phase, shapes in profiles.items():
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            profile.set_shape(name, lo, opt, hi)
        if config.add_optimization_profile(profile) < 0:
            raise BuildError(f"{out_path.name}: {flavour.label} refused the {phase} profile")
    reused = seed_timing_cache(config, seeds)
    start = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - start
    if plan is None:
        raise BuildError(
            f"{flavour.label} {trt.__version__} could not build {out_path.name}: "
            + (logger.errors()[-1] if logger.errors() else "no reason given (run with -v)")
        )
    engine_path = out_path.with_name(engine_name(out_path.name))
    engine_path.write_bytes(bytes(plan))
    out_path.with_name(TIMING_CACHE).write_bytes(bytes(config.get_timing_cache().serialize()))
    return {
        "engine": engine_path.name,
        "lowering": {
            **lowering,
            "tensorrt_min": ".".join(map(str, flavour.native_since)),
        },
        "tensorrt": {
            "flavour": flavour.backend,
            "version": str(trt.__version__),
            "compute_capability": compute_capability(),
            "profiles": {
                phase: {n: list(map(list, s)) for n, s in shapes.items()}
                for phase, shapes in profiles.items()
            },
            "network_layers": int(network.num_layers),
            "build_seconds": round(seconds, 2),
            "timing_cache": TIMING_CACHE,
            "timing_caches_reused": reused,
        },
    }


def seed_timing_cache(config: Any, seeds: Sequence[Path]) -> int:
    """Start the build's timing cache from the seeds' (TensorRT then skips timing the layers they
    timed: a rebuild, or a component sharing layer shapes with an earlier one, builds faster).
    A cache TensorRT will not take (another GPU or version, a damaged file) is left out, with a
    warning: it costs time, never the build. Returns how many were taken."""
    cache = config.create_timing_cache(b"")
    taken = 0
    for folder in dict.fromkeys(Path(s).resolve() for s in seeds):
        path = folder / TIMING_CACHE
        if not path.is_file():
            continue
        try:
            other = config.create_timing_cache(path.read_bytes())
            ok = other is not None and cache.combine(other, False)
        except Exception as e:  # TensorRT raises on a cache it cannot read
            log.warning("timing cache %s not reused: %s", path, e)
            continue
        if not ok:
            log.warning("timing cache %s not reused: made for another GPU or version", path)
            continue
        taken += 1
    config.set_timing_cache(cache, ignore_mismatch=False)
    return taken


def input_profiles(model: Any, ranges: DimRanges) -> Profiles:
    """phase -> input -> (min, opt, max) shapes, from each input's named dims and the phase's
    ranges; BuildError names a dim the family gives no range for."""
    out: Profiles = {}
    for phase, dims in ranges.items():
        shapes = {}
        for inp in model.graph.input:
            lo, opt, hi = [], [], []
            for axis, d in enumerate(inp.type.tensor_type.shape.dim):
                r = _dim_range(d, dims, inp.name, axis, phase)
                lo.append(r[0])
                opt.append(r[1])
                hi.append(r[2])
            shapes[inp.name] = (tuple(lo), tuple(opt), tuple(hi))
        out[phase] = shapes
    return out


def _dim_range(d: Any, dims: Mapping[str, Range], name: str, axis: int, phase: str) -> Range:
    if d.HasField("dim_value"):
        return (d.dim_value,) * 3  # type: ignore[return-value]
    if d.dim_param and d.dim_param in dims:
        lo, opt, hi = dims[d.dim_param]
        if not 1 <= lo <= opt <= hi:
            raise BuildError(f"dimension {d.dim_param!r}: range {lo}..{hi} (opt {opt}) is invalid")
        return (lo, opt, hi)
    what = repr(d.dim_param) if d.dim_param else "an unnamed dimension"
    raise BuildError(
        f"input {name!r}, axis {axis}: {what} has no range in the family's {phase!r} phase"
    )


def fix_static_dims(model: Any, ranges: DimRanges) -> list[str]:
    """Dims fixed in every phase (min == max; the KV cache's capacity) become static in the
    model's inputs and outputs: TensorRT's in-place cache update needs a static capacity."""
    fixed: dict[str, int] = {}
    for dims in ranges.values():
        for name, (lo, _, hi) in dims.items():
            fixed.setdefault(name, lo)
            if lo != hi or fixed[name] != lo:
                fixed[name] = -1
    fixed = {k: v for k, v in fixed.items() if v > 0}
    for value in (*model.graph.input, *model.graph.output):
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param in fixed:
                d.dim_value = fixed[d.dim_param]
    return sorted(fixed)


def compute_capability() -> str | None:
    """The GPU this build ran on, as "9.0" (TensorRT engines are specific to it); None when
    cuda-python cannot say."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return None
    err, props = cudart.cudaGetDeviceProperties(0)
    if int(err) != 0:
        return None
    return f"{props.major}.{props.minor}"


def _logger(trt: Any) -> Any:
    """A TensorRT logger that keeps the errors (for BuildError) and passes the rest to
    edge-build's log (TensorRT's info lines at -v)."""

    class Logger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self._errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.INTERNAL_ERROR, trt.ILogger.ERROR):
                self._errors.append(msg)
                log.error("%s", msg)
            elif severity == trt.ILogger.WARNING:
                log.warning("%s", msg)
            else:
                log.debug("%s", msg)

        def errors(self) -> list[str]:
            return list(self._errors)

    return Logger()
