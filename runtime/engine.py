"""Engines: named tensors in and out, with buffers bound in place.

An engine is opened from a stage's artifact folder by what its config.json says (backend,
device, engine file), through the backend table (plugins/backends.py); the ONNX Runtime backend
is here. The interface is the one TensorRT needs too: named inputs and outputs, caller-owned
buffers bound by name (the KV cache bound as both input and output), one run call.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgeomni.plugins.backends import BACKENDS, cuda_missing, load
from edgeomni.runtime import memory
from edgeomni.runtime.buffers import Buffers, DeviceBuffers, FixedInputs, HostBuffers
from edgeomni.runtime.engine_api import LENGTHS, EngineBase, EngineError, parse_device
from edgeomni.runtime.media.image import MAX_IMAGE_PIXELS

log = logging.getLogger(__name__)


class Binding(Protocol):
    def bind_in_place(
        self, input_name: str, output_name: str, array: Any, capacity: int | None = None
    ) -> None: ...
    def bind_input(self, name: str, array: Any) -> None: ...
    def bind_output(self, name: str, array: Any) -> None: ...
    def run(
        self, feeds: Mapping[str, Any], *, graph: int | None = None, wait: bool = True
    ) -> None: ...


class Engine(Protocol):
    """What stages see of an engine. What a backend's lowering needs at run time (extra length
    inputs, which inputs a captured graph freezes, where and on which device its buffers live)
    stays behind it: stages allocate and move buffers through ``buffers``, feed the graph's own
    inputs (attention lengths as ``LENGTHS``) and read the engine's preferences, never a
    backend's tensor names, its array types or its device."""

    device: str  # "cpu" or "cuda": where the engine runs (for reports)
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    input_types: dict[str, np.dtype]
    output_types: dict[str, np.dtype]
    output_shapes: dict[str, tuple[Any, ...]]  # ints where fixed, names or None where dynamic
    buffers: Buffers  # its buffers' memory, and the operations on them
    # preferences (what costs less on it; any call runs either way):
    replays_steps: bool  # one-token calls run with graph=id are captured once and replayed
    prefers_fixed_shapes: bool  # calls cost less at a few fixed shapes than at each one's own
    # sequence_graph(queue) captures the calls queue makes through its bindings as one graph
    captures_sequences: bool

    def binding(self) -> Binding: ...
    # an id under which run(graph=id) captures a call once and replays it after; None where
    # this engine captures nothing (a CPU engine, CUDA graphs off)
    def new_graph_id(self) -> int | None: ...
    def sequence_graph(self, queue: Callable[[], None]) -> Any: ...


@dataclass(frozen=True)
class Engines:
    """How a pipeline's stages open their engines, built once and handed to every runner.
    ``threads``: ONNX Runtime's CPU threads per engine. ``cuda_graphs``: GPU engines may capture
    calls that repeat one shape (decode steps, fixed-length windows) and replay them.
    ``spin``: CPU worker threads wait for the next call spinning (best when the stage's calls
    come back to back; off when engines take turns, see OrtEngine). ``max_image_pixels``: the
    most pixels an image file a thinker's media hook decodes may have (media/image.py).
    ``lane``: the stream GPU engines run on (runtime/memory.py; ``memory.BESIDE`` for a stage
    whose calls run on a thread of their own)."""

    threads: int | None = None
    cuda_graphs: bool = True
    spin: bool = True
    max_image_pixels: int = MAX_IMAGE_PIXELS
    lane: int = 0

    def open(
        self, folder: Path, config: Mapping[str, Any], *, spin: bool | None = None,
        replay: bool = True,
    ) -> Engine:  # fmt: skip
        """The engine a stage's config.json describes. ``spin``: this engine's own setting
        (False where its calls alternate with another engine's). ``replay=False``: the stage
        never repeats a call shape (an encoder), so nothing is captured."""
        spin = self.spin if spin is None else spin
        graphs = self.cuda_graphs and replay
        return open_engine(folder, config, threads=self.threads, cuda_graphs=graphs, spin=spin,
                           lane=self.lane)  # fmt: skip

    def captures(self, config: Mapping[str, Any]) -> bool:
        """Whether the engine a config.json describes, opened with these options, captures
        each call shape the first time it runs (a CUDA graph): that run costs more than later
        ones, which a warm-up pays before traffic does."""
        return self.cuda_graphs and str(config.get("device", "cpu")).startswith("cuda")

    def alone(self, spin: bool) -> Engines:
        """These options with ``spin`` set (whether the stages opened now run alone)."""
        return self if spin == self.spin else dataclasses.replace(self, spin=spin)


