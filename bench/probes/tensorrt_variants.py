"""Build one component's graph, as edge-build gives it to TensorRT, in a few more forms, to tell
which difference makes a builder fault go away (a probe, beside tensorrt_bisect.py).

    python bench/probes/tensorrt_variants.py --model-dir CKPT --component code2wav [--dtype float16]

History: code2wav's Myelin fault (docs/gpu-runs/2026-12-02-s17-variants_*.log) went away with
the 1-D convs as 2-D convs, the final Clip on [B, L], or the last conv's output kept as an
output; edge-build now does the first (builder/tensorrt_graph.py), so here it is in every form.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _copy(model: Any) -> Any:
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _replace_nodes(model: Any, nodes: list[Any]) -> Any:
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def clip_as_max_min(model: Any) -> Any:
    """Each 3-input Clip as Max then Min (the same values)."""
    import onnx

    out = _copy(model)
    nodes = []
    for n in out.graph.node:
        if n.op_type == "Clip" and len(n.input) == 3 and all(n.input):
            low = n.output[0] + "_max"
            nodes.append(onnx.helper.make_node("Max", [n.input[0], n.input[1]], [low]))
            nodes.append(onnx.helper.make_node("Min", [low, n.input[2]], [n.output[0]]))
        else:
            nodes.append(n)
    return _replace_nodes(out, nodes)


def final_clip_on_2d(model: Any) -> Any:
    """The Clip that makes a graph output of shape [B, 1, L] runs on [B, L]: Squeeze the channel,
    Clip, Unsqueeze it back (a guess that Myelin's fused Conv+Clip trips on the size-1 channel)."""
    import numpy as np
    from onnx import helper, numpy_helper

    out = _copy(model)
    outputs = {o.name for o in out.graph.output}
    out.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "axis_1"))
    nodes = []
    for n in out.graph.node:
        if n.op_type == "Clip" and n.output[0] in outputs:
            x2, y2 = n.output[0] + "_2d_in", n.output[0] + "_2d_out"
            nodes.append(helper.make_node("Squeeze", [n.input[0], "axis_1"], [x2]))
            nodes.append(helper.make_node("Clip", [x2, *n.input[1:]], [y2]))
            nodes.append(helper.make_node("Unsqueeze", [y2, "axis_1"], [n.output[0]]))
        else:
            nodes.append(n)
    return _replace_nodes(out, nodes)


def conv_output_kept(model: Any) -> Any:
    """The tensor the final Clip reads is a graph output too (so it is materialised, not fused)."""
    from onnx import TensorProto, helper

    out = _copy(model)
    outputs = {o.name for o in out.graph.output}
    for n in out.graph.node:
        if n.op_type == "Clip" and n.output[0] in outputs:
            elem = next(o for o in out.graph.output if o.name == n.output[0])
            t = elem.type.tensor_type.elem_type or TensorProto.FLOAT
            rank = len(elem.type.tensor_type.shape.dim)
            out.graph.output.append(helper.make_tensor_value_info(n.input[0], t, [None] * rank))
    return out


def convtranspose_as_2d(model: Any) -> Any:
    """Each 1-D ConvTranspose as Unsqueeze -> 2-D ConvTranspose -> Squeeze (the same values;
    edge-build does this for Conv only)."""
    import numpy as np
    from onnx import helper, numpy_helper

    out = _copy(model)
    weights = {t.name: t for t in out.graph.initializer}
    axis = "convtranspose_axis_2"
    out.graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), axis))
    nodes = []
    for n in out.graph.node:
        w = weights.get(n.input[1]) if n.op_type == "ConvTranspose" else None
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if w is None or len(w.dims) != 3 or "output_shape" in attrs:
            nodes.append(n)
            continue
        w4 = numpy_helper.from_array(numpy_helper.to_array(w)[:, :, None, :], w.name + "_2d")
        out.graph.initializer.append(w4)
        two_d = {}
        for key, value in attrs.items():
            if key == "pads":
                two_d[key] = [0, value[0], 0, value[1]]
            elif key == "output_padding":
                two_d[key] = [0, *value]
            elif isinstance(value, list):  # kernel_shape, strides, dilations
                two_d[key] = [1, *value]
            else:
                two_d[key] = value
        x4, y4 = n.output[0] + "_x4", n.output[0] + "_y4"
        nodes.append(helper.make_node("Unsqueeze", [n.input[0], axis], [x4]))
        nodes.append(helper.make_node(n.op_type, [x4, w4.name, *n.input[2:]], [y4], **two_d))
        nodes.append(helper.make_node("Squeeze", [y4, axis], [n.output[0]]))
    return _replace_nodes(out, nodes)


def opt_level(level: int) -> Callable[[Any, Any], None]:
    """A builder-config tweak: TensorRT's builder optimisation level (3 by default)."""

    def tweak(trt: Any, config: Any) -> None:
        config.builder_optimization_level = level

    return tweak


def main() -> int:
    import onnx
    from tensorrt_bisect import builds, lowered

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--component", required=True)
    p.add_argument("--backend", default="tensorrt-rtx")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    p.add_argument("--work", type=Path, default=Path("/tmp/variants"))
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    base, ranges, trt = lowered(a.model_dir, a.component, a.backend, a.work, a.dtype)
    ins, outs = [i.name for i in base.graph.input], [o.name for o in base.graph.output]
    inferred = onnx.shape_inference.infer_shapes(base)
    first = dict(list(ranges.items())[:1])
    variants: dict[str, Any] = {
        "as edge-build": (base, ranges, None),
        "with inferred shapes": (inferred, ranges, None),
        "extracted": (onnx.utils.Extractor(inferred).extract_model(ins, outs), ranges, None),
        "clip as max+min": (clip_as_max_min(base), ranges, None),
        "final clip on 2d": (final_clip_on_2d(base), ranges, None),
        "conv output kept": (conv_output_kept(base), ranges, None),
        "convtranspose as 2d": (convtranspose_as_2d(base), ranges, None),
        "first profile only": (base, first, None),
        "opt level 0": (base, ranges, opt_level(0)),
        "opt level 2": (base, ranges, opt_level(2)),
    }
    chosen = [v for v in a.only.split(",") if v] or list(variants)
    for name in chosen:
        model, rng, tweak = variants[name]
        try:
            ok = builds(trt, model, rng, a.work / (name.replace(" ", "_").replace(",", "") + ".onnx"),
                        tweak)  # fmt: skip
            verdict = "builds" if ok else "FAILS"
        except Exception as e:  # a tweak this flavour has no attribute for
            verdict = f"ERROR {type(e).__name__}: {e}"
        print(f"{name}: {verdict} ({len(model.graph.node)} nodes)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
