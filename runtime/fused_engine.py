"""The fused backend: a dense Qwen3-style decoder (export/common/decoder.py's CausalLM) run by
edgeomni's own CUDA kernels (plugins/decoder_cuda.py, plugins/attention_cuda.py) behind the
Engine interface, with the ONNX build's tensor names, so stages call it as they call an ONNX
Runtime or TensorRT decoder.

edge-build --backend fused writes the decoder's weights as laid out for the kernels
(``<component>.fused.safetensors``: per layer the packed q/k/v, o, packed gate/up and down
matrices [out, in], the norms in float32; the LM head [V, H]) and the dimensions under
config.json's ``fused``. At load the kernels are compiled by NVRTC for this GPU and the weights
copied to it; nothing else is needed on the board (no torch, no ONNX Runtime).

A call runs five kernels a layer (see plugins/decoder_cuda.py; four in decode calls, whose
attention kernel does the q/k norm and rotary itself), then the final norm and LM head
over each row's last position, and the top-K on the device; a build with an in-engine sampler
(the code predictor on cuda) also draws each row's next id from it and gathers its embedding
for the next call, so a frame's steps run without the host. Activations are float32, weights and
the KV cache float16 or float32 (the build's --dtype); inputs and outputs have the ONNX build's
types (float16 logits and hidden states in a float16 build; inputs_embeds float32 where that
build casts them inside), so fused and ONNX Runtime engines feed each other as they are. Decode
steps (``graph=id``) are captured once as CUDA graphs and replayed, as the other GPU engines do;
``sequence_graph`` captures a sequence of calls that repeats with the same buffers (a code
predictor's frame: its prefill, its steps and their draws) as one graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.graph_schema.state import StateTensor, kv_tensors
from edgeomni.runtime import memory
from edgeomni.runtime.buffers import DeviceBuffers, FixedInputs
from edgeomni.runtime.engine_api import EngineBase, EngineError, parse_device

log = logging.getLogger(__name__)

# the float types a build writes its weights and cache in
DTYPES = ("float16", "float32")
# calls of fewer tokens than this (decode steps of up to 63 rows) queue their kernels as
# programmatic dependent launches; longer calls (prefills: large grids, unmeasured) do not
OVERLAP_MAX_TOKENS = 64


class FusedSpec:
    """config.json's ``fused`` table: the decoder's dimensions and options, checked."""

    def __init__(self, table: Mapping[str, Any], where: str) -> None:
        def need(key: str) -> int:
            if not isinstance(table.get(key), int) or table[key] <= 0:
                raise EngineError(f"{where}: fused.{key} must be a positive integer")
            return int(table[key])

        self.hidden = need("hidden_size")
        self.layers = need("num_layers")
        self.heads = need("num_heads")
        self.kv_heads = need("num_kv_heads")
        self.head_dim = need("head_dim")
        self.intermediate = need("intermediate_size")
        self.vocab = need("vocab_size")
        self.eps = float(table.get("rms_norm_eps", 1e-6))
        self.dtype = str(table.get("dtype", "float16"))
        if self.dtype not in DTYPES:
            raise EngineError(f"{where}: fused.dtype {self.dtype!r} is not one of {DTYPES}")
        self.input_size = int(table.get("input_size") or 0)
        self.lm_heads = int(table.get("lm_heads") or 1)
        self.mrope = bool(table.get("mrope"))
        hidden_layer = table.get("hidden_output_layer")
        self.hidden_output_layer = None if hidden_layer is None else int(hidden_layer)
        self.last_hidden = bool(table.get("last_hidden_output"))
        self.deepstack_layers = int(table.get("deepstack_layers") or 0)
        self.topk = int(table.get("logits_topk") or 0)
        self.embeds_dtype = str(table.get("embeds_dtype", "float32"))
        if self.embeds_dtype not in DTYPES:
            raise EngineError(f"{where}: fused.embeds_dtype {self.embeds_dtype!r} is not one of "
                              f"{DTYPES}")  # fmt: skip
        # draws each row's next id from its top-K and outputs its embedding
        # (export/common/sampler.py's inputs and outputs)
        self.sampler = bool(table.get("sampler"))
        if self.sampler and (self.topk < 2 or self.embeds_dtype != self.dtype):
            raise EngineError(f"{where}: an in-engine sampler needs logits_topk >= 2 and "
                              "embeds_dtype equal to dtype (its embeddings feed the next call)")
        self.qk_norm = bool(table.get("qk_norm", True))
        self.bias = bool(table.get("attention_bias"))
        vec = 8 if self.dtype == "float16" else 4
        widths = {"hidden_size": self.hidden, "intermediate_size": self.intermediate,
                  "num_heads * head_dim": self.heads * self.head_dim}  # fmt: skip
        if self.input_size:
            widths["input_size"] = self.input_size
        for name, n in widths.items():
            if n % vec:
                raise EngineError(f"{where}: {name} {n} is not a multiple of {vec}, as the "
                                  "fused kernels read weight rows 16 bytes at a time")  # fmt: skip
        if self.head_dim > 512 or self.head_dim % 2:
            raise EngineError(f"{where}: head_dim {self.head_dim} must be even and at most 512")
        # int4 matrices (edge-build --quantization int4_rtn): each layer's four, and the LM head
        # where ``lm_head`` says so; codes [rows, K / 2] under the matrix's name, one float16
        # scale a row and group of K under ``<name>.scales``
        int4 = table.get("int4")
        self.int4_group = 0
        self.int4_lm_head = False
        if int4 is not None:
            group = int4.get("group_size") if isinstance(int4, Mapping) else None
            if self.dtype != "float16" or group not in (32, 64, 128):
                raise EngineError(f"{where}: fused.int4 needs dtype float16 and a group_size of "
                                  "32, 64 or 128")  # fmt: skip
            for name, n in widths.items():  # the int4 matrices' K (input_proj stays float)
                if name != "input_size" and n % group:
                    raise EngineError(f"{where}: {name} {n} is not a multiple of the int4 group "
                                      f"size {group}")  # fmt: skip
            self.int4_group = int(group)
            self.int4_lm_head = bool(int4.get("lm_head"))

    def int4(self, matrix: str) -> bool:
        """Whether the weight ``matrix`` (a tensor name) is int4."""
        from edgeomni.plugins import decoder_linear_cuda as lc

        if not self.int4_group:
            return False
        if matrix == "lm_head":
            return self.int4_lm_head
        return matrix.startswith("layers.") and matrix.rsplit(".", 1)[-1] in lc.INT4_MATRICES


def _names(spec: FusedSpec) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ONNX build's input and output names (export/common/decoder.py, CausalLM.io_names)."""
    inputs = ["inputs_embeds", "position_ids", "past_lens", "query_lens", "last_indices"]
    if spec.lm_heads > 1:
        inputs.append("lm_head_index")
    if spec.sampler:
        inputs += SAMPLER_INPUTS
    if spec.deepstack_layers:
        inputs.append("deepstack_embeds")
    outputs = ["logits"]
    if spec.topk:
        outputs += ["topk_values", "topk_indices"]
    if spec.sampler:
        outputs += SAMPLER_OUTPUTS
    if spec.hidden_output_layer is not None:
        outputs.append("hidden_states")
    if spec.last_hidden:
        outputs.append("last_hidden")
    state = _state(spec)
    return tuple(inputs + [t.input for t in state]), tuple(outputs + [t.output for t in state])


