"""Why ONNX Runtime's CUDA provider will not capture an engine's calls as a CUDA graph: opens
each model with ``enable_cuda_graph`` as the runtime does (runtime/engine.py's session options)
and reports whether the session loads, which nodes the provider left on the CPU, and every
Memcpy node it inserted with what feeds it and what reads it (the provider refuses to capture
a model with Memcpy nodes; shape nodes on the CPU alone are allowed). ONNX Runtime's own log
(stderr, INFO) lists the node placements.

    python bench/probes/ort_capture_gpu.py MODEL.onnx [MODEL.onnx ...] [--out FILE.json]

Needs onnxruntime-gpu (its CUDA provider) and a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any


def probe(path: Path, work: Path) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    result: dict[str, Any] = {"model": str(path)}
    for graphs in (True, False):
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        saved = work / f"{path.parent.name}-{path.stem}-{int(graphs)}.onnx"
        so.optimized_model_filepath = str(saved)
        so.log_severity_level = 1  # node placements are logged at INFO
        cuda = {"device_id": "0", "cudnn_conv_algo_search": "HEURISTIC"}
        if graphs:
            cuda["enable_cuda_graph"] = "1"
        try:
            ort.InferenceSession(str(path), so, providers=[("CUDAExecutionProvider", cuda),
                                                           "CPUExecutionProvider"])  # fmt: skip
            result["captures" if graphs else "loads"] = True
        except Exception as e:  # ONNX Runtime raises its own exception types
            result["captures" if graphs else "loads"] = False
            result["error" if graphs else "error_plain"] = str(e)[:2000]
            continue
        if graphs or not saved.is_file():
            continue
        model = onnx.load(str(saved), load_external_data=False)
        nodes = list(model.graph.node)
        producer = {o: n for n in nodes for o in n.output}
        readers: dict[str, list[Any]] = {}
        for n in nodes:
            for i in n.input:
                readers.setdefault(i, []).append(n)
        result["nodes"] = len(nodes)
        result["memcpy"] = [{
            "node": n.name, "op": n.op_type,
            "from": [f"{producer[i].op_type} {producer[i].name}" if i in producer else f"input {i}"
                     for i in n.input],
            "to": [f"{r.op_type} {r.name}" for o in n.output for r in readers.get(o, [])],
        } for n in nodes if n.op_type.startswith("Memcpy")]  # fmt: skip
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("models", type=Path, nargs="+")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print(f"ort_capture_gpu: this onnxruntime ({ort.__version__}) has no CUDA provider")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        results = [probe(m, Path(tmp)) for m in args.models]
    for r in results:
        print(json.dumps(r, indent=1)[:6000])
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