DEFAULT_ENGINES = Engines()


# the CUDA provider captures a graph id's graph on its third run (the first two allocate), then
# replays it: a binding's first runs of an id hold memory.GRAPH_LOCK
CAPTURE_RUNS = 3


class OrtBinding:
    """One IOBinding: caches and outputs bound once, small inputs re-bound each run (a graphed
    run's inputs copied into buffers of its own, see ``run``)."""

    def __init__(
        self, session: Any, cuda_graphs: bool = False, *, device: int = 0,
        inputs: tuple[str, ...] | None = None, buffers: Buffers | None = None,
    ) -> None:  # fmt: skip
        """``inputs``: the engine's input names (feeds of ``LENGTHS`` it lacks are dropped;
        None: every feed is its input). ``buffers``: where a graphed run's inputs are kept."""
        import onnxruntime as ort

        self._ort = ort
        self._session = session
        self._io = session.io_binding()
        self._keep: list[Any] = []  # OrtValues must outlive the binding
        self._cuda_graphs = cuda_graphs
        self._device = device
        self._options: dict[tuple[int, bool], Any] = {}
        self._inputs = None if inputs is None else frozenset(inputs)
        # GroupQueryAttention (the CUDA lowering) reads each row's cache length and the call's
        # total length from inputs of its own, which the host fills from LENGTHS
        self._host_lengths = inputs is not None and "gqa_seqlens_k" in inputs
        self._as_given = inputs is None or (
            not self._host_lengths and all(n in inputs for n in LENGTHS)
        )
        self._capacity = 0  # the bound cache's, which a captured graph's total length is
        self._runs: dict[int, int] = {}  # graph id -> runs, up to CAPTURE_RUNS
        self._fixed = FixedInputs(buffers or DeviceBuffers(device), self.bind_input)

    def _value(self, array: np.ndarray) -> Any:
        if not array.flags.c_contiguous:
            raise EngineError("a bound buffer must be contiguous")
        value = self._ort.OrtValue.ortvalue_from_numpy(array)
        self._keep.append(value)  # the OrtValue must outlive the binding
        return value

    def bind_in_place(
        self, input_name: str, output_name: str, array: Any, capacity: int | None = None
    ) -> None:
        """The same memory as input and output: host numpy, or a DeviceArray's pointer.
        ``capacity``: a KV cache's positions, as its declaration gives them (row_state.py)."""
        if capacity is not None:
            self._capacity = capacity
        if isinstance(array, np.ndarray):
            value = self._value(array)
            self._io.bind_ortvalue_input(input_name, value)
            self._io.bind_ortvalue_output(output_name, value)
            return
        shape, dtype = list(array.shape), array.dtype.type
        self._io.bind_input(input_name, "cuda", self._device, dtype, shape, array.ptr)
        self._io.bind_output(output_name, "cuda", self._device, dtype, shape, array.ptr)

    def bind_input(self, name: str, array: Any) -> None:
        """An input that stays bound to this buffer."""
        if isinstance(array, np.ndarray):
            self._io.bind_ortvalue_input(name, self._value(array))
        else:
            self._io.bind_input(name, "cuda", self._device, array.dtype.type, list(array.shape),
                                array.ptr)  # fmt: skip

    def bind_output(self, name: str, array: Any) -> None:
        if isinstance(array, np.ndarray):
            self._io.bind_ortvalue_output(name, self._value(array))
        else:
            self._io.bind_output(name, "cuda", self._device, array.dtype.type,
                                 list(array.shape), array.ptr)  # fmt: skip

    def _lengths(self, feeds: Mapping[str, Any]) -> tuple[dict[str, Any], np.ndarray | None]:
        """The feeds as the graph takes them, ``LENGTHS`` it lacks dropped; and where the host
        fills GroupQueryAttention's (the CUDA lowering's) lengths, each row's last position
        added to them and the call's total length returned (a host scalar), else None."""
        if self._as_given or not ("past_lens" in feeds or "query_lens" in feeds):
            return dict(feeds), None
        out = {n: v for n, v in feeds.items() if n in self._inputs or n not in LENGTHS}
        if not (self._host_lengths and all(n in feeds for n in LENGTHS)):
            return out, None
        total = feeds["past_lens"].astype(np.int32) + feeds["query_lens"].astype(np.int32)
        out["gqa_seqlens_k"] = np.maximum(total - 1, 0).astype(np.int32)
        return out, np.array(total.max(), np.int32)

    def run(self, feeds: Mapping[str, Any], *, graph: int | None = None, wait: bool = True) -> None:
        """Feeds are host arrays, copied in by ONNX Runtime, or DeviceArrays, read in place.
        ``graph``: a CUDA graph id (ignored where this engine does not capture): the first runs
        capture, later ones replay, so every feed is copied into a buffer of this binding's
        at a fixed address (host arrays only when they changed), and the lowering's total
        length is frozen at the bound cache's capacity. ``wait=False``: return once the work
        is queued on the device's stream (a GPU engine), not when it is done; the next
        download waits for it."""
        feeds, total_length = self._lengths(feeds)
        captured = graph is not None and self._cuda_graphs
        if captured:
            put = self._fixed.put
            for name, array in feeds.items():
                put(name, array)
            feeds = {}
            if total_length is not None:
                total_length = np.array(self._capacity, np.int32)
        if total_length is not None:
            feeds["gqa_total_length"] = total_length
        for name, array in feeds.items():
            if isinstance(array, np.ndarray):
                self._io.bind_cpu_input(name, np.ascontiguousarray(array))
            else:
                self.bind_input(name, array)
        gid = graph if captured else -1  # -1: no capture
        key = (gid, wait)
        options = self._options.get(key)
        if options is None:
            options = self._options[key] = self._ort.RunOptions()
            # always set: onnxruntime's Python wrapper looks it up in any options it is given,
            # and a missing key costs it an exception (50 us a call here, against 2.5 us)
            options.add_run_config_entry("gpu_graph_id", str(gid))
            if not wait:
                options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        if captured and self._runs.get(gid, 0) < CAPTURE_RUNS:  # it may capture: see memory
            self._runs[gid] = self._runs.get(gid, 0) + 1
            with memory.GRAPH_LOCK:
                self._session.run_with_iobinding(self._io, options)
            return
        self._session.run_with_iobinding(self._io, options)