def _state(spec: FusedSpec) -> list[StateTensor]:
    """Its row state: the KV cache the ONNX build of the same decoder declares."""
    return kv_tensors(spec.layers, spec.kv_heads, spec.head_dim, np.dtype(spec.dtype).name)


# export/common/sampler.py's names (that module needs torch; the runtime does not)
SAMPLER_INPUTS = ("sample_uniform", "sample_temperature", "sample_top_k", "sample_top_p")
SAMPLER_OUTPUTS = ("sampled_ids", "sampled_embeds")


def io_types(
    spec: FusedSpec,
) -> tuple[dict[str, np.dtype], dict[str, np.dtype], dict[str, tuple[Any, ...]]]:
    """The ONNX build's input types, output types and output shapes: float inputs in
    ``embeds_dtype``, float outputs and the cache in ``dtype``, the lengths and indices as
    export/common/decoder.py declares them."""
    inputs, outputs = _names(spec)
    floats, kv = np.dtype(spec.embeds_dtype), np.dtype(spec.dtype)
    ints = {"position_ids": np.dtype(np.int64), "past_lens": np.dtype(np.int32),
            "query_lens": np.dtype(np.int32), "last_indices": np.dtype(np.int64),
            "lm_head_index": np.dtype(np.int64), "topk_indices": np.dtype(np.int64),
            "sample_uniform": np.dtype(np.float64), "sample_temperature": np.dtype(np.float64),
            "sample_top_k": np.dtype(np.int64), "sample_top_p": np.dtype(np.float64),
            "sampled_ids": np.dtype(np.int64)}  # fmt: skip
    cache = ("batch", spec.kv_heads, "capacity", spec.head_dim)
    state = {n for t in _state(spec) for n in (t.input, t.output)}
    shapes: dict[str, tuple[Any, ...]] = {
        "logits": ("batch", spec.vocab), "topk_values": ("batch", spec.topk),
        "topk_indices": ("batch", spec.topk), "hidden_states": ("batch", "seq", spec.hidden),
        "last_hidden": ("batch", spec.hidden), "sampled_ids": ("batch",),
        "sampled_embeds": ("batch", spec.input_size or spec.hidden),
    }  # fmt: skip

    def kind(name: str, default: np.dtype) -> np.dtype:
        return kv if name in state else ints.get(name, default)

    return ({n: kind(n, floats) for n in inputs}, {n: kind(n, kv) for n in outputs},
            {n: cache if n in state else shapes[n] for n in outputs})  # fmt: skip


