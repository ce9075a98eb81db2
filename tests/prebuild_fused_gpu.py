"""Build tests/test_fused_gpu.py's engines here, for a GPU machine whose torch cannot export the
tiny checkpoints (the H200 image's torch 2.11 failed to under pytest): CUDA builds need no GPU.

    python tests/prebuild_fused_gpu.py DIR [--onnxruntime VERSION]
    EDGEOMNI_GPU_PREBUILT=DIR pytest -m gpu tests/test_fused_gpu.py   # on the GPU machine

``--onnxruntime``: the onnxruntime the GPU machine has (onnxruntime-gpu stops at 1.31.1 where
this machine's CPU build is 1.32): the lowerings are chosen for it (plugins/lowering.py's
onnxruntime_options), so its runtime does not refuse the engines as built for a newer one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

OMNI_PARTS = ["llm", "talker", "code_predictor", "code2wav"]
# the ONNX Runtime CPU float32 build, the speech tests' float32 reference beside the CUDA one
# (which differed from it while the CUDA provider ran TF32 matrix products, its default)
CPU_REFERENCE = "onnxruntime-cpu"
INT4_KEY = "qwen3-fused-int4"  # the tiny Qwen3, float16 with int4 matrices (groups of 32)
OMNI_INT4_KEY = "omni-fused-int4"  # the tiny Qwen3-Omni's thinker and talker, int4 experts too
OMNI_INT4_PARTS = ["llm", "talker"]
# the tiny Qwen3-Omni's vocoders on ONNX Runtime CUDA, float32, with the stateful step engine
# (no graph: the test runs the code2wav stage's runner itself)
STATEFUL_KEY = "omni-onnxruntime-stateful"
STATEFUL_PARTS = ["code2wav", "code2wav_stream"]


def stateful_args() -> Any:
    from edgeomni.export.family import BuildArgs

    return BuildArgs(3, 64, 128, device="cuda", dtype="float32", code2wav_streaming="stateful")


def engine_key(model: str, backend: str, dtype: str) -> str:
    """The folder under DIR of one build, as tests/test_fused_gpu.py looks it up."""
    return f"{model}-{backend}-{dtype}"


def main(out: Path) -> None:
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.tiny import make_qwen3
    from edgeomni.export.tiny_omni import make_qwen3_omni
    from edgeomni.export.tiny_tts import make_checkpoint

    work = Path(tempfile.mkdtemp())
    models = {  # the same makers and components as the tests' fixtures
        "qwen3": (make_qwen3(work / "qwen3"), None, ("float32", "float16")),
        "tts": (make_checkpoint(work / "tts"), None, ("float32",)),
        "omni": (make_qwen3_omni(work / "omni"), OMNI_PARTS, ("float32", "float16")),
    }
    for model, (ckpt, parts, dtypes) in models.items():
        builds = [(backend, "cuda", dtype) for dtype in dtypes
                  for backend in ("fused", "onnxruntime")]  # fmt: skip
        if model != "qwen3":  # the exact float32 reference of the speech tests (CPU_REFERENCE)
            builds.append(("onnxruntime", "cpu", "float32"))
        for backend, device, dtype in builds:
            name = backend if device == "cuda" else CPU_REFERENCE
            engine = out / engine_key(model, name, dtype)
            args = BuildArgs(3, 64, 128, backend=backend, device=device, dtype=dtype)
            if build(ckpt, engine, args, parts) is None:
                raise SystemExit(f"building {engine.name} failed")
            print(engine, flush=True)
    int4 = BuildArgs(3, 64, 128, backend="fused", device="cuda", dtype="float16",
                     quantization="int4_rtn", group_size=32)  # fmt: skip
    if build(models["qwen3"][0], out / INT4_KEY, int4) is None:
        raise SystemExit(f"building {INT4_KEY} failed")
    print(out / INT4_KEY, flush=True)
    if build(models["omni"][0], out / OMNI_INT4_KEY, int4, OMNI_INT4_PARTS) is None:
        raise SystemExit(f"building {OMNI_INT4_KEY} failed")
    print(out / OMNI_INT4_KEY, flush=True)
    build(models["omni"][0], out / STATEFUL_KEY, stateful_args(), STATEFUL_PARTS)
    if not (out / STATEFUL_KEY / "code2wav_stream" / "config.json").is_file():
        raise SystemExit(f"building {STATEFUL_KEY} failed")
    print(out / STATEFUL_KEY, flush=True)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--onnxruntime", help="the GPU machine's onnxruntime version")
    a = p.parse_args()
    if a.onnxruntime:
        import onnxruntime

        onnxruntime.__version__ = a.onnxruntime  # what onnxruntime_options() reads
    main(a.out)