_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
                "tensor(double)": np.float64, "tensor(int64)": np.int64,
                "tensor(int32)": np.int32}  # fmt: skip


def _numpy_type(ort_type: str) -> np.dtype:
    """An ONNX Runtime type name's numpy dtype (float32 for one not listed)."""
    return np.dtype(_NUMPY_TYPES.get(ort_type, np.float32))


class OrtEngine(EngineBase):
    """An ONNX Runtime session on the CPU provider, or on the CUDA provider for engines built
    for ``cuda`` (the build saved them provider-neutral; the CUDA provider's fusions run here)."""

    BACKEND = "ONNX Runtime"

    def __init__(
        self,
        path: Path,
        config: Mapping[str, Any] | None = None,
        *,
        device: str = "cpu",
        threads: int | None = None,
        cuda_graphs: bool = False,
        spin: bool = True,
        lane: int = 0,
    ) -> None:
        """``device``: "cpu", "cuda" or "cuda:N". ``spin``: CPU worker threads wait for the
        next call spinning (best when this engine's calls come back to back; off when engines
        take turns). ``lane``: a GPU engine's stream (runtime/memory.py). ``config``'s
        ``tf32``: the CUDA provider may run float32 matrix products and convolutions on TF32
        tensor cores (10-bit mantissas); off, float32 is float32."""
        tf32 = bool((config or {}).get("tf32", False))
        if not path.is_file():
            raise EngineError(f"engine file {path} is missing")
        self.device, self.device_id = kind, index = parse_device(device)
        # rows a call may take where its attention has past context and more than one token
        # (0: no cap; the stateful code2wav's step engine): GroupQueryAttention's limit before
        # onnxruntime 1.32. An engine lowered with plain-op attention has no such node (a cuda
        # float32 build's: the stateful step on the GPU, where 1.31 is the newest CUDA wheel)
        plain = bool(((config or {}).get("lowering") or {}).get("plain_attention"))
        self.rows_with_past = 0 if plain else _rows_with_past()
        if kind == "cuda":
            _check_cuda(path, "onnxruntime", index)
        cuda_graphs = cuda_graphs and kind == "cuda"
        try:
            self.session = _session(path, kind, index, threads, cuda_graphs, spin, tf32, lane)
        except Exception as e:  # ORT raises its own exception types
            message = str(e).lower()
            if not (cuda_graphs and ("capture" in message or "cuda graph" in message)):
                raise EngineError(f"ONNX Runtime could not load {path}: {e}") from None
            # a node runs off the GPU (float32 attention, say): this engine runs without graphs
            log.warning("%s: no CUDA graphs for this engine (%s)", path.name, e)
            cuda_graphs = False
            try:
                self.session = _session(path, kind, index, threads, False, spin, tf32, lane)
            except Exception as e2:
                raise EngineError(f"ONNX Runtime could not load {path}: {e2}") from None
        self.cuda_graphs = cuda_graphs  # whether run(graph=id) captures and replays
        self.buffers: Buffers = DeviceBuffers(index, lane) if kind == "cuda" else HostBuffers()
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        self.input_names = tuple(i.name for i in inputs)
        self.output_names = tuple(o.name for o in outputs)
        self.input_types = {i.name: _numpy_type(i.type) for i in inputs}
        self.output_types = {o.name: _numpy_type(o.type) for o in outputs}
        self.output_shapes = {o.name: tuple(o.shape) for o in outputs}
        host_lengths = "gqa_seqlens_k" in self.input_names
        # a captured graph freezes GroupQueryAttention's total length: decode steps are
        # replayed with it set to the cache's capacity
        self.replays_steps = cuda_graphs and "gqa_total_length" in self.input_names
        # each convolution of the CUDA provider sets itself up again (~1 ms of host time)
        # whenever its input shape differs from its last call's; with host-fed attention
        # lengths a call could not be replayed at a padded length anyway
        self.prefers_fixed_shapes = kind == "cuda" and not host_lengths
        self.captures_sequences = False  # ONNX Runtime captures its own graphs, a run each

    def binding(self) -> OrtBinding:
        return OrtBinding(self.session, self.cuda_graphs, device=self.device_id,
                          inputs=self.input_names, buffers=self.buffers)  # fmt: skip