class FusedEngine(EngineBase):
    """A fused decoder on one GPU; see the module docstring."""

    BACKEND = "fused"
    device = "cuda"
    prefers_fixed_shapes = False  # a call of any shape costs only its kernels

    def __init__(
        self, path: Path, config: Mapping[str, Any], *, cuda_graphs: bool = False,
        device: str = "cuda", threads: int | None = None, spin: bool = True,
    ) -> None:  # fmt: skip
        """As TrtEngine's."""
        from edgeomni.plugins import attention_cuda as ac
        from edgeomni.plugins import decoder_cuda as dc
        from edgeomni.runtime import safetensors_np

        self.device_id = index = parse_device(device)[1]
        self.stream = memory.stream(index)  # and the device is current, for the runtime
        memory._check(memory._cudart().cudaSetDevice(index), "cudaSetDevice")
        memory._check(memory._cudart().cudaFree(0), "cudaFree")  # the primary context, current
        self.buffers = DeviceBuffers(index)
        self.spec = spec = FusedSpec(config.get("fused") or {}, str(path.parent / "config.json"))
        self.input_names, self.output_names = _names(spec)
        self.input_types, self.output_types, self.output_shapes = io_types(spec)
        try:
            tensors = safetensors_np.load(path)
        except (OSError, ValueError) as e:
            raise EngineError(f"cannot read the fused weights {path}: {e}") from None
        self._check_weights(path, tensors)  # on the host: nothing allocated for a bad file
        step = 8 if spec.dtype == "float16" else 4  # the kernels read 16 bytes of a weight row
        inner = {"hidden_size": spec.hidden, "heads x head_dim": spec.heads * spec.head_dim,
                 "intermediate_size": spec.intermediate, "input size": spec.input_size or step}
        for what, k in inner.items():
            if k % step:
                raise EngineError(f"{path}: {what} = {k} is not a multiple of {step}, as the "
                                  f"fused kernels read {spec.dtype} weights")  # fmt: skip
        self.weights = {name: self._upload(t) for name, t in tensors.items()}
        if spec.topk:
            chunks = -(-spec.vocab // dc.TOPK_CHUNK)
            if spec.topk > dc.TOPK_MAX or chunks * spec.topk > dc.TOPK_CHUNK:
                raise EngineError(f"{path}: logits top-{spec.topk} of {spec.vocab} is more than "
                                  "the fused top-K kernels take")  # fmt: skip
        attention = ac.KernelConfig(spec.heads, spec.kv_heads, spec.head_dim, dtype=spec.dtype)
        try:
            self.kernels = dc.kernels_for(dc.Variant(spec.dtype, spec.dtype))
            self.attention = ac.CudaAttention(attention, cubin=dc.cubin)
            # decode calls: q/k norm and rotary inside the attention kernel (one kernel a layer
            # fewer; the same bits); None: qk_rope then attention (bench/fused_gpu.py sets it)
            self.attention_qk = None
            with contextlib.suppress(ValueError):  # a head too large for its shared memory
                fused = dataclasses.replace(attention, fused_qk=1)
                self.attention_qk = ac.CudaAttention(fused, cubin=dc.cubin)
        except ac.KernelError as e:
            raise EngineError(f"{path}: the fused kernels could not be loaded: {e}") from None
        self.cu_stream = ac.stream_handle(self.stream)
        # programmatic dependent launch on sm_90+ (a bench or test may set it False to measure)
        self.overlap = dc.compute_capability() >= (9, 0)
        self.cuda_graphs = self.replays_steps = self.captures_sequences = cuda_graphs
        # while sequence_graph runs its queue: "load" or "capture", and the bindings it called
        self._sequence_mode: str | None = None
        self._sequence: list[FusedBinding] = []

    def _upload(self, tensor: np.ndarray) -> Any:
        buf = self.buffers.zeros(tensor.shape, tensor.dtype)
        buf.upload(tensor)
        return buf

    def _check_weights(self, path: Path, tensors: Mapping[str, np.ndarray]) -> None:
        """Every tensor the config's dimensions need, of its shape and type."""
        spec = self.spec
        w = np.dtype(spec.dtype)
        h, d, i = spec.hidden, spec.head_dim, spec.intermediate
        qkv = (spec.heads + 2 * spec.kv_heads) * d
        want: dict[str, tuple[tuple[int, ...], np.dtype]] = {
            "norm": ((h,), np.dtype(np.float32)),
            "inv_freq": ((d // 2,), np.dtype(np.float32)),
            "lm_head": ((*((spec.lm_heads,) if spec.lm_heads > 1 else ()), spec.vocab, h), w),
        }
        for n in range(spec.layers):
            p = f"layers.{n}."
            want[p + "qkv"] = ((qkv, h), w)
            want[p + "o"] = ((h, spec.heads * d), w)
            want[p + "gate_up"] = ((2 * i, h), w)
            want[p + "down"] = ((h, i), w)
            want[p + "input_norm"] = ((h,), np.dtype(np.float32))
            want[p + "post_norm"] = ((h,), np.dtype(np.float32))
            if spec.qk_norm:
                want[p + "q_norm"] = ((d,), np.dtype(np.float32))
                want[p + "k_norm"] = ((d,), np.dtype(np.float32))
            if spec.bias:
                want[p + "qkv_bias"] = ((qkv,), np.dtype(np.float32))
                want[p + "o_bias"] = ((h,), np.dtype(np.float32))
        if spec.input_size:
            want["input_proj"] = ((h, spec.input_size), w)
            want["input_proj_bias"] = ((h,), np.dtype(np.float32))
        if spec.sampler:
            width = spec.input_size or h
            want["sampler_tables"] = ((spec.lm_heads, spec.vocab, width), w)
        if spec.mrope:
            want["freq_axis"] = ((d // 2,), np.dtype(np.int32))
        for name in [n for n in want if spec.int4(n)]:  # codes, and their scales
            shape = want[name][0]
            want[name] = ((*shape[:-1], shape[-1] // 2), np.dtype(np.uint8))
            want[name + ".scales"] = ((*shape[:-1], shape[-1] // spec.int4_group),
                                      np.dtype(np.float16))  # fmt: skip
        for name, (shape, dtype) in want.items():
            got = tensors.get(name)
            if got is None:
                raise EngineError(f"{path} has no tensor {name!r}")
            if got.shape != shape or got.dtype != dtype:
                raise EngineError(f"{path}: {name} is {got.shape} {got.dtype}, the config "
                                  f"says {shape} {dtype}")  # fmt: skip

    def binding(self) -> FusedBinding:
        return FusedBinding(self)

    def sequence_graph(self, queue: Callable[[], None]) -> SequenceGraph:
        """The calls ``queue`` makes through this engine's bindings, and the device copies it
        queues between them, as one CUDA graph: one launch for what is otherwise a launch a
        call and the host's work around each (a code-predictor frame: 16 calls, 15 draws).
        ``queue`` runs twice: first to load each call's host feeds into its binding's fixed
        buffers and size its scratch (no kernel runs; the copies it queues do), then under
        stream capture. Every feed is copied into the binding's fixed buffers inside the graph,
        so the device buffers ``queue`` passes are read at their addresses at each launch (the
        caller keeps them), and host feeds are frozen: one that differs between the two runs is
        an error (feed what changes from a device buffer)."""
        if self._sequence_mode is not None:
            raise EngineError("a sequence graph is already being captured")
        cudart = memory._cudart()
        memory.use(self.device_id)
        self._sequence, self._sequence_mode = [], "load"
        try:
            queue()
            bindings = list(self._sequence)
            generations = [b.generation for b in bindings]
            self._sequence_mode = "capture"
            mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
            with memory.capturing():
                memory._check(cudart.cudaStreamBeginCapture(self.stream, mode),
                              "cudaStreamBeginCapture")  # fmt: skip
                done = False
                try:
                    queue()
                    done = True
                finally:
                    g = memory._check(cudart.cudaStreamEndCapture(self.stream),
                                      "cudaStreamEndCapture")  # fmt: skip
                    if not done:
                        cudart.cudaGraphDestroy(g)
        finally:
            self._sequence_mode, self._sequence = None, []
        if [b.generation for b in bindings] != generations:
            cudart.cudaGraphDestroy(g)
            raise EngineError("a call's buffers changed between loading and capturing a "
                              "sequence graph")  # fmt: skip
        try:
            graph = memory._check(cudart.cudaGraphInstantiate(g, 0), "cudaGraphInstantiate")
        finally:
            cudart.cudaGraphDestroy(g)
        return SequenceGraph(self, graph, bindings)


class SequenceGraph:
    """FusedEngine.sequence_graph's graph: valid while none of its calls' bindings has
    reallocated a buffer it reads (it holds them, and so every buffer they bind)."""

    def __init__(self, engine: FusedEngine, graph: Any, bindings: list[FusedBinding]) -> None:
        self._engine, self._graph = engine, graph
        self._bindings = [(b, b.generation) for b in bindings]

    def valid(self) -> bool:
        return all(b.generation == g for b, g in self._bindings)

    def launch(self) -> None:
        """Queued on the engine's stream; the host does not wait."""
        if not self.valid():
            raise EngineError("a call of this sequence graph has new buffers: capture it again")
        memory.use(self._engine.device_id)
        memory._check(memory._cudart().cudaGraphLaunch(self._graph, self._engine.stream),
                      "cudaGraphLaunch")  # fmt: skip

    def __del__(self) -> None:
        graph = getattr(self, "_graph", None)
        if graph is not None:
            with contextlib.suppress(Exception):  # at interpreter shutdown there is no runtime
                memory._cudart().cudaGraphExecDestroy(graph)


class FusedBinding:
    """Buffers for one user of a fused engine, as TrtBinding keeps them: bound buffers stay,
    host feeds go through staging buffers, outputs not bound and the activations live in
    scratch buffers of this binding's (a captured graph replays against their addresses)."""

    def __init__(self, engine: FusedEngine) -> None:
        self._engine = engine
        self._arrays: dict[str, Any] = {}  # every input and output by name, device buffers
        self._staging: dict[str, Any] = {}
        self._scratch: dict[str, Any] = {}
        self._graphs: dict[int, Any] = {}
        self._fixed = FixedInputs(engine.buffers, self.bind_input)
        # counts the times a buffer a captured graph may read was replaced (SequenceGraph.valid)
        self.generation = 0
        self.bound_capacity: int | None = None  # the bound cache's positions

    def bind_in_place(
        self, input_name: str, output_name: str, array: Any, capacity: int | None = None
    ) -> None:
        """``capacity``: the cache's positions, as its declaration gives them."""
        if capacity is not None:
            self.bound_capacity = capacity
        self.bind_input(input_name, array)
        self.bind_output(output_name, array)

    def bind_input(self, name: str, array: Any) -> None:
        self.bind_output(name, array)

    def bind_output(self, name: str, array: Any) -> None:
        if isinstance(array, np.ndarray):
            raise EngineError(f"{name}: a fused engine binds device buffers, not numpy arrays")
        held = self._arrays.get(name)
        if held is not None and (held.ptr, held.nbytes) != (array.ptr, array.nbytes):
            self.generation += 1
        self._arrays[name] = array

    def _stage(self, name: str, array: np.ndarray) -> None:
        dtype = self._engine.input_types[name]
        held = self._staging.get(name)
        if held is None or held.nbytes < array.size * dtype.itemsize:
            held = self._staging[name] = self._engine.buffers.zeros((max(array.size, 1),), dtype)
            self._graphs.clear()  # captured graphs read the old buffer
            self.generation += 1
        view = held.rows(array.size).view(array.shape)
        view.upload(array.astype(dtype, copy=False))
        self._arrays[name] = view

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """A scratch buffer of this shape (reused while large enough; a new one drops the
        captured graphs that read the old)."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        held = self._scratch.get(name)
        if held is None or held.nbytes < nbytes:
            held = self._scratch[name] = self._engine.buffers.zeros((max(nbytes, 1),), np.uint8)
            self._graphs.clear()
            self.generation += 1
        return held.ptr

    def run(self, feeds: Mapping[str, Any], *, graph: int | None = None, wait: bool = True) -> None:
        """As the other engines' bindings: host feeds are copied in, device feeds read in
        place; ``graph`` captures the call once and replays it after, its feeds copied into
        fixed buffers of this binding's."""
        engine = self._engine
        if engine._sequence_mode is not None:
            self._sequenced(feeds, engine._sequence_mode == "load")
            return
        captured = graph is not None and engine.cuda_graphs
        for name, array in feeds.items():
            if name not in engine.input_types:
                raise EngineError(f"the fused engine has no input {name!r}")
            if captured:
                self._fixed.put(name, array)
            elif isinstance(array, np.ndarray):
                self._stage(name, np.ascontiguousarray(array))
            else:
                self.bind_input(name, array)
        missing = [n for n in engine.input_names if n not in self._arrays]
        if missing:
            raise EngineError(f"no buffer for input(s) {', '.join(missing)}")
        cudart = memory._cudart()
        memory.use(engine.device_id)
        if captured and graph in self._graphs:
            memory._check(cudart.cudaGraphLaunch(self._graphs[graph], engine.stream),
                          "cudaGraphLaunch")  # fmt: skip
        elif captured:
            self._plan()  # scratch allocated before the capture (no cudaMalloc inside it)
            mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
            s = engine.stream
            with memory.capturing():
                memory._check(cudart.cudaStreamBeginCapture(s, mode), "cudaStreamBeginCapture")
                try:
                    self._enqueue()
                finally:
                    g = memory._check(cudart.cudaStreamEndCapture(s), "cudaStreamEndCapture")
            self._graphs[graph] = memory._check(cudart.cudaGraphInstantiate(g, 0),
                                                "cudaGraphInstantiate")  # fmt: skip
            memory._check(cudart.cudaGraphLaunch(self._graphs[graph], s), "cudaGraphLaunch")
        else:
            self._plan()
            self._enqueue()
        if wait:
            memory.synchronize(engine.device_id)

    def _sequenced(self, feeds: Mapping[str, Any], loading: bool) -> None:
        """A call inside FusedEngine.sequence_graph: every feed through the fixed buffers;
        ``loading``, host feeds uploaded and the scratch sized, else the device feeds' copies
        and the kernels queued (under capture)."""
        engine = self._engine
        for name, array in feeds.items():
            if name not in engine.input_types:
                raise EngineError(f"the fused engine has no input {name!r}")
            if loading or not isinstance(array, np.ndarray):
                self._fixed.put(name, array)
            elif not self._fixed.holds(name, array):
                raise EngineError(f"{name}: a host feed differs between loading and capturing a "
                                  "sequence graph, which freezes it")  # fmt: skip
        missing = [n for n in engine.input_names if n not in self._arrays]
        if missing:
            raise EngineError(f"no buffer for input(s) {', '.join(missing)}")
        self._plan()
        if loading:
            engine._sequence.append(self)
        else:
            self._enqueue()

    def _plan(self) -> None:
        """The call's shapes, its scratch buffers and the outputs it was not given."""
        engine, spec = self._engine, self._engine.spec
        embeds = self._arrays["inputs_embeds"]
        self.batch, self.seq = int(embeds.shape[0]), int(embeds.shape[1])
        width = spec.input_size or spec.hidden
        if tuple(embeds.shape[2:]) != (width,):
            raise EngineError(f"inputs_embeds is {tuple(embeds.shape)}; the engine takes "
                              f"[batch, seq, {width}]")  # fmt: skip
        if self.bound_capacity is None:
            raise EngineError("no KV cache is bound: bind the declared state (row_state.py)")
        self.capacity = self.bound_capacity
        tokens = self.batch * self.seq
        d, at = spec.head_dim, np.dtype(spec.dtype)
        f4 = np.float32
        self.ptrs = {
            "h": self._buffer("h", (tokens, spec.hidden), f4),
            "qkv": self._buffer("qkv", (tokens, (spec.heads + 2 * spec.kv_heads) * d), f4),
            "q": self._buffer("q", (tokens, spec.heads * d), at),
            "k": self._buffer("k", (tokens, spec.kv_heads * d), at),
            "v": self._buffer("v", (tokens, spec.kv_heads * d), at),
            "attn": self._buffer("attn", (tokens, spec.heads * d), at),
            "act": self._buffer("act", (tokens, spec.intermediate), f4),
        }
        if spec.dtype == "float16":  # float32 results, cast into the float16 outputs at the end
            self.ptrs["logits32"] = self._buffer("logits32", (self.batch, spec.vocab), f4)
            self.ptrs["topk32"] = self._buffer("topk32", (self.batch, max(spec.topk, 1)), f4)
            self.ptrs["last32"] = self._buffer("last32", (self.batch, spec.hidden), f4)
        if spec.topk:
            from edgeomni.plugins.decoder_cuda import TOPK_CHUNK

            chunks = -(-spec.vocab // TOPK_CHUNK)
            self.ptrs["cand_v"] = self._buffer("cand_v", (self.batch, chunks * spec.topk), f4)
            self.ptrs["cand_i"] = self._buffer("cand_i", (self.batch, chunks * spec.topk), np.int32)
        shapes = {"logits": (self.batch, spec.vocab), "topk_values": (self.batch, spec.topk),
                  "topk_indices": (self.batch, spec.topk),
                  "hidden_states": (self.batch, self.seq, spec.hidden),
                  "last_hidden": (self.batch, spec.hidden), "sampled_ids": (self.batch,),
                  "sampled_embeds": (self.batch, spec.input_size or spec.hidden)}  # fmt: skip
        for name in engine.output_names:
            if name in shapes:  # the caller's buffer, or one of this binding's
                bound = self._arrays.get(name)
                self.ptrs[name] = (
                    bound.ptr if bound is not None
                    else self._buffer("out:" + name, shapes[name], engine.output_types[name])
                )  # fmt: skip

    def _enqueue(self) -> None:
        """Queue the call's kernels on the engine's stream."""
        from edgeomni.plugins import attention_cuda as ac
        from edgeomni.plugins import decoder_cuda as dc
        from edgeomni.plugins import decoder_linear_cuda as lc
        from edgeomni.plugins.decoder_cuda import f32, i32, i64, ptr

        engine, spec, p = self._engine, self._engine.spec, self.ptrs
        kernels, stream, w = engine.kernels, engine.cu_stream, engine.weights
        a = {n: self._arrays[n].ptr for n in self._arrays}
        b, s = self.batch, self.seq
        tokens = b * s
        half_attn = spec.dtype == "float16"

        follows_ours = False  # the last thing queued was a kernel of ours (decoder_cuda, attention)
        # dependent launches for decode-sized calls: with session 27's kernels (padded
        # tensor-core partial sums, two blocks an SM) whole steps were faster with them at 1, 8
        # and 32 rows on the H200 (session 25's kernels were slower with them at 8 and 32 rows;
        # docs/history/benchmarks-2026-12-04.md, issue 34's fourth slice)
        overlap = engine.overlap and tokens < OVERLAP_MAX_TOKENS

        def launch(name: str, grid: tuple[int, ...], block: int, args: list[Any],
                   shared: int = 0) -> None:  # fmt: skip
            """A kernel of decoder_cuda's, overlapping the one before where that is one too."""
            nonlocal follows_ours
            kernels.launch(name, grid, block, args, shared=shared, stream=stream,
                           overlap=overlap and follows_ours)  # fmt: skip
            follows_ours = True

        def copy(dst: int, src: int, nbytes: int) -> None:
            nonlocal follows_ours
            self._copy(dst, src, nbytes)
            follows_ours = False

        def wp(name: str) -> int | None:
            t = w.get(name)
            return None if t is None else t.ptr

        def linear(x: int, weight: str, out: int, k: int, n: int, *, rows: int = tokens,
                   norm: str | None = None, bias: str | None = None, swiglu: bool = False,
                   store: int = lc.STORE_SET, half_x: bool = False, rowmap: int | None = None,
                   head_stride: int = 0, head_index: int | None = None) -> None:  # fmt: skip
            int4 = spec.int4(weight)
            plan = lc.linear_launch(kernels.variant.weights, rows, k, n, half_input=half_x,
                                    swiglu=swiglu, int4=int4)  # fmt: skip
            args = [ptr(x), ptr(rowmap), i32(s), ptr(wp(norm) if norm else None), f32(spec.eps),
                    ptr(wp(weight)), i64(head_stride), ptr(head_index),
                    ptr(wp(bias) if bias else None), ptr(out), i32(rows), i32(k), i32(n),
                    i32(store)]  # fmt: skip
            if int4:  # the codes' scales, one a row and group of K
                args += [ptr(wp(weight + ".scales")), i32(spec.int4_group)]
            launch(plan.name, plan.grid, plan.block, args)

        h = p["h"]
        # SwiGLU's output in float16 where the down projection runs on tensor cores (which
        # round it to float16 anyway): half the bytes it reads, no conversion
        half_act = lc.linear_uses_mma(kernels.variant.weights, tokens)
        half_in = spec.embeds_dtype == "float16"
        half_out = spec.dtype == "float16"
        hidden_bytes = tokens * spec.hidden * 4

        def elementwise(name: str, dst: int, src: int, count: int) -> None:
            launch(name, (-(-count // 256),), 256, [ptr(dst), ptr(src), i64(count)])

        def output(name: str, src: int, count: int) -> None:
            """A float32 result into its output, cast where the output is float16."""
            if half_out:
                elementwise("float_to_half", p[name], src, count)
            elif p[name] != src:
                copy(p[name], src, count * 4)

        if spec.input_size:
            linear(a["inputs_embeds"], "input_proj", h, spec.input_size, spec.hidden,
                   bias="input_proj_bias", half_x=half_in)  # fmt: skip
        elif half_in:
            elementwise("half_to_float", h, a["inputs_embeds"], tokens * spec.hidden)
        else:
            copy(h, a["inputs_embeds"], hidden_bytes)
        if spec.hidden_output_layer == 0:
            output("hidden_states", h, tokens * spec.hidden)
        d = spec.head_dim
        qkv_n = (spec.heads + 2 * spec.kv_heads) * d
        rope_grid, rope_block, rope_shared = dc.rope_launch(
            tokens, spec.heads + 2 * spec.kv_heads, d)
        axis = wp("freq_axis")
        fused_qk = engine.attention_qk if s == 1 else None  # decode: q/k norm, rotary inside
        for n in range(spec.layers):
            pre = f"layers.{n}."
            linear(h, pre + "qkv", p["qkv"], spec.hidden, qkv_n, norm=pre + "input_norm",
                   bias=pre + "qkv_bias" if spec.bias else None)  # fmt: skip
            qn, kn = (wp(pre + "q_norm"), wp(pre + "k_norm")) if spec.qk_norm else (None, None)
            key, value = a[f"past_key_{n}"], a[f"past_value_{n}"]
            if fused_qk is not None:
                qk = ac.FusedQK(p["qkv"], a["position_ids"], qn or 0, kn or 0, spec.eps,
                                w["inv_freq"].ptr, axis or 0)  # fmt: skip
                fused_qk.launch(
                    0, 0, 0, key, value, a["past_lens"], a["query_lens"], p["attn"], batch=b,
                    seq=1, capacity=self.capacity, stream=stream,
                    overlap=overlap and follows_ours, qk=qk,
                )  # fmt: skip
            else:
                launch(
                    "qk_rope", rope_grid, rope_block,
                    [ptr(p["qkv"]), ptr(a["position_ids"]), i32(tokens), ptr(qn), ptr(kn),
                     f32(spec.eps), ptr(wp("inv_freq")), ptr(axis), ptr(p["q"]), ptr(p["k"]),
                     ptr(p["v"]), i32(spec.heads), i32(spec.kv_heads), i32(d)],
                    shared=rope_shared,
                )  # fmt: skip
                engine.attention.launch(
                    p["q"], p["k"], p["v"], key, value, a["past_lens"], a["query_lens"],
                    p["attn"], batch=b, seq=s, capacity=self.capacity, stream=stream,
                    overlap=overlap and follows_ours,
                )  # fmt: skip
            follows_ours = True  # the attention kernel waits and triggers as ours do
            linear(p["attn"], pre + "o", h, spec.heads * d, spec.hidden, store=lc.STORE_ADD,
                   half_x=half_attn, bias=pre + "o_bias" if spec.bias else None)  # fmt: skip
            linear(h, pre + "gate_up", p["act"], spec.hidden, spec.intermediate,
                   norm=pre + "post_norm", swiglu=True,
                   store=lc.STORE_HALF if half_act else lc.STORE_SET)  # fmt: skip
            linear(p["act"], pre + "down", h, spec.intermediate, spec.hidden, store=lc.STORE_ADD,
                   half_x=half_act)  # fmt: skip
            if spec.hidden_output_layer == n + 1:
                output("hidden_states", h, tokens * spec.hidden)
            if n < spec.deepstack_layers:
                count = tokens * spec.hidden
                deep = a["deepstack_embeds"] + n * count * (2 if half_in else 4)
                elementwise("add_into_h" if half_in else "add_into", h, deep, count)
        # float32 logits: the output itself where it is float32, else cast into it after (by
        # the top-K kernels, which read them anyway, where the build has a top-K)
        logits = p["logits32"] if half_out else p["logits"]
        heads = a.get("lm_head_index")
        linear(h, "lm_head", logits, spec.hidden, spec.vocab, rows=b, norm="norm",
               rowmap=a["last_indices"], head_stride=spec.vocab * spec.hidden,
               head_index=heads if spec.lm_heads > 1 else None)  # fmt: skip
        if spec.last_hidden:
            last = p["last32"] if half_out else p["last_hidden"]
            launch("rms_rows", (b,), 256,
                   [ptr(h), ptr(a["last_indices"]), i32(s), ptr(wp("norm")), f32(spec.eps),
                    ptr(last), i32(spec.hidden)])  # fmt: skip
            output("last_hidden", last, b * spec.hidden)
        if not spec.topk:
            output("logits", logits, b * spec.vocab)
            return
        chunks = -(-spec.vocab // dc.TOPK_CHUNK)
        values = p["topk32"] if half_out else p["topk_values"]
        # float16 copies of the logits and values, written by the same kernels
        logits_h, values_h = (p["logits"], p["topk_values"]) if half_out else (None, None)
        if spec.sampler:  # each row's draw from its top K, and the drawn id's embedding
            draw = [ptr(a["sample_uniform"]), ptr(a["sample_temperature"]),
                    ptr(a["sample_top_k"]), ptr(a["sample_top_p"]), ptr(heads),
                    ptr(wp("sampler_tables")), i32(spec.input_size or spec.hidden),
                    ptr(p["sampled_ids"]), ptr(p["sampled_embeds"])]  # fmt: skip
        else:
            draw = [ptr(None)] * 6 + [i32(0), ptr(None), ptr(None)]
        found = [ptr(values), ptr(p["topk_indices"]), ptr(values_h)]
        if chunks == 1:
            launch("topk_one", (1, b), 512,
                   [ptr(logits), ptr(wp("topk_bias")), i32(spec.vocab), i32(spec.topk),
                    ptr(logits_h), *found, *draw])  # fmt: skip
            return
        launch("topk_chunks", (chunks, b), 512,
               [ptr(logits), ptr(wp("topk_bias")), i32(spec.vocab), i32(spec.topk),
                ptr(logits_h), ptr(p["cand_v"]), ptr(p["cand_i"])])  # fmt: skip
        launch("topk_merge", (b,), 512,
               [ptr(p["cand_v"]), ptr(p["cand_i"]), i32(chunks * spec.topk), i32(spec.topk),
                *found, i32(spec.vocab), *draw])  # fmt: skip

    def _copy(self, dst: int, src: int, nbytes: int) -> None:
        cudart = memory._cudart()
        kind = memory._kind("cudaMemcpyDeviceToDevice")
        memory._check(cudart.cudaMemcpyAsync(dst, src, nbytes, kind, self._engine.stream),
                      "cudaMemcpyAsync (device to device)")  # fmt: skip
