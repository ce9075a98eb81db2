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
        "first profile only": (base, dict(list(ranges.items())[:1])),
    }
    for name, (model, rng) in variants.items():
        ok = builds(trt, model, rng, a.work / (name.replace(" ", "_") + ".onnx"))
        print(f"{name}: {'builds' if ok else 'FAILS'} ({len(model.graph.node)} nodes)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