def _session(
    path: Path, device: str, index: int, threads: int | None, cuda_graphs: bool, spin: bool = True,
    tf32: bool = False, lane: int = 0,
) -> Any:  # fmt: skip
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if threads:
        so.intra_op_num_threads = threads
    if not spin:
        # ONNX Runtime's CPU worker threads spin after a call, waiting for the next one: for
        # calls of one engine back to back that saves their wake-up, but while another engine
        # runs they take its cores (each session has its own threads). Engines that take
        # turns (thinker, talker, code predictor, vocoder) ran up to 2x slower with it on a
        # 2-core CPU (docs/benchmarks.md)
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    providers: list[Any] = ["CPUExecutionProvider"]
    if device == "cuda":
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # one stream for every engine and copy of the lane on this GPU. Convolutions pick cuDNN's
        # heuristic algorithm: the default exhaustive search runs again for every new input
        # shape, and on the H200 its choices made code2wav's windows 4-10x slower (docs/design.md)
        cuda = {
            "device_id": str(index),
            "user_compute_stream": str(memory.stream(index, lane)),
            "cudnn_conv_algo_search": "HEURISTIC",
            # the provider's default runs float32 products on TF32 tensor cores: a float32
            # decoder's greedy tokens then left the CPU's (and the fused engine's) a few steps
            # in on the H200. Exact float32 unless the engine's config allows TF32 (code2wav:
            # audio within its tolerance, convolutions several times faster)
            "use_tf32": "1" if tf32 else "0",
        }
        if cuda_graphs:
            cuda["enable_cuda_graph"] = "1"
        providers = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
    session = ort.InferenceSession(str(path), so, providers=providers)
    # onnxruntime's Python session otherwise moves itself to the CPU provider, for good, when a
    # GPU kernel fails: a failure must be an error, not a silently slower engine
    session.disable_fallback()
    if device == "cuda" and "CUDAExecutionProvider" not in session.get_providers():
        raise RuntimeError(f"the CUDA provider did not load (providers: {session.get_providers()})")
    return session


