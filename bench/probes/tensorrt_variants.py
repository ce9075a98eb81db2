"""Build one component's lowered graph with TensorRT in a few forms, to tell which difference
makes a builder fault go away (a probe, beside tensorrt_bisect.py).

    python bench/probes/tensorrt_variants.py --model-dir CKPT --component code2wav
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def clip_as_max_min(model: Any) -> Any:
    """Each 3-input Clip as Max then Min (the same values)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for n in out.graph.node:
        if n.op_type == "Clip" and len(n.input) == 3 and all(n.input):
            low = n.output[0] + "_max"
            nodes.append(onnx.helper.make_node("Max", [n.input[0], n.input[1]], [low]))
            nodes.append(onnx.helper.make_node("Min", [low, n.input[2]], [n.output[0]]))
        else:
            nodes.append(n)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def conv1d_as_conv2d(model: Any) -> Any:
    """Each Conv on [N, C, L] (a 1-D kernel) as Unsqueeze -> 2-D Conv on [N, C, 1, L] ->
    Squeeze, the same values: a guess at the Myelin rank check code2wav's last Conv + Clip
    fails (its fused pointwise op sees the conv's 4-D form against 3 strides)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    weights = {t.name: t for t in out.graph.initializer}
    axis = "conv2d_axis_2"
    out.graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), axis))
    nodes = []
    for n in out.graph.node:
        w = weights.get(n.input[1]) if n.op_type == "Conv" and len(n.input) > 1 else None
        if w is None or len(w.dims) != 3:
            nodes.append(n)
            continue
        w4 = numpy_helper.from_array(numpy_helper.to_array(w)[:, :, None, :], w.name + "_2d")
        out.graph.initializer.append(w4)
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        two_d = {}
        for key, value in attrs.items():
            if key in ("kernel_shape", "strides", "dilations"):
                two_d[key] = [1, *value]
            elif key == "pads":
                two_d[key] = [0, value[0], 0, value[1]]
            else:
                two_d[key] = value
        x4, y4 = n.output[0] + "_x4", n.output[0] + "_y4"
        nodes.append(helper.make_node("Unsqueeze", [n.input[0], axis], [x4]))
        nodes.append(helper.make_node("Conv", [x4, w4.name, *n.input[2:]], [y4], **two_d))
        nodes.append(helper.make_node("Squeeze", [y4, axis], [n.output[0]]))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    used = {i for n in nodes for i in n.input}
    kept = [t for t in out.graph.initializer if t.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    return out


def main() -> int:
    import onnx
    from tensorrt_bisect import builds, lowered

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--component", required=True)
    p.add_argument("--backend", default="tensorrt-rtx")
    p.add_argument("--work", type=Path, default=Path("/tmp/variants"))
    a = p.parse_args()
    base, ranges, trt = lowered(a.model_dir, a.component, a.backend, a.work)
    ins, outs = [i.name for i in base.graph.input], [o.name for o in base.graph.output]
    inferred = onnx.shape_inference.infer_shapes(base)
    variants = {
        "as edge-build": (base, ranges),
        "with inferred shapes": (inferred, ranges),
        "extracted": (onnx.utils.Extractor(inferred).extract_model(ins, outs), ranges),
        "clip as max+min": (clip_as_max_min(base), ranges),
        "conv1d as conv2d": (conv1d_as_conv2d(base), ranges),
        "first profile only": (base, dict(list(ranges.items())[:1])),
    }
    for name, (model, rng) in variants.items():
        ok = builds(trt, model, rng, a.work / (name.replace(" ", "_") + ".onnx"))
        print(f"{name}: {'builds' if ok else 'FAILS'} ({len(model.graph.node)} nodes)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
