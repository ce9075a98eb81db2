"""The engine backends, one table: where each one's engines run, its build, its engine, its
engine file's check, what a GPU needs for it, and edge-build's --help words. builder/ and
runtime/ both read it (neither imports the other): the build, engine and check are
"module:attribute" strings under edgeomni, imported (``load``) only by the layer using them.
What a machine lacks for a GPU is asked without loading anything (standard library only;
onnxruntime only when its engines are asked about): edge-infer refuses a cuda engine naming all
of it at once, edge-build notes it after a cuda build (one made for another machine is fine)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Backend:
    devices: tuple[str, ...]  # where its engines run; the first is edge-build's default
    build: str  # builder: (BuildArgs) -> each component's build (builder/build.py's Build)
    open: str  # runtime: the engine, (file, config.json, device=, cuda_graphs=, threads=, spin=)
    check: str | None  # runtime: (folder, config.json, file) refuses a file; None: not empty
    gpu: Callable[[], str | None]  # why this Python cannot run its engines on a GPU, or None
    help: str  # edge-build --help's words


def _onnxruntime_gpu() -> str | None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return ("this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu and "
                "run on a machine with an NVIDIA GPU, or rebuild with --device cpu)")  # fmt: skip
    return None


def _module(name: str, why: str = "") -> Callable[[], str | None]:
    why = why or f"the module {name!r}, which runs these engines, is not installed here"
    return lambda: None if _has_module(name) else why


BACKENDS = {
    "onnxruntime": Backend(
        ("cpu", "cuda"), "builder.onnxruntime:backend", "runtime.engine:OrtEngine",
        "runtime.engine:check_onnx", _onnxruntime_gpu,
        "ONNX Runtime, on the CPU or (--device cuda) its CUDA provider.",
    ),
    "tensorrt": Backend(
        ("cuda",), "builder.tensorrt:backend", "runtime.tensorrt_engine:TrtEngine", None,
        _module("tensorrt"),
        "TensorRT 10.15 or later (module tensorrt), whose native Attention and "
        "RotaryEmbedding layers the build writes.",
    ),
    "tensorrt-rtx": Backend(
        ("cuda",), "builder.tensorrt:backend", "runtime.tensorrt_engine:TrtEngine", None,
        _module("tensorrt_rtx"),
        "TensorRT-RTX 1.7 or later (module tensorrt_rtx). Both TensorRTs build on this "
        "machine's GPU, for GPUs of its compute capability; an engine runs only with the "
        "TensorRT version that built it.",
    ),
    "fused": Backend(
        ("cuda",), "builder.fused:backend", "runtime.fused_engine:FusedEngine", None,
        _module("cuda.bindings", "this Python has no cuda-python, whose NVRTC compiles a fused "
                "engine's kernels at load (pip install 'edgeomni[cuda]'; NVRTC comes with the "
                "CUDA toolkit, or JetPack)"),
        "dense decoders (LLM, Qwen3-TTS talker, code predictors) run by edgeomni's own CUDA "
        "kernels, compiled by NVRTC when loaded (cuda-python; --dtype float16 or float32; "
        "--quantization int4_rtn with --dtype float16 and --group-size 32, 64 or 128), the "
        "other components (and a pre-quantized checkpoint's decoders) by ONNX Runtime's CUDA "
        "provider.",
    ),
}


def load(ref: str) -> Any:
    """What a "module:attribute" entry of the table names, its module (under edgeomni)
    imported now."""
    module, attr = ref.split(":")
    return getattr(importlib.import_module(f"edgeomni.{module}"), attr)


def cuda_missing(backend: str, device: int = 0) -> list[str]:
    """What this machine lacks to run a ``backend`` engine on GPU ``device``, each a clause:
    the GPU (its driver, the device) first, then the runtime's GPU support; empty when it has
    both. Asked at once, so a user installs what is missing in one go."""
    return [p for p in (cuda_device_problem(device), BACKENDS[backend].gpu()) if p]


def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def cuda_device_problem(device: int = 0) -> str | None:
    """Why this machine cannot run CUDA work on GPU ``device`` (no driver library, no such
    device), or None: asked of the driver itself (libcuda), which every CUDA runtime needs, so
    it holds on Jetson too."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "this machine has no NVIDIA driver (libcuda.so.1 cannot be loaded)"
    count = ctypes.c_int(0)
    status = cuda.cuInit(0)
    if status == 0:
        status = cuda.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return f"the NVIDIA driver cannot be initialised (CUDA error {status})"
    if count.value == 0:
        return "this machine has no CUDA device"
    if device >= count.value:
        return f"this machine has {count.value} CUDA device(s): there is no cuda:{device}"
    return None