def open_engine(
    folder: Path,
    config: Mapping[str, Any],
    *,
    threads: int | None = None,
    cuda_graphs: bool = False,
    spin: bool = True,
    lane: int = 0,
) -> Engine:
    """The engine a stage's config.json describes, on its ``device`` ("cuda:N": that GPU).
    ``cuda_graphs``: calls that repeat one shape (decode steps) may be captured once as CUDA
    graphs and replayed (GPU engines only). ``spin``: False when its calls alternate with other
    engines' (see OrtEngine). ``lane``: a GPU engine's stream (runtime/memory.py). Stages open
    engines through ``Engines.open``."""
    device = check_engine(folder, config)
    engine = load(BACKENDS[str(config["backend"])].open)
    return engine(folder / str(config["engine"]), config, device=device, threads=threads,
                  cuda_graphs=cuda_graphs, spin=spin, lane=lane)  # fmt: skip


def threads_error(threads: int | None, flag: str = "--threads") -> str | None:
    """Why ``flag`` (--threads, --vocoder-threads) cannot be used, or None: at least 1, and at
    most the cores this process may run on (each engine gets a pool of that size: 100000 asked
    of onnxruntime took 16 GB before it ran)."""
    import os

    if threads is None:
        return None
    if threads < 1:
        return f"{flag} must be at least 1, got {threads}"
    # its affinity where the OS says (as a container's or a board's CPU set does)
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity else os.cpu_count() or 1
    if threads > cores:
        return f"{flag} {threads} is more than the {cores} cores this process may use"
    return None


VOCODER_THREADS_HELP = (
    "vocode on a thread of its own, its engine on N CPU threads (a GPU engine on a CUDA stream "
    "of its own), while the talker and code predictor make the next frames (their engines keep "
    "--threads); streaming stateful or in windows, not whole utterances. Stateful chunks are "
    "then one frame first and 8 after (unless the graph's stage config sets first_chunk_frames, "
    "chunk_frames). Measured on 2 cores (docs/benchmarks.md): one "
    "Qwen3-TTS 0.6B int4 stream 1.09-1.14x faster with --vocoder-threads 1, its first audio "
    "0.02 s later; float32, and four int4 streams at once, no faster (on a GPU: "
    "docs/benchmarks.md). Default: off (the vocoder in turn with the other stages)"
)


