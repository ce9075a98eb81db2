"""NVRTC and the CUDA driver through cuda-python, as edgeomni's kernels use them: compile CUDA C
to PTX or a cubin, and launch a loaded function (optionally as a programmatic dependent launch).
No torch, CuPy or Triton (plugins/attention_cuda.py, plugins/decoder_cuda.py)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any


class KernelError(RuntimeError):
    """NVRTC could not compile the kernel, or a CUDA driver call failed."""


# ---------------------------------------------------------------------------------------------
# NVRTC
# ---------------------------------------------------------------------------------------------
def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise KernelError(f"compiling CUDA kernels needs cuda-python's NVRTC: {e}") from e
    return nvrtc


def _out_buffer(size: int) -> bytes:
    """A new bytes object of ``size`` (at least 2) for NVRTC to write into. Not ``b" " * size``:
    at size 1 (an empty log) that is CPython's shared one-byte ``b" "``, and the NUL NVRTC
    wrote into it made every ``b" "`` of the process ``b"\\x00"`` (on the H200, after a kernel
    compile, Jinja's compiled chat templates lost the spaces around their operators and print's
    separators came out as NULs). A 2-byte or longer result of ``bytes(n)`` is never shared."""
    return bytes(max(size, 2))


def _nvrtc_check(nvrtc: Any, result: Any, what: str, log: str = "") -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, text = nvrtc.nvrtcGetErrorString(err)
        name = text.decode() if isinstance(text, bytes) else str(err)
        raise KernelError(f"{what} failed: {name}" + (f"\n{log}" if log else ""))
    return rest[0] if len(rest) == 1 else rest


def _compile(source: str, arch: str, cubin: bool, options: Sequence[str] = ()) -> bytes:
    nvrtc = _nvrtc()
    prog = _nvrtc_check(
        nvrtc, nvrtc.nvrtcCreateProgram(source.encode(), b"kernels.cu", 0, [], []),
        "nvrtcCreateProgram",
    )  # fmt: skip
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
        opts += [o.encode() for o in options]
        result = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _nvrtc_check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        log = _out_buffer(size)
        _nvrtc_check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        text = log.rstrip(b"\x00 ").decode(errors="replace")
        _nvrtc_check(nvrtc, result, f"NVRTC compiling for {arch}", text)
        get_size, get = (
            (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN)
            if cubin
            else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        )
        size = _nvrtc_check(nvrtc, get_size(prog), get_size.__name__)
        image = _out_buffer(size)
        _nvrtc_check(nvrtc, get(prog, image), get.__name__)
        return image[:size]
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_ptx(source: str, arch: str = "compute_90", options: Sequence[str] = ()) -> bytes:
    """PTX for a virtual architecture (``compute_87``: Orin, ``compute_90``: H100/H200), what a
    TensorRT AOT plugin returns; NUL-terminated, as cuModuleLoadData wants it. The driver that
    loads it must be at least as new as this NVRTC (PTX ISA version)."""
    return _compile(source, arch, cubin=False, options=options)


def compile_cubin(source: str, arch: str = "sm_90", options: Sequence[str] = ()) -> bytes:
    """Machine code for one GPU (``sm_90``): loads on any driver of the same CUDA major."""
    return _compile(source, arch, cubin=True, options=options)


# ---------------------------------------------------------------------------------------------
# CUDA driver: load and launch
# ---------------------------------------------------------------------------------------------
def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise KernelError(f"launching CUDA kernels needs cuda-python: {e}") from e
    return driver


def stream_handle(stream: int) -> Any:
    """A stream handle TensorRT gives as an int, as cuLaunchKernel takes it."""
    return _driver().CUstream(int(stream))


def launch_kernel(
    function: Any, grid: Sequence[int], block: int, shared: int, stream: Any,
    values: Sequence[Any], *, overlap: bool = False, what: str = "kernel",
) -> None:  # fmt: skip
    """Queue ``function`` with its arguments (ctypes values); ``overlap``: a programmatic
    dependent launch (sm_90+), which may start while the kernel before it runs and so must
    first wait (griddepcontrol.wait), as this module's and decoder_cuda.py's kernels do."""
    array = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    params = ctypes.addressof(array)
    cu = _driver()
    gx, gy, gz = (*grid, 1, 1)[:3]
    where = f"{what} grid {tuple(grid)} block {block}"
    if not overlap:  # check's value is None: the launch returns nothing
        return check(cu.cuLaunchKernel(function, gx, gy, gz, block, 1, 1, shared, stream,
                                       params, 0), f"cuLaunchKernel {where}")  # fmt: skip
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
    config.blockDimX, config.blockDimY, config.blockDimZ = block, 1, 1
    config.sharedMemBytes, config.hStream = shared, stream
    attr = cu.CUlaunchAttribute()
    attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    config.attrs, config.numAttrs = [attr], 1
    check(cu.cuLaunchKernelEx(config, function, params, 0), f"cuLaunchKernelEx {where}")


def check(result: Any, what: str) -> Any:
    """A cuda.bindings.driver call's value, or KernelError naming the CUresult."""
    cu = _driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        text = name.decode() if isinstance(name, bytes) else str(err)
        raise KernelError(f"{what} failed: {text}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest
