"""Find the first node of a lowered ONNX model that a TensorRT build fails on: build the model cut
after node k (its output made the graph's output), bisecting over k. For builder faults that
name no node (a Myelin check). Profiles come from the family's dim_ranges, as edge-build's.

    python bench/probes/tensorrt_bisect.py --model-dir CKPT --component code2wav [--backend tensorrt-rtx]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def lowered(
    model_dir: Path, component: str, backend: str, work: Path, dtype: str = "float32"
) -> tuple[Any, Any, Any]:
    """(the component's ONNX as edge-build gives it to TensorRT, its dim ranges, the module)."""
    import onnx

    from edgeomni.builder import tensorrt as trtb
    from edgeomni.builder.build import dim_ranges
    from edgeomni.export.common.checkpoint import open_checkpoint
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.registry import family_for

    args = BuildArgs(4, 64, 256, backend=backend, device="cuda", dtype=dtype)
    ckpt = open_checkpoint(model_dir)
    hooks = family_for(ckpt.model_type).hooks()
    comp = next(c for c in hooks.components(ckpt) if c.name == component)
    raw = hooks.export_component(ckpt, comp, work, args)
    ranges = dim_ranges(hooks, ckpt, comp, args)
    trt, flavour = trtb.load(backend)
    model = onnx.load(str(raw))
    trtb.prepare(model, ranges)
    return model, ranges, trt


def builds(trt: Any, model: Any, ranges: Any, path: Path, tweak: Any = None) -> bool:
    """Whether TensorRT parses and builds this model with these ranges' profiles (``tweak``:
    called with (trt, builder config) before the build)."""
    import onnx

    from edgeomni.builder import tensorrt as trtb

    onnx.save(model, str(path))
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    net = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    if not trt.OnnxParser(net, logger).parse_from_file(str(path)):
        return False
    config = builder.create_builder_config()
    for shapes in trtb.input_profiles(model, ranges).values():
        prof = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            prof.set_shape(name, lo, opt, hi)
        config.add_optimization_profile(prof)
    if tweak is not None:
        tweak(trt, config)
    return builder.build_serialized_network(net, config) is not None


def main() -> int:
    import onnx

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--component", required=True)
    p.add_argument("--backend", default="tensorrt-rtx")
    p.add_argument("--work", type=Path, default=Path("/tmp/bisect"))
    a = p.parse_args()
    model, ranges, trt = lowered(a.model_dir, a.component, a.backend, a.work)
    model = onnx.shape_inference.infer_shapes(model)
    typed = {v.name: v for v in (*model.graph.value_info, *model.graph.output)}
    inputs = [i.name for i in model.graph.input]

    def cut_builds(k: int) -> bool:
        out = model.graph.node[k].output[0]
        if out not in typed:
            return True  # no inferred type (a shape-only tensor): counted as building
        cut = onnx.utils.Extractor(model).extract_model(inputs, [out])
        return builds(trt, cut, ranges, a.work / f"cut_{k}.onnx")

    lo, hi = 0, len(model.graph.node) - 1
    print(f"{len(model.graph.node)} nodes; whole model builds: {cut_builds(hi)}", flush=True)
    while lo < hi:
        mid = (lo + hi) // 2
        ok = cut_builds(mid)
        print(f"  cut after node {mid} ({model.graph.node[mid].op_type}): "
              f"{'builds' if ok else 'fails'}", flush=True)  # fmt: skip
        lo, hi = (mid + 1, hi) if ok else (lo, mid)
    n = model.graph.node[lo]
    print(f"first failing node {lo}: {n.op_type} {n.name} inputs {list(n.input)}")
    for i in n.input:
        if i in typed:
            dims = [d.dim_param or d.dim_value for d in typed[i].type.tensor_type.shape.dim]
            print(f"  {i}: {dims}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
