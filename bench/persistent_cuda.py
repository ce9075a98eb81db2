"""One persistent kernel for a recorded sequence of launches (issue 55), a comparison the product
does not run: a code-predictor frame's ~450 kernels and device copies as one launch, each
kernel's blocks walked by resident blocks with a grid-wide barrier between launches, instead of
a kernel boundary at each. Measured on an H100 it lost to the frame's CUDA graph (5.0 against
2.2 ms at one row: a grid barrier costs 2.2 us, more than a boundary under programmatic
dependent launch; docs/benchmarks.md), so it lives here: bench/fused_gpu.py --persistent keeps
the comparison, and tests/test_persistent_*.py keep it (and the kernels' SHARED macros) honest.

While ``recording(program)`` is active, the product's kernel launches (attention_cuda's and
cuda_driver's ``launch_kernel``) and runtime/memory.py's device-to-device copies are patched
to append to ``program`` instead of queueing; host copies, memsets and reads to the host are
refused. The program's module is the recorded kernels' own sources, unchanged except by
macros: each entry point becomes a device function (``extern "C" __global__`` dropped,
``__launch_bounds__`` emptied), ``blockIdx``/``gridDim``/``blockDim`` read a virtual block the
interpreter sets, and ``__syncthreads`` syncs the virtual block's threads only (a named
barrier), so one module serves kernels of other block sizes. Each source sits in a namespace
of its own, its macros undefined after it. ``pk_program`` walks a table of steps (entry, grid,
block, argument slots); the slots are each kernel's arguments as 64-bit words, converted back
by the generated dispatcher. Loads are plain (no ``__restrict__``/``__ldg``: a later step reads
what an earlier one wrote in the same kernel), and the barrier fences as cooperative groups'
grid sync does.

Each function's static shared arrays (``SHARED``, in the kernels' sources) sit at the start of
one zone while it runs, so the module's shared memory is the largest function's, not the sum.
The host emulation (tests/test_persistent_host.py) runs every kernel case of
tests/fused_kernel_cases.py through this interpreter with one persistent block.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

HEADER = 5  # a step's words before its slots: entry, grid x, y, z, block
KINDS = {ctypes.c_void_p: "ptr", ctypes.c_int32: "i32", ctypes.c_int64: "i64",
         ctypes.c_float: "f32", ctypes.c_double: "f64"}  # fmt: skip
ZONE = 96 * 1024  # shared bytes for static arrays: a kernel's, then a helper's (48 KiB each)
KEPT = {"SHARED", "SHARED_BEGIN", "SHARED_BEGIN_INNER", "DYNAMIC_SHARED"}  # the prelude's, not undefined after a source
COPY = "pk_copy"  # the interpreter's own entry: a device-to-device copy (dst, src, bytes)
COPY_THREADS = 256

_RECORDING: list[Program] = []  # the program being recorded, if any


class ProgramError(RuntimeError):
    """What a persistent program cannot hold (a host copy, a kernel of unknown source)."""


@dataclass(frozen=True)
class Entry:
    """A kernel the program calls: its source (index into ``Program.sources``; -1: the
    interpreter's copy), its name there and its arguments' kinds."""

    source: int
    name: str
    kinds: tuple[str, ...]


@dataclass
class Program:
    """Recorded launches and copies, in order; ``source_text`` and ``table`` are what the
    device runs."""

    sources: list[str] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    steps: list[tuple[int, tuple[int, int, int], int, int, tuple[int, ...]]] = field(
        default_factory=list)  # (entry, grid, block, dynamic shared bytes, slots)
    # resident blocks an SM the compiler must allow (registers): 2 caps them at 128 a thread
    # for blocks of 256 (the megakernel spills a little there; 1 leaves it 235)
    min_blocks: int = 1

    def launch(self, source: str, name: str, grid: Sequence[int], block: int, shared: int,
               values: Sequence[Any]) -> None:  # fmt: skip
        """A kernel launch of ``name`` from ``source`` with its ctypes argument values."""
        if block % 32 or not 0 < block <= 1024:
            raise ProgramError(f"{name}: a block of {block} threads (a multiple of 32 is run)")
        if source not in self.sources:
            self.sources.append(source)
        kinds = tuple(_kind(v, name) for v in values)
        self._add(Entry(self.sources.index(source), name, kinds), grid, block, shared,
                  [_word(v) for v in values])  # fmt: skip

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """A device-to-device copy of ``nbytes`` (any alignment)."""
        blocks = max(1, min(1024, -(-nbytes // (16 * COPY_THREADS))))
        self._add(Entry(-1, COPY, ("ptr", "ptr", "i64")), (blocks,), COPY_THREADS, 0,
                  [int(dst), int(src), int(nbytes)])  # fmt: skip

    def _add(self, entry: Entry, grid: Sequence[int], block: int, shared: int,
             slots: list[int]) -> None:  # fmt: skip
        if entry not in self.entries:
            self.entries.append(entry)
        g = tuple(int(x) for x in (*grid, 1, 1)[:3])
        if min(g) < 1:
            raise ProgramError(f"{entry.name}: an empty grid {g}")
        self.steps.append((self.entries.index(entry), (g[0], g[1], g[2]), int(block),
                           int(shared), tuple(slots)))  # fmt: skip

    @property
    def threads(self) -> int:
        """The persistent block: as many threads as the largest launch's."""
        return max((s[2] for s in self.steps), default=32)

    @property
    def shared(self) -> int:
        """The launch's dynamic shared memory: the zone, then the largest step's own."""
        return ZONE + max((s[3] for s in self.steps), default=0)

    @property
    def stride(self) -> int:
        return HEADER + max((len(s[4]) for s in self.steps), default=0)

    def table(self) -> np.ndarray:
        """The steps as uint64 words [steps, stride]: entry, grid x, y, z, block, slots."""
        out = np.zeros((len(self.steps), self.stride), np.uint64)
        for i, (entry, grid, block, _, slots) in enumerate(self.steps):
            out[i, :HEADER] = (entry, *grid, block)
            out[i, HEADER:HEADER + len(slots)] = [s & 0xFFFFFFFFFFFFFFFF for s in slots]
        return out

    def pointer_slots(self) -> list[tuple[int, int]]:
        """(step, column) of every pointer argument in ``table``."""
        return [(i, HEADER + j) for i, (entry, *_, slots) in enumerate(self.steps)
                for j, kind in enumerate(self.entries[entry].kinds) if kind == "ptr"]  # fmt: skip

    def source_text(self, prefix: str = "") -> str:
        """The module: ``prefix`` (the host emulation's shim), the interpreter's prelude, each
        source in its namespace, the dispatcher and ``pk_program``."""
        sizes = (f"#define PK_THREADS {self.threads}\n#define PK_MIN_BLOCKS {self.min_blocks}\n"
                 f"#define PK_ZONE {ZONE}u\n")
        out = [prefix, sizes, PRELUDE]
        for i, source in enumerate(self.sources):
            body = _as_device_functions(source)
            out.append(f"namespace pk{i} {{\n{body}\n}}  // namespace pk{i}\n")
            out += [f"#undef {name}\n" for name in sorted(set(_DEFINE.findall(source)) - KEPT)]
        out.append(COPY_SOURCE)
        cases = []
        for e, entry in enumerate(self.entries):
            args = ", ".join(_ARG[k].format(i) for i, k in enumerate(entry.kinds))
            call = entry.name if entry.source < 0 else f"pk{entry.source}::{entry.name}"
            cases.append(f"        case {e}: {call}({args}); break;\n")
        out.append(DISPATCH.replace("CASES\n", "".join(cases)))
        out.append(PROGRAM.replace("GRID_BARRIER\n", GRID_BARRIER))
        return "".join(out)


def _kind(value: Any, name: str) -> str:
    kind = KINDS.get(type(value))
    if kind is None:
        raise ProgramError(f"{name}: an argument of type {type(value).__name__}")
    return kind


def _word(value: Any) -> int:
    """An argument as its 64-bit slot: integers sign-extended, floats as their bits."""
    if isinstance(value, ctypes.c_float):
        return int(np.float32(value.value).view(np.uint32))
    if isinstance(value, ctypes.c_double):
        return int(np.float64(value.value).view(np.uint64))
    return int(value.value or 0)


_DEFINE = re.compile(r"^\s*#define\s+(\w+)", re.M)
_ARG = {"ptr": "PkPtr{{a[{0}]}}", "i32": "(int)(long long)a[{0}]", "i64": "(long long)a[{0}]",
        "f32": "__uint_as_float((unsigned)a[{0}])",
        "f64": "__longlong_as_double((long long)a[{0}])"}  # fmt: skip


def _as_device_functions(source: str) -> str:
    """A module's kernels as device functions the dispatcher calls (no C linkage: two sources
    may name a kernel alike)."""
    if 'extern "C" __global__' not in source:
        raise ProgramError('a kernel source with no extern "C" __global__ entry')
    return source.replace('extern "C" __global__', "__device__")


@contextmanager
def recording(program: Program, attention: Sequence[Any] = ()) -> Iterator[Program]:
    """Launches and device copies queued while it is active go into ``program`` instead (the
    product's functions patched for the duration, on every thread). ``attention``: the
    plugins/attention_cuda.CudaAttention objects whose launches it takes; the decoder modules'
    kernels are found in decoder_cuda's cache of loaded modules."""
    from edgeomni.plugins import attention_cuda as ac
    from edgeomni.plugins import cuda_driver as cd
    from edgeomni.plugins import decoder_cuda as dc
    from edgeomni.runtime import fused_engine, memory

    if _RECORDING:
        raise ProgramError("a program is already being recorded")

    def source_of(function: Any, what: str) -> tuple[str, str]:
        key = int(function)
        for kernel in attention:
            if int(kernel.function) == key:
                return kernel.source, ac.KERNEL_NAME
        for kernels in dc._LOADED.values():
            for name, loaded in kernels._functions.items():
                if int(loaded) == key:
                    return kernels.source, name
        raise ProgramError(f"{what}: a function of no known module cannot join a program")

    def launch(function: Any, grid: Sequence[int], block: int, shared: int, stream: Any,
               values: Sequence[Any], *, overlap: bool = False, what: str = "kernel") -> None:  # fmt: skip
        program.launch(*source_of(function, what), grid, block, shared, values)

    def copy_from(self: Any, src: Any) -> None:
        if (src.device, src.lane) != (self.device, self.lane) or src.nbytes != self.nbytes:
            raise ProgramError(f"copying {src.shape} into {self.shape}: a program copies "
                               "whole buffers within one device and lane")  # fmt: skip
        program.copy(self.ptr, src.ptr, self.nbytes)

    def copy_positions(self: Any, src: Any, axis: int, length: int, *, dst_start: int = 0,
                       src_start: int = 0) -> None:  # fmt: skip
        inner = int(np.prod(self.shape[axis + 1 :])) * self.dtype.itemsize
        for r in range(int(np.prod(self.shape[:axis]))):  # a copy a row of the axes before
            program.copy(self.ptr + (r * self.shape[axis] + dst_start) * inner,
                         src.ptr + (r * src.shape[axis] + src_start) * inner, length * inner)

    def refused(what: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> None:
            raise ProgramError(f"{what} inside a persistent program: it holds kernels and "
                               "device copies only")  # fmt: skip

        return refuse

    patches = [(ac, "launch_kernel", launch), (cd, "launch_kernel", launch),
               (memory.DeviceArray, "copy_from", copy_from),
               (memory.DeviceArray, "copy_positions", copy_positions),
               (fused_engine.FusedBinding, "_copy",
                lambda self, dst, src, nbytes: program.copy(dst, src, nbytes)),
               (memory.DeviceArray, "_host_copy", refused("a copy between host and device")),
               (memory.DeviceArray, "fill_zero", refused("a memset")),
               (memory.HostRead, "queue", refused("a read to the host"))]  # fmt: skip
    saved = [(owner, name, vars(owner)[name]) for owner, name, _ in patches]
    _RECORDING.append(program)
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        yield program
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
        _RECORDING.clear()


PRELUDE = r"""
// edgeomni persistent program (bench/persistent_cuda.py)
#ifdef PK_HOST
typedef dim3 pk_dim;
#else
typedef uint3 pk_dim;
#endif
__shared__ pk_dim pk_block, pk_grid, pk_threads;  // the virtual block being run
// Every function's static shared arrays (SHARED) laid out from the start of its half of the
// zone while it runs: a kernel's (SHARED_BEGIN) in the first, a helper's (SHARED_BEGIN_INNER,
// called by a kernel whose arrays are live) in the second; one kernel's blocks run at a time.
// The steps' dynamic shared memory (DYNAMIC_SHARED) follows the zone. The module's shared
// memory is the largest kernel's and helper's, not every function's summed.
#ifdef PK_HOST
static __attribute__((aligned(16))) unsigned char pk_dynamic[PK_ZONE + (1 << 20)];
#else
extern __shared__ __align__(16) unsigned char pk_dynamic[];
#endif
__device__ __forceinline__ unsigned char* pk_take(unsigned& at, unsigned bytes) {
    const unsigned from = (at + 15u) & ~15u;
    at = from + bytes;
#ifdef PK_HOST
    if (at - 1u >= PK_ZONE || (from < PK_ZONE / 2u) != (at <= PK_ZONE / 2u)) std::abort();
#else  // a function's arrays beyond its half of the zone: the launch fails
    if (at - 1u >= PK_ZONE || (from < PK_ZONE / 2u) != (at <= PK_ZONE / 2u)) __trap();
#endif
    return pk_dynamic + from;
}
#define SHARED_BEGIN unsigned pk_at = 0
#define SHARED_BEGIN_INNER unsigned pk_at = PK_ZONE / 2u
#define SHARED(T, name, dims) \
    T (&name) dims = *reinterpret_cast<T (*) dims>(pk_take(pk_at, (unsigned)sizeof(T dims)))
#undef DYNAMIC_SHARED
#define DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(pk_dynamic + PK_ZONE)
#ifdef PK_HOST
static std::barrier<>* pk_bars[1025];
static void pk_host_init() {
    for (int n = 32; n <= 1024; n += 32) pk_bars[n] = new std::barrier<>(n);
}
inline void pk_sync() { pk_bars[pk_threads.x]->arrive_and_wait(); }
inline void pk_block_sync() { __syncthreads(); }
inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
#else
// the virtual block's threads only (the first pk_threads.x; named barrier 1)
__device__ __forceinline__ void pk_sync() {
    asm volatile("bar.sync 1, %0;" :: "r"(pk_threads.x) : "memory");
}
__device__ __forceinline__ void pk_block_sync() { asm volatile("bar.sync 0;" ::: "memory"); }
#endif
struct PkPtr {
    unsigned long long p;
    template <class T> __device__ __forceinline__ operator T*() const { return (T*)p; }
};
#undef __launch_bounds__
#undef __restrict__
#undef __ldg
#define blockIdx pk_block
#define gridDim pk_grid
#define blockDim pk_threads
#define __syncthreads() pk_sync()
#define __launch_bounds__(...)
#define __restrict__
#define __ldg(p) (*(p))
"""

COPY_SOURCE = r"""
__device__ void pk_copy(unsigned char* dst, const unsigned char* src, long long n) {
    const long long all = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if ((((unsigned long long)dst | (unsigned long long)src | (unsigned long long)n) & 15) == 0) {
        for (long long i = first; i < n / 16; i += all)
            reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
        return;
    }
    for (long long i = first; i < n; i += all) dst[i] = src[i];
}
"""

DISPATCH = r"""
__device__ void pk_run(int entry, const unsigned long long* a) {
    switch (entry) {
CASES
        default: break;
    }
}
#undef blockIdx
#undef gridDim
#undef blockDim
#undef __syncthreads
"""

# every block arrives (its threads' writes fenced first); the last resets the count and moves
# the generation on; the fences after make what the others wrote visible to this block's loads
# (PK_PAUSE: the wait between reads; bench/persistent_frame_gpu.py's probe times it alone)
GRID_BARRIER = r"""
__device__ void grid_barrier(unsigned* bar) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned* gen = bar + 1;
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            bar[0] = 0;
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (*gen == g) PK_PAUSE();
        }
        __threadfence();
    }
    __syncthreads();
}
"""

PROGRAM = r"""
#ifdef PK_HOST
inline void grid_barrier(unsigned*) {}  // one persistent block: nothing to wait for
#else
#define PK_PAUSE() __nanosleep(32)
GRID_BARRIER
#endif

// steps [steps, stride] of uint64: entry, grid x, y, z, block, then the entry's slots. Each
// resident block takes virtual blocks blockIdx.x, + gridDim.x, ... of a step, its first
// `block` threads running the entry; all wait at the grid barrier before the next step.
#ifdef PK_HOST
#define PK_BOUNDS
#else
#define PK_BOUNDS __attribute__((launch_bounds(PK_THREADS, PK_MIN_BLOCKS)))  // (the macro's emptied)
#endif
extern "C" __global__ void PK_BOUNDS pk_program(
        const unsigned long long* steps, int count, int stride, unsigned* bar) {
    for (int s = 0; s < count; ++s) {
        const unsigned long long* t = steps + (long long)s * stride;
        const int entry = (int)t[0];
        const unsigned gx = (unsigned)t[1], gy = (unsigned)t[2], gz = (unsigned)t[3];
        const unsigned threads = (unsigned)t[4];
        const unsigned long long total = (unsigned long long)gx * gy * gz;
        for (unsigned long long v = blockIdx.x; v < total; v += gridDim.x) {
            if (threadIdx.x == 0) {
                pk_block.x = (unsigned)(v % gx);
                pk_block.y = (unsigned)((v / gx) % gy);
                pk_block.z = (unsigned)(v / ((unsigned long long)gx * gy));
                pk_grid.x = gx; pk_grid.y = gy; pk_grid.z = gz;
                pk_threads.x = threads; pk_threads.y = 1; pk_threads.z = 1;
            }
            pk_block_sync();
            if (threadIdx.x < threads) pk_run(entry, t + 5);
            pk_block_sync();  // the virtual block's shared memory is free again
        }
        if (s + 1 < count) grid_barrier(bar);
    }
}
"""


class Loaded:
    """A program's module loaded into the current CUDA context: ``launch`` queues it as one
    cooperative launch (every block resident, as the grid barrier needs) of as many blocks as
    fit an SM times the SMs."""

    def __init__(self, program: Program, cubin: Any) -> None:
        """``cubin``: (source, arch) -> the cubin (decoder_cuda.cubin: its kernel cache)."""
        from edgeomni.plugins import cuda_driver as cd
        from edgeomni.plugins.decoder_cuda import compute_capability

        if not program.steps:
            raise ProgramError("an empty program")
        cu = cd._driver()
        self.steps, self.stride = len(program.steps), program.stride
        self.threads, self.shared = program.threads, program.shared
        major, minor = compute_capability()
        self.image = cubin(program.source_text(), f"sm_{major}{minor}")
        self.module = cd.check(cu.cuModuleLoadData(self.image), "cuModuleLoadData")
        self.function = cd.check(cu.cuModuleGetFunction(self.module, b"pk_program"),
                                 "cuModuleGetFunction pk_program")  # fmt: skip
        if self.shared > 48 * 1024:
            attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            cd.check(cu.cuFuncSetAttribute(self.function, attr, self.shared),
                     "cuFuncSetAttribute")  # fmt: skip
        per_sm = cd.check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            self.function, self.threads, self.shared), "cuOccupancy")  # fmt: skip
        if per_sm < 1:
            raise ProgramError(f"a persistent block of {self.threads} threads and "
                               f"{self.shared} bytes of shared memory does not fit an SM")
        device = cd.check(cu.cuCtxGetDevice(), "cuCtxGetDevice")
        sms = cd.check(cu.cuDeviceGetAttribute(
            cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
            "cuDeviceGetAttribute")  # fmt: skip
        self.blocks = int(sms) * int(per_sm)

    def launch(self, table: int, barrier: int, stream: Any) -> None:
        """Queue the program: ``table`` its steps (``Program.table`` on the device), ``barrier``
        two zeroed uint32 of its own (left ready for the next launch)."""
        from edgeomni.plugins import cuda_driver as cd

        cu = cd._driver()
        values = [ctypes.c_void_p(table), ctypes.c_int32(self.steps),
                  ctypes.c_int32(self.stride), ctypes.c_void_p(barrier)]  # fmt: skip
        array = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = self.blocks, 1, 1
        config.blockDimX, config.blockDimY, config.blockDimZ = self.threads, 1, 1
        config.sharedMemBytes, config.hStream = self.shared, stream
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attr.value.cooperative = 1
        config.attrs, config.numAttrs = [attr], 1
        cd.check(cu.cuLaunchKernelEx(config, self.function, ctypes.addressof(array), 0),
                 f"cuLaunchKernelEx pk_program ({self.steps} steps, {self.blocks} blocks)")

    def close(self) -> None:
        from edgeomni.plugins import cuda_driver as cd

        if getattr(self, "module", None) is not None:
            cd.check(cd._driver().cuModuleUnload(self.module), "cuModuleUnload")
            self.module = None
