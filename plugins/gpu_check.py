"""What this machine lacks to run an engine on a CUDA GPU (the driver and device, then the
backend's module), asked of the driver and the installed modules without loading anything:
edge-infer refuses a cuda engine naming all of it at once, and edge-build notes it after a
cuda build (one made for another machine is legitimate). Standard library only; onnxruntime is
imported only when its engines are asked about."""

from __future__ import annotations


def cuda_missing(backend: str, device: int = 0) -> list[str]:
    """What this machine lacks to run a ``backend`` engine on GPU ``device``, each a clause:
    the GPU (its driver, the device) first, then the runtime's GPU support; empty when it has
    both. Asked at once, so a user installs what is missing in one go."""
    module = _gpu_support_problem(backend)
    return [p for p in (cuda_device_problem(device), module) if p]


def _gpu_support_problem(backend: str) -> str | None:
    """Why this Python cannot run ``backend``'s engines on a GPU (its module), or None."""
    if backend == "onnxruntime":
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return ("this onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu and "
                    "run on a machine with an NVIDIA GPU, or rebuild with --device cpu)")  # fmt: skip
        return None
    if backend == "fused":
        if not _has_module("cuda.bindings"):
            return ("this Python has no cuda-python, whose NVRTC compiles a fused engine's "
                    "kernels at load (pip install 'edgeomni[cuda]'; NVRTC comes with the CUDA "
                    "toolkit, or JetPack)")  # fmt: skip
        return None
    module = "tensorrt_rtx" if backend == "tensorrt-rtx" else "tensorrt"
    if not _has_module(module):
        return f"the module {module!r}, which runs {backend} engines, is not installed here"
    return None


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