def check_engine(folder: Path, config: Mapping[str, Any]) -> str:
    """What can be known of an engine without loading it: a backend and device this runtime
    runs, its file, and an onnxruntime new enough for its lowering (whether this machine has
    the GPU a cuda engine needs is found when it loads). Returns the device."""
    backend, device = config.get("backend"), config.get("device", "cpu")
    try:
        kind = parse_device(device)[0]
    except EngineError:
        kind = None
    spec = BACKENDS.get(str(backend))
    if spec is None or kind not in spec.devices:
        runs = ", ".join(f"{name} on {'/'.join(b.devices)}" for name, b in BACKENDS.items())
        raise EngineError(
            f"engines for backend {backend!r} on device {device!r} are not supported by this "
            f"runtime (it runs {runs}: cuda, or cuda:N for the GPU of index N)"
        )
    engine_file = folder / str(config.get("engine", ""))
    if not config.get("engine") or not engine_file.is_file():
        raise EngineError(f"engine file {engine_file} is missing")
    if spec.check:
        load(spec.check)(folder, config, engine_file)
    elif engine_file.stat().st_size == 0:
        raise EngineError(f"engine file {engine_file} is empty")
    if kind == "cuda":
        _check_cuda(engine_file, str(backend), parse_device(device)[1])
    return str(device)


def check_onnx(folder: Path, config: Mapping[str, Any], engine_file: Path) -> None:
    """An ONNX Runtime engine file that loads, for an onnxruntime new enough for its lowering."""
    from edgeomni.runtime.onnx_header import OnnxFileError, check_onnx_file

    try:
        check_onnx_file(engine_file)
    except (OnnxFileError, OSError) as e:
        raise EngineError(f"{engine_file} is not a loadable ONNX model: {e}") from None
    _check_lowering(folder, config.get("lowering") or {})
    if "state" in config:  # the declared row state against the model's inputs and outputs
        from edgeomni.runtime.row_state import check_declared

        check_declared(config, engine_file, folder / "config.json")


def _check_cuda(engine_file: Path, backend: str, device: int = 0) -> None:
    """A GPU engine needs an NVIDIA GPU on this machine and its runtime's GPU support: found
    here, before anything loads, never by falling back to the CPU; what is missing is named
    once, all of it (cuda_missing)."""
    missing = cuda_missing(backend, device)
    if missing:
        raise EngineError(f"{engine_file.name} was built for cuda, but {' and '.join(missing)}")


# onnxruntime before this version refuses GroupQueryAttention with past context for more than one
# row when a call has more than one token ("batch_size must be 1 when sequence_length > 1 and past
# context is given", 1.31.1 on the CPU)
BATCHED_PAST_ATTENTION = (1, 32)


def _rows_with_past() -> int:
    import onnxruntime as ort

    have = tuple(int(x) for x in ort.__version__.split(".")[:2])
    return 1 if have < BATCHED_PAST_ATTENTION else 0


def _check_lowering(folder: Path, lowering: Mapping[str, Any]) -> None:
    """Refuse an engine that needs a newer onnxruntime than this one, before loading it."""
    needs = []
    if lowering.get("gqa_query_seqlens"):
        needs.append(((1, 32), "GroupQueryAttention's query_seqlens"))
    if lowering.get("fused_attention_prologue"):
        needs.append(((1, 31), "GroupQueryAttention's q/k norm inputs"))
    if lowering.get("gated_delta_net"):
        needs.append(((1, 32), "GatedDeltaNet and CausalConvWithState"))
    if not needs:
        return
    import onnxruntime as ort

    have = tuple(int(x) for x in ort.__version__.split(".")[:2])
    unmet = [(need, what) for need, what in needs if have < need]
    if unmet:  # all of what it needs, in one message
        need = max(n for n, _ in unmet)
        raise EngineError(
            f"{folder}: this engine was built with onnxruntime {lowering.get('onnxruntime')} "
            f"and needs {need[0]}.{need[1]} or later ({'; '.join(w for _, w in unmet)}); this "
            f"is {ort.__version__}. Rebuild it with the onnxruntime you deploy installed."
        )
