"""edge-build --backend fused: decoders compiled from their exported ONNX graphs into launch
plans of edgeomni's CUDA kernels, the other components built with ONNX Runtime for the CUDA
provider.

A decoder graph the plan holds (builder/fused_plan.py: dense attention layers with a SwiGLU
MLP, float or int4 from the build's one int4 pass, with or without an in-engine sampler)
becomes ``<component>.fused.safetensors``, the weights runtime/fused_engine.py reads, and a
``fused`` table in its config.json: dimensions, options and the plan. Everything else
(encoders, the vocoder, mixture-of-experts and recurrent decoders) is built as ``--backend
onnxruntime --device cuda`` builds it; the log says which backend each component got and why,
and each config.json's ``backend`` records it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.builder.discover import FUSED_SUFFIX as SUFFIX
from edgeomni.builder.errors import BuildError
from edgeomni.builder.fused_plan import INT4_GROUPS
from edgeomni.export.family import BuildArgs

log = logging.getLogger("edge-build")
DTYPES = {"float16": np.float16, "float32": np.float32}


def check_args(args: BuildArgs) -> None:
    """What a fused build needs, before anything is exported."""
    if args.dtype not in DTYPES:
        raise BuildError(f"--backend fused takes --dtype float16 or float32, not {args.dtype}")
    if args.quantization and args.quantization != "int4_rtn":
        raise BuildError(f"--backend fused quantizes with int4_rtn only ({args.quantization}'s "
                         "scales are not in its kernels): use int4_rtn or --backend onnxruntime")  # fmt: skip
    if args.quantization and args.dtype != "float16":
        raise BuildError("--backend fused runs int4 weights in float16 builds: add --dtype float16")
    if args.quantization and args.group_size not in INT4_GROUPS:
        raise BuildError(f"--backend fused takes an int4 --group-size of "
                         f"{', '.join(map(str, INT4_GROUPS))}, not {args.group_size}")  # fmt: skip


def backend(args: BuildArgs) -> Callable[..., dict[str, Any]]:
    """The build of each component (plugins/backends.py)."""
    return build_engine


def build_engine(
    raw: Path, out_path: Path, args: BuildArgs, ranges: Any, seeds: Sequence[Path]
) -> dict[str, Any]:
    """The fused engine of the decoder exported (and int4-quantized, where the build asks) to
    ``raw``: its launch plan and weights, compiled from the graph (builder/fused_plan.py); or
    the ONNX Runtime CUDA build of a graph the plan cannot hold, its reason kept as
    ``fused_refused``. Returns the config.json fields."""
    from edgeomni.builder.fused_plan import Unfused, compile_file

    try:
        spec, tensors = compile_file(raw)
    except Unfused as e:
        from edgeomni.builder.onnxruntime import build_engine as ort_build

        log.info("%s: onnxruntime (cuda), since the fused kernels do not cover it (%s)",
                 out_path.stem, e)  # fmt: skip
        return {"backend": "onnxruntime", "fused_refused": str(e),
                "lowering": ort_build(raw, out_path, args)}
    path = out_path.with_name(out_path.stem + SUFFIX)
    from safetensors.numpy import save_file

    save_file(tensors, str(path))
    log.info("%s: fused, %d layers, %d steps, %.1f MB of weights%s", out_path.stem,
             spec["num_layers"], len(spec["plan"]), sum(t.nbytes for t in tensors.values()) / 1e6,
             f", int4 group {spec['int4']['group_size']}" if "int4" in spec else "")  # fmt: skip
    return {"backend": "fused", "engine": path.name, "fused": spec}
