"""TensorRT builds of every component, next to ONNX Runtime's CUDA build of the same export.

For each component: the TensorRT (or TensorRT-RTX) build's time and engine size, its network's
layers as parsed (before TensorRT's fusions) and, where the engine can be loaded, the engine's
layers after them; and ONNX Runtime's nodes after its CUDA optimisations (each node is at least
one kernel launch a call). TensorRT-RTX cannot load engines on the H200 (sm_90): there the
engine-layer column says so.

    python bench/tensorrt_builds_gpu.py --out DIR --size tiny  # Qwen3, -Omni, -TTS, -VL, -ASR, 3.5
    python bench/tensorrt_builds_gpu.py --out DIR --size tiny --families qwen3_vl,qwen3_asr
    python bench/tensorrt_builds_gpu.py --out DIR --size real --work W  # Omni talker, predictor, code2wav
    python bench/tensorrt_builds_gpu.py --out DIR --size tiny --quantization int4_rtn --no-ort
        # the int4 decoders as TensorRT builds them (INT4 DequantizeLinear + MatMul)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def ort_nodes(engine: Path) -> dict[str, Any]:
    """Nodes of the ONNX Runtime CUDA engine after the optimisations it runs at load."""
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    optimized = engine.with_name(engine.stem + ".optimized.onnx")
    so.optimized_model_filepath = str(optimized)
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                optimized.name + ".data")  # fmt: skip
    ort.InferenceSession(str(engine), so, providers=["CUDAExecutionProvider"])
    model = onnx.load(str(optimized), load_external_data=False)
    ops: dict[str, int] = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    top = dict(sorted(ops.items(), key=lambda kv: -kv[1])[:6])
    return {"nodes": len(model.graph.node), "top_ops": top}


def engine_layers(engine: Path, cfg: dict[str, Any]) -> Any:
    """Layers of the built engine (TensorRT's inspector), or why it cannot be loaded here."""
    from edgeomni.runtime.tensorrt_engine import import_flavour

    trt = import_flavour(cfg["tensorrt"]["flavour"])
    logger = trt.Logger(trt.Logger.ERROR)
    try:
        eng = trt.Runtime(logger).deserialize_cuda_engine(engine.read_bytes())
    except Exception as e:  # TensorRT-RTX raises on an unsupported GPU
        return f"not loadable here: {e}"
    if eng is None:
        return "not loadable here (deserialize_cuda_engine returned None)"
    info = json.loads(eng.create_engine_inspector().get_engine_information(
        trt.LayerInformationFormat.JSON))  # fmt: skip
    return len(info.get("Layers", []))


def build_both(ckpt: Path, work: Path, backends: tuple[str, ...], dtype: str,
               components: list[str] | None, limits: tuple[int, int, int],
               quantization: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    from edgeomni.builder.build import build
    from edgeomni.export.common.checkpoint import open_checkpoint
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.registry import family_for

    rows: dict[str, dict[str, Any]] = {}
    b, i, c = limits
    opened = open_checkpoint(ckpt)
    names = [x.name for x in family_for(opened.model_type).hooks().components(opened)]
    for which, name in ((w, n) for w in backends for n in names):
        if components and name not in components:
            continue
        # one build each: a failure loses no other
        out = work / (f"{ckpt.name}-{which}-{name}" + (f"-{quantization}" if quantization else ""))
        args = BuildArgs(max_batch_size=b, max_input_len=i, max_kv_cache_capacity=c,
                         backend=which, device="cuda", dtype=dtype,
                         quantization=quantization)  # fmt: skip
        start = time.perf_counter()
        try:
            build(ckpt, out, args, [name])
        except Exception as e:
            rows.setdefault(name, {"component": name})[f"{which}_error"] = (
                f"{type(e).__name__}: {e}"
            )
            print(f"{ckpt.name} {name} {which}: {e}", flush=True)
            continue
        total = time.perf_counter() - start
        for cfg_path in sorted(out.rglob("config.json")):
            cfg = json.loads(cfg_path.read_text())
            name = cfg.get("component")
            if "engine" not in cfg or name is None:
                continue
            engine = cfg_path.parent / cfg["engine"]
            row = rows.setdefault(name, {"component": name})
            q = cfg.get("quantization")
            if q:
                row["quantization"] = {k: q.get(k) for k in ("method", "group_size", "weights",
                                                             "moe_blocks", "weight_bytes")}  # fmt: skip
            size = engine.stat().st_size + sum(
                f.stat().st_size for f in cfg_path.parent.glob(cfg["engine"] + ".data")
            )
            if which == "onnxruntime":
                row["ort"] = {"bytes": size, **ort_nodes(engine)}
            else:
                t = cfg["tensorrt"]
                row["trt"] = {"bytes": size, "build_s": t["build_seconds"],
                              "network_layers": t["network_layers"],
                              "engine_layers": engine_layers(engine, cfg),
                              "profiles": list(t["profiles"]), "version": t["version"],
                              "compute_capability": t["compute_capability"]}  # fmt: skip
        print(f"{ckpt.name} {name} {which}: built in {total:.1f} s", flush=True)
    return list(rows.values())


def tiny_checkpoints(root: Path) -> dict[str, Any]:
    """name -> a function making that tiny checkpoint (each made just before its builds)."""
    from edgeomni.export.families.qwen3_5.tiny import make_qwen3_5
    from edgeomni.export.tiny import make_qwen3
    from edgeomni.export.tiny_asr import make_qwen3_asr
    from edgeomni.export.tiny_omni import make_qwen3_omni
    from edgeomni.export.tiny_tts import make_checkpoint
    from edgeomni.export.tiny_vl import make_qwen3_vl

    return {"qwen3": lambda: make_qwen3(root / "qwen3"),
            "qwen3_omni": lambda: make_qwen3_omni(root / "qwen3_omni"),
            "qwen3_tts": lambda: make_checkpoint(root / "qwen3_tts", "custom_voice", "tiny"),
            "qwen3_vl": lambda: make_qwen3_vl(root / "qwen3_vl"),
            "qwen3_asr": lambda: make_qwen3_asr(root / "qwen3_asr"),
            "qwen3_5": lambda: make_qwen3_5(root / "qwen3_5")}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp/trtwork"))
    p.add_argument("--size", choices=("tiny", "real"), default="tiny")
    p.add_argument("--backend", choices=("tensorrt", "tensorrt-rtx"), default="tensorrt-rtx")
    p.add_argument(
        "--components",
        default=None,
        help="the components to build (default: all of the tiny models'; the real "
        "talker, code_predictor and code2wav)",
    )
    p.add_argument(
        "--no-ort",
        action="store_true",
        help="TensorRT builds only (ONNX Runtime's node counts from an earlier run)",
    )
    p.add_argument("--families", default=None,
                   help="the tiny families to build, comma-separated (default: all)")  # fmt: skip
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--quantization", choices=("int4_rtn", "int4_awq"),
                   help="edge-build --quantization for every build")  # fmt: skip
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"size": args.size, "backend": args.backend,
                              "quantization": args.quantization}  # fmt: skip
    backends = (args.backend,) if args.no_ort else (args.backend, "onnxruntime")
    wanted = args.components.split(",") if args.components else None
    if args.size == "tiny":
        makers = tiny_checkpoints(args.work / "ckpt")
        chosen = args.families.split(",") if args.families else list(makers)
        unknown = sorted(set(chosen) - set(makers))
        if unknown:
            p.error(f"unknown families {unknown}; known: {', '.join(makers)}")
        for name in chosen:
            make = makers[name]
            try:
                ckpt = make()
            except Exception as e:  # a transformers version without the model's config class
                report[name] = {"error": f"no checkpoint: {type(e).__name__}: {e}"}
                continue
            report[name] = build_both(ckpt, args.work, backends, "float32", wanted,
                                      (args.max_batch_size, 64, 256), args.quantization)  # fmt: skip
    else:
        import gpu_omni

        ckpt = args.work / "real-ckpt"
        made = gpu_omni.ensure_checkpoint(ckpt, gpu_omni.real_sizes(4), 0, "cuda", "bfloat16")
        report["checkpoint"] = made
        report["qwen3_omni_real"] = build_both(
            ckpt, args.work, backends, "float16", wanted or ["talker", "code_predictor", "code2wav"],
            (args.max_batch_size, 64, 192), args.quantization)  # fmt: skip
    tag = f"_{args.quantization}" if args.quantization else ""
    (args.out / f"tensorrt_builds_{args.size}{tag}.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
