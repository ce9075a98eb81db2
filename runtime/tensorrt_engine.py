"""A TensorRT (or TensorRT-RTX) engine behind the runtime's Engine interface.

One execution context per optimisation profile (the build's phases: decode, prefill, ...), all
sharing one device scratch allocation, since calls run one at a time on its device's stream. A
call takes the first profile that holds its shapes. Buffers are the runtime's DeviceArrays:
their pointers are set as tensor addresses, the KV cache's input and output on the same buffer
(the build's TensorScatter updates it in place); host feeds are copied into staging buffers of
their own. Decode steps may be captured as CUDA graphs and replayed, one graph per id, as the
ONNX Runtime engine does. Lengths and positions are ordinary inputs: the lowering computes its
masks in the graph, so there are no host-side length inputs.

Written against TensorRT's Python API (10.x, 11.x) and TensorRT-RTX's, which share it; it runs
where one of them imports and supports the GPU (docs/design.md says where it has run).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime import memory
from edgeomni.runtime.buffers import DeviceBuffers, FixedInputs
from edgeomni.runtime.engine_api import LENGTHS, EngineBase, EngineError, parse_device

log = logging.getLogger(__name__)

# the build's flavour (config.json "tensorrt.flavour") -> its Python modules, in order
MODULES = {"tensorrt": ("tensorrt",), "tensorrt-rtx": ("tensorrt_rtx", "tensorrt_rtx_bindings")}


def import_flavour(flavour: str) -> Any:
    errors = []
    for name in MODULES.get(flavour, ()):
        try:
            return importlib.import_module(name)
        except ImportError as e:
            errors.append(f"{name}: {e}")
    raise EngineError(
        f"this engine was built with {flavour}, whose Python module does not import here "
        f"({'; '.join(errors) or 'unknown flavour'})"
    )


class TrtEngine(EngineBase):
    """A deserialized engine and its contexts; see the module docstring."""

    BACKEND = "TensorRT"
    device = "cuda"
    prefers_fixed_shapes = False  # a new shape costs TensorRT only set_input_shape

    def __init__(
        self, path: Path, config: Mapping[str, Any], *, cuda_graphs: bool = False,
        device: str = "cuda", threads: int | None = None, spin: bool = True, lane: int = 0,
    ) -> None:  # fmt: skip
        """``device``: "cuda" or "cuda:N", the GPU it is loaded on and runs on, on that
        device's stream of ``lane`` (``threads``, ``spin``: a CPU engine's, not its)."""
        self.device_id = index = parse_device(device)[1]
        self.lane = lane  # its stream's (runtime/memory.py)
        self.stream = memory.stream(index, lane)  # and the device is current, for the runtime
        memory._check(memory._cudart().cudaSetDevice(index), "cudaSetDevice")
        self.buffers = DeviceBuffers(index, lane)
        built = config.get("tensorrt") or {}
        self.trt = trt = import_flavour(str(built.get("flavour", "tensorrt")))
        check_version(path, built, str(trt.__version__))
        self._logger = trt.Logger(trt.Logger.WARNING)
        runtime = trt.Runtime(self._logger)
        try:
            self.engine = runtime.deserialize_cuda_engine(path.read_bytes())
        except Exception as e:  # TensorRT-RTX raises on a GPU it does not support
            raise EngineError(f"{trt.__name__} {trt.__version__} could not load {path}: {e}") from None
        if self.engine is None:
            raise EngineError(
                f"{trt.__name__} {trt.__version__} could not load {path} (built on compute "
                f"capability {built.get('compute_capability')}; its log above says why)"
            )
        engine = self.engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        mode = trt.TensorIOMode.INPUT
        self.input_names = tuple(n for n in names if engine.get_tensor_mode(n) == mode)
        self.output_names = tuple(n for n in names if engine.get_tensor_mode(n) != mode)
        types = {n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names}
        self.input_types = {n: types[n] for n in self.input_names}
        self.output_types = {n: types[n] for n in self.output_names}
        self.output_shapes = {
            n: tuple(None if d < 0 else int(d) for d in engine.get_tensor_shape(n))
            for n in self.output_names
        }
        self.profiles = [
            {n: engine.get_tensor_profile_shape(n, p) for n in self.input_names}
            for p in range(engine.num_optimization_profiles)
        ]
        # one scratch allocation for every context: calls never overlap
        strategy = trt.ExecutionContextAllocationStrategy.USER_MANAGED
        self.contexts = [engine.create_execution_context(strategy) for _ in self.profiles]
        size = max(self._scratch_size(p) for p in range(len(self.profiles)))
        self._scratch = self.buffers.zeros((max(size, 1),), np.uint8)
        for p, ctx in enumerate(self.contexts):
            if hasattr(ctx, "set_device_memory"):  # TensorRT >= 10.1
                ctx.set_device_memory(self._scratch.ptr, size)
            else:
                ctx.device_memory = self._scratch.ptr
            ctx.set_optimization_profile_async(p, self.stream)
        self.cuda_graphs = cuda_graphs  # whether run(graph=id) captures and replays
        self.replays_steps = cuda_graphs
        self.captures_sequences = False  # not tried: TensorRT's bindings capture a call each

    def _scratch_size(self, profile: int) -> int:
        engine = self.engine
        if hasattr(engine, "get_device_memory_size_for_profile_v2"):
            return int(engine.get_device_memory_size_for_profile_v2(profile))
        return int(engine.device_memory_size_v2)

    def binding(self) -> TrtBinding:
        return TrtBinding(self)


def profile_for(
    profiles: Sequence[Mapping[str, Any]], input_names: Sequence[str],
    shapes: Mapping[str, tuple[int, ...]],
) -> int:  # fmt: skip
    """The first profile (input -> (min, opt, max)) holding every input's shape; EngineError
    names the call's shapes and the engine's ranges otherwise (the build's --max-* flags set
    them)."""
    for p, ranges in enumerate(profiles):
        if all(_inside(shapes.get(n), ranges[n]) for n in input_names):
            return p
    missing = [n for n in input_names if n not in shapes]
    if missing:
        raise EngineError(f"no buffer for input(s) {', '.join(missing)}")
    told = ", ".join(f"{n} {shapes[n]}" for n in input_names)
    limits = "; ".join(
        ", ".join(f"{n} {tuple(r[0])}..{tuple(r[2])}" for n, r in ranges.items())
        for ranges in profiles
    )
    raise EngineError(f"a call with {told} fits none of the engine's profiles ({limits})")


def _inside(shape: tuple[int, ...] | None, rng: Any) -> bool:
    lo, _, hi = rng
    return (
        shape is not None
        and len(shape) == len(lo)
        and all(a <= s <= b for s, a, b in zip(shape, lo, hi, strict=True))
    )


def check_version(path: Path, built: Mapping[str, Any], have: str) -> None:
    """A TensorRT engine runs only on the TensorRT version that built it."""
    want = str(built.get("version", ""))
    if want.split(".")[:3] != have.split(".")[:3]:
        raise EngineError(
            f"{path} was built with {built.get('flavour')} {want}; this is {have}. TensorRT "
            "engines run only on the version that built them: rebuild it here"
        )


class TrtBinding:
    """Tensor addresses for one user of an engine (a stage's calls): bound buffers stay, host
    feeds go through staging buffers, unbound outputs land in scratch buffers."""

    def __init__(self, engine: TrtEngine) -> None:
        self._engine = engine
        self._addr: dict[str, int] = {}
        self._shape: dict[str, tuple[int, ...]] = {}
        self._staging: dict[str, Any] = {}  # host feeds' device copies
        self._unbound: dict[str, Any] = {}  # outputs the caller did not bind
        self._graphs: dict[int, Any] = {}
        self._fixed = FixedInputs(engine.buffers, self.bind_input)  # a captured call's inputs
        self._inputs = frozenset(engine.input_names)

    def bind_in_place(
        self, input_name: str, output_name: str, array: Any, capacity: int | None = None
    ) -> None:
        self.bind_input(input_name, array)
        self.bind_output(output_name, array)

    def bind_input(self, name: str, array: Any) -> None:
        self.bind_output(name, array)  # its address, as an output's
        self._shape[name] = tuple(array.shape)

    def bind_output(self, name: str, array: Any) -> None:
        if isinstance(array, np.ndarray):
            raise EngineError(f"{name}: a TensorRT engine binds device buffers, not numpy arrays")
        self._addr[name] = array.ptr

    def _stage(self, name: str, array: np.ndarray) -> None:
        """A host feed copied into this binding's own device buffer for that input."""
        dtype = self._engine.input_types[name]
        held = self._staging.get(name)
        if held is None or held.nbytes < array.size * dtype.itemsize:
            held = self._staging[name] = self._engine.buffers.zeros((max(array.size, 1),), dtype)
            self._graphs.clear()  # captured graphs read the old buffer: capture them again
        held.rows(array.size).view(array.shape).upload(array.astype(dtype, copy=False))
        self._addr[name] = held.ptr
        self._shape[name] = tuple(array.shape)

    def _scratch_outputs(self, ctx: Any) -> None:
        for name in self._engine.output_names:
            if name in self._addr:
                continue
            shape = tuple(int(d) for d in ctx.get_tensor_shape(name))
            nbytes = int(np.prod(shape)) * self._engine.output_types[name].itemsize
            held = self._unbound.get(name)
            if held is None or held.nbytes < nbytes:
                held = self._unbound[name] = self._engine.buffers.zeros((max(nbytes, 1),), np.uint8)
                self._graphs.clear()  # as in _stage
            ctx.set_tensor_address(name, held.ptr)

    def run(self, feeds: Mapping[str, Any], *, graph: int | None = None, wait: bool = True) -> None:
        """As OrtBinding.run: host feeds are copied in, device feeds read in place (``LENGTHS``
        the engine has no input for dropped: its lowering computes its masks from them);
        ``graph`` captures the call once and replays it after, its feeds copied into buffers
        of this binding's at fixed addresses (host arrays only when they changed)."""
        engine = self._engine
        captured = graph is not None and engine.cuda_graphs
        for name, array in feeds.items():
            if name not in self._inputs and name in LENGTHS:
                continue
            if captured:
                self._fixed.put(name, array)
            elif isinstance(array, np.ndarray):
                self._stage(name, np.ascontiguousarray(array))
            else:
                self.bind_input(name, array)
        cudart = memory._cudart()
        memory.use(engine.device_id)
        if captured and graph in self._graphs:
            memory._check(cudart.cudaGraphLaunch(self._graphs[graph], engine.stream),
                          "cudaGraphLaunch")  # fmt: skip
        else:
            ctx = engine.contexts[profile_for(engine.profiles, engine.input_names, self._shape)]
            for name in engine.input_names:
                if not ctx.set_input_shape(name, self._shape[name]):
                    raise EngineError(f"TensorRT refused shape {self._shape[name]} for {name}")
            for name, ptr in self._addr.items():
                ctx.set_tensor_address(name, ptr)
            self._scratch_outputs(ctx)
            if not ctx.execute_async_v3(engine.stream):
                raise EngineError("TensorRT could not run the engine (its log says why)")
            if captured:
                with memory.capturing():
                    self._graphs[graph] = _capture(ctx, cudart, engine.stream)
        if wait:
            memory.synchronize(engine.device_id, engine.lane)


def _capture(ctx: Any, cudart: Any, s: int) -> Any:
    """Capture the context's call with its current shapes and addresses as a CUDA graph (after
    one ordinary run, which TensorRT needs before a capture), on stream ``s``."""
    mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    memory._check(cudart.cudaStreamBeginCapture(s, mode), "cudaStreamBeginCapture")
    ok = ctx.execute_async_v3(s)
    g = memory._check(cudart.cudaStreamEndCapture(s), "cudaStreamEndCapture")
    if not ok:
        raise EngineError("TensorRT could not run the engine inside a CUDA graph capture")
    return memory._check(cudart.cudaGraphInstantiate(g, 0), "cudaGraphInstantiate")
