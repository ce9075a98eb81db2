"""The fused backend: a decoder's exported ONNX graph, compiled into a launch plan of edgeomni's
own CUDA kernels (plugins/decoder_cuda.py, plugins/attention_cuda.py), run behind the Engine
interface with the ONNX build's tensor names, so stages call it as they call an ONNX Runtime or
TensorRT decoder.

edge-build --backend fused compiles the graph (builder/fused_plan.py) into config.json's
``fused`` table, the dimensions and the plan (runtime/fused_spec.py), and
``<component>.fused.safetensors``, the weights the plan names as laid out for the kernels
(matrices [out, in], int4 codes and scales as the build's int4 pass wrote them, norms in
float32). At load the kernels are compiled by NVRTC for this GPU and the weights copied to it;
nothing else is needed on the board (no torch, no ONNX Runtime).

A call queues the plan's steps (``_Launches``): for a Qwen3 layer five kernels (four in decode
calls, whose attention kernel does the q/k norm and rotary itself), then the final norm and LM
head over each row's last position, and the top-K on the device; a build with an in-engine sampler
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

from edgeomni.runtime import memory
from edgeomni.runtime.buffers import DeviceBuffers, FixedInputs
from edgeomni.runtime.engine_api import EngineBase, EngineError, parse_device
from edgeomni.runtime.fused_spec import FusedSpec, io_types, names
from edgeomni.runtime.fused_state_steps import StateSteps

log = logging.getLogger(__name__)

# calls of fewer tokens than this (decode steps of up to 63 rows) queue their kernels as
# programmatic dependent launches; longer calls (prefills: large grids, unmeasured) do not
OVERLAP_MAX_TOKENS = 64
# a plan step's method of _Launches where it is not the step's name
STEP_METHODS = {"output": "output_step"}


class FusedEngine(EngineBase):
    """A fused decoder on one GPU; see the module docstring."""

    BACKEND = "fused"
    device = "cuda"
    prefers_fixed_shapes = False  # a call of any shape costs only its kernels

    def __init__(
        self, path: Path, config: Mapping[str, Any], *, cuda_graphs: bool = False,
        device: str = "cuda", threads: int | None = None, spin: bool = True, lane: int = 0,
    ) -> None:  # fmt: skip
        """As TrtEngine's."""
        from edgeomni.plugins import attention_cuda as ac
        from edgeomni.plugins import decoder_cuda as dc
        from edgeomni.runtime import safetensors_np

        self.device_id = index = parse_device(device)[1]
        self.lane = lane  # its stream's (runtime/memory.py)
        self.stream = memory.stream(index, lane)  # and the device is current, for the runtime
        memory._check(memory._cudart().cudaSetDevice(index), "cudaSetDevice")
        memory._check(memory._cudart().cudaFree(0), "cudaFree")  # the primary context, current
        self.buffers = DeviceBuffers(index, lane)
        self.spec = spec = FusedSpec(config.get("fused") or {}, str(path.parent / "config.json"))
        self.input_names, self.output_names = names(spec)
        self.input_types, self.output_types, self.output_shapes = io_types(spec)
        try:
            tensors = safetensors_np.load(path)
        except (OSError, ValueError) as e:
            raise EngineError(f"cannot read the fused weights {path}: {e}") from None
        spec.check_weights(path, tensors)  # on the host: nothing allocated for a bad file
        self.int4 = {n for n in tensors if n + ".scales" in tensors}
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
        # the sampler's tables [heads, V, W]: sum_frame sums a frame's rows of them
        self._frame_tables = next((st["tables"] for st in spec.plan
                                   if st["op"] == "topk" and st["tables"]), None)  # fmt: skip
        self.sums_frames = self._frame_tables is not None
        self.draws_first = bool(spec.topk)  # from its top K (plugins/speech_draw_cuda.py)
        self._draw_settings: list[Any] = []  # draw_first's temperature, top-k, top-p buffers
        self._draw_sent: tuple[float, ...] = ()  # what they hold
        # while sequence_graph runs its queue: "load" or "capture", and the bindings it called
        self._sequence_mode: str | None = None
        self._sequence: list[FusedBinding] = []

    def _upload(self, tensor: np.ndarray) -> Any:
        buf = self.buffers.zeros(tensor.shape, tensor.dtype)
        buf.upload(tensor)
        return buf

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

    def sum_frame(self, out: Any, base: Any, codes: Any, add: Any = None) -> None:
        """A codec frame's summed embedding on the device (plugins/decoder_cuda.py's
        ``frame_sum``), over the tables this engine's sampler draws embeddings from: out [n,
        ..., W] (float32 or float16, the next call's input type) = base [n, W] + tables[g][codes
        [g]] for each head g in order (+ add [n, W]), float32 adds in the host's order; codes
        [G, n] int64. Queued on the engine's stream, and captured inside ``sequence_graph``."""
        from edgeomni.plugins import decoder_cuda as dc
        from edgeomni.plugins.decoder_cuda import i32, ptr

        if self._sequence_mode == "load":  # the kernels run under capture only
            return
        if self._frame_tables is None:
            raise EngineError("this fused engine has no sampler: it has no tables to sum")
        table = self.weights[self._frame_tables]
        groups, vocab, width = (int(d) for d in table.shape)
        n = int(base.shape[0])
        if tuple(codes.shape) != (groups, n) or codes.dtype != np.int64:
            raise EngineError(f"frame codes are {codes.dtype} {tuple(codes.shape)}; the table "
                              f"takes int64 [{groups}, {n}]")  # fmt: skip
        for what, array in (("base", base), ("add", add), ("out", out)):
            if array is not None and (int(np.prod(array.shape)) != n * width
                                      or array.shape[0] != n):  # fmt: skip
                raise EngineError(f"frame {what} is {tuple(array.shape)}, not [{n}, {width}]")
        if base.dtype != np.float32 or (add is not None and add.dtype != np.float32):
            raise EngineError("a frame's base and added rows are float32")
        if out.dtype not in (np.float32, np.float16):
            raise EngineError(f"a frame sum is stored as float32 or float16, not {out.dtype}")
        memory.use(self.device_id)
        grid, block = dc.frame_sum_launch(n, width)
        self.kernels.launch("frame_sum", grid, block,
                            [ptr(base.ptr), ptr(add.ptr if add is not None else None),
                             ptr(codes.ptr), ptr(table.ptr), i32(groups), i32(n), i32(vocab),
                             i32(width), i32(int(out.dtype == np.float16)), ptr(out.ptr)],
                            stream=self.cu_stream)  # fmt: skip


    def draw_first(
        self, values: Any, ids: Any, marks: Any, uniform: Any, table: Any, drawn: Any,
        base: Any, first: Any, *, penalty: float, temperature: float, top_k: int, top_p: float,
    ) -> None:  # fmt: skip
        """Each row's first code of a speech frame drawn from this engine's top K where it
        lies (plugins/speech_draw_cuda.py's ``first_draw``), queued on the engine's stream:
        values [n, K] (its topk_values output, float16 or float32) and ids [n, K] int64; marks
        [n, V] uint8 (1 seen, 2 banned); uniform [n] float64; table [V, W] float32 (the codec
        embedding). Writes drawn [n] int64 (-1: undecided), base [n, W] float32 and first [n,
        ..., W] (float16 or float32) with the drawn ids' rows. Greedy is top-k 1 at temperature
        1 with uniform 0, as the code predictor's sampler takes it."""
        from edgeomni.plugins import speech_draw_cuda as sdc
        from edgeomni.plugins.decoder_cuda import TOPK_MAX, f32, i32, ptr

        n, k = (int(d) for d in ids.shape)
        vocab, width = (int(d) for d in table.shape)
        want = {"values": (values, (n, k), (np.float16, np.float32)),
                "ids": (ids, (n, k), (np.int64,)), "marks": (marks, (n, vocab), (np.uint8,)),
                "uniform": (uniform, (n,), (np.float64,)), "drawn": (drawn, (n,), (np.int64,)),
                "base": (base, (n, width), (np.float32,)),
                "first": (first, (n, width), (np.float16, np.float32))}  # fmt: skip
        for what, (array, shape, types) in want.items():
            if isinstance(array, np.ndarray):
                raise EngineError(f"draw_first's {what} is a host array: it reads and writes "
                                  "device buffers")  # fmt: skip
            size = int(np.prod(array.shape))
            if size != int(np.prod(shape)) or array.shape[0] != n or array.dtype not in types:
                raise EngineError(f"draw_first's {what} is {array.dtype} {tuple(array.shape)}, "
                                  f"not {shape} of {', '.join(np.dtype(t).name for t in types)}")
        if table.dtype != np.float32 or k > TOPK_MAX:
            raise EngineError(f"draw_first takes a float32 table and at most {TOPK_MAX} "
                              f"candidates, not {table.dtype} and {k}")  # fmt: skip
        memory.use(self.device_id)
        if not self._draw_settings:
            self._draw_settings = [self.buffers.zeros((1,), t)
                                   for t in (np.float64, np.int64, np.float64)]  # fmt: skip
        sent = (float(temperature), float(top_k), float(top_p))
        if sent != self._draw_sent:  # uploaded when they change
            for buf, value in zip(self._draw_settings, sent, strict=True):
                buf.upload(np.array([value], buf.dtype))
            self._draw_sent = sent
        settings = [ptr(b.ptr) for b in self._draw_settings]
        grid, block = sdc.first_draw_launch(n)
        self.kernels.launch("first_draw", grid, block,
                            [ptr(values.ptr), i32(int(values.dtype == np.float16)), ptr(ids.ptr),
                             i32(k), i32(vocab), ptr(marks.ptr), f32(penalty), ptr(uniform.ptr),
                             *settings, ptr(table.ptr), i32(width), ptr(drawn.ptr),
                             ptr(base.ptr), ptr(first.ptr), i32(int(first.dtype == np.float16))],
                            stream=self.cu_stream)  # fmt: skip


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
            memory.synchronize(engine.device_id, engine.lane)

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
            "qkv": self._buffer("qkv", (tokens, spec.qkv_width), f4),
            "q": self._buffer("q", (tokens, spec.heads * d), at),
            "k": self._buffer("k", (tokens, spec.kv_heads * d), at),
            "v": self._buffer("v", (tokens, spec.kv_heads * d), at),
            "act": self._buffer("act", (tokens, spec.intermediate), f4),
        }
        attn = spec.heads * d
        if spec.delta is not None:  # Qwen3.5's DeltaNet layers (runtime/fused_state_steps.py)
            value = spec.delta["v_heads"] * spec.delta["v_dim"]
            attn = max(attn, value)
            for name, width in (("mix", spec.mix_width), ("conv", spec.conv_channels),
                                ("delta", value)):  # fmt: skip
                self.ptrs[name] = self._buffer(name, (tokens, width), f4)
        self.ptrs["attn"] = self._buffer("attn", (tokens, attn), at)
        if spec.dtype == "float16":  # float32 results, cast into the float16 outputs at the end
            self.ptrs["logits32"] = self._buffer("logits32", (self.batch, spec.vocab), f4)
            self.ptrs["topk32"] = self._buffer("topk32", (self.batch, max(spec.topk, 1)), f4)
            self.ptrs["last32"] = self._buffer("last32", (self.batch, spec.hidden), f4)
        if spec.moe is not None:  # the routing and the chosen experts' activations
            from edgeomni.plugins import moe_cuda

            experts, top_k, inter = spec.moe
            self.ptrs["router"] = self._buffer("router", (tokens, experts), f4)
            self.ptrs["route_ids"] = self._buffer("route_ids", (tokens, top_k), np.int32)
            self.ptrs["route_w"] = self._buffer("route_w", (tokens, top_k), f4)
            slots = tokens * top_k
            if moe_cuda.grouped(tokens, top_k, experts, self.seq > 1):  # by expert, in parts
                part = min(tokens, moe_cuda.GROUP_TOKENS)
                slots = part * top_k
                self.ptrs["moe_offsets"] = self._buffer("moe_offsets", (experts + 1,), np.int32)
                self.ptrs["moe_order"] = self._buffer("moe_order", (slots,), np.int32)
                self.ptrs["moe_xn"] = self._buffer("moe_xn", (part, spec.hidden), f4)
                self.ptrs["moe_d"] = self._buffer("moe_d", (slots, spec.hidden), f4)
                self.ptrs["moe_tiles"] = self._buffer(
                    "moe_tiles", (moe_cuda.tiles_size(slots, experts),), np.int32)
            self.ptrs["moe_act"] = self._buffer("moe_act", (slots, inter), f4)
            # a shared expert's output and gate logit (Qwen3-Omni's talker)
            self.ptrs["shared_out"] = self._buffer("shared_out", (tokens, spec.hidden), f4)
            self.ptrs["shared_gate"] = self._buffer("shared_gate", (tokens, 1), f4)
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
        """Queue the plan's kernels on the engine's stream (runtime/fused_spec.py's steps)."""
        _Launches(self).run(self._engine.spec.plan)

    def _copy(self, dst: int, src: int, nbytes: int) -> None:
        cudart = memory._cudart()
        kind = memory._kind("cudaMemcpyDeviceToDevice")
        memory._check(cudart.cudaMemcpyAsync(dst, src, nbytes, kind, self._engine.stream),
                      "cudaMemcpyAsync (device to device)")  # fmt: skip


class _Launches(StateSteps):
    """One call's kernels, queued step by step from the plan: each step one kernel family
    (plugins/decoder_cuda.py, plugins/decoder_linear_cuda.py, plugins/attention_cuda.py),
    decode calls' q/k rotary done inside their attention kernel."""

    def __init__(self, binding: FusedBinding) -> None:
        from edgeomni.plugins import decoder_linear_cuda as lc

        self.binding, self.engine = binding, binding._engine
        self.spec, self.p = self.engine.spec, binding.ptrs
        self.a = {n: binding._arrays[n].ptr for n in binding._arrays}
        self.b, self.s = binding.batch, binding.seq
        self.tokens = self.b * self.s
        self.half_out = self.spec.dtype == "float16"
        self.half_in = self.spec.embeds_dtype == "float16"
        # SwiGLU's output in float16 where the down projection runs on tensor cores (which
        # round it to float16 anyway): half the bytes it reads, no conversion
        self.half_act = lc.linear_uses_mma(self.engine.kernels.variant.weights, self.tokens)
        # dependent launches for decode-sized calls: with session 27's kernels (padded
        # tensor-core partial sums, two blocks an SM) whole steps were faster with them at 1, 8
        # and 32 rows on the H200 (docs/history/benchmarks-2026-12-04.md, issue 34's 4th slice)
        self.overlap = self.engine.overlap and self.tokens < OVERLAP_MAX_TOKENS
        self.follows_ours = False  # the last thing queued was a kernel of ours
        self.logits_done = False  # the logits' float16 copy written (by the top-K kernels)

    def run(self, plan: tuple[dict[str, Any], ...]) -> None:
        spec = self.spec  # (the decode attention's own q/k rotary: whole heads, no gate)
        whole = not spec.attn_gate and spec.rotary_dim == spec.head_dim
        decode_qk = self.engine.attention_qk if self.s == 1 and whole else None
        i = 0
        while i < len(plan):
            step = plan[i]
            if step["op"] == "qk_rope" and decode_qk is not None:  # its attention is next
                self.attention(plan[i + 1], qk=step)
                i += 2
                continue
            getattr(self, STEP_METHODS.get(step["op"], step["op"]))(step)
            i += 1
        if not self.logits_done:
            self.output("logits", self.p["logits32"] if self.half_out else self.p["logits"],
                        self.b * self.spec.vocab)  # fmt: skip

    # -- launching --------------------------------------------------------------------------
    def launch(self, name: str, grid: tuple[int, ...], block: int, args: list[Any],
               shared: int = 0) -> None:  # fmt: skip
        """A kernel of decoder_cuda's, overlapping the one before where that is one too."""
        self.engine.kernels.launch(name, grid, block, args, shared=shared,
                                   stream=self.engine.cu_stream,
                                   overlap=self.overlap and self.follows_ours)  # fmt: skip
        self.follows_ours = True

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self.binding._copy(dst, src, nbytes)
        self.follows_ours = False

    def w(self, name: str | None) -> int | None:
        t = self.engine.weights.get(name) if name else None
        return None if t is None else t.ptr

    def elementwise(self, name: str, dst: int, src: int, count: int) -> None:
        from edgeomni.plugins.decoder_cuda import i64, ptr

        self.launch(name, (-(-count // 256),), 256, [ptr(dst), ptr(src), i64(count)])

    def output(self, name: str, src: int, count: int) -> None:
        """A float32 result into its output, cast where the output is float16."""
        if self.half_out:
            self.elementwise("float_to_half", self.p[name], src, count)
        elif self.p[name] != src:
            self.copy(self.p[name], src, count * 4)

    # -- the steps --------------------------------------------------------------------------
    def embed(self, step: dict[str, Any]) -> None:
        spec, h = self.spec, self.p["h"]
        if step["weight"] is not None:
            self.linear({"x": "embeds", "weight": step["weight"], "bias": step["bias"],
                         "out": "h", "k": spec.input_size, "n": spec.hidden, "norm": None,
                         "add": False, "swiglu": False, "rows": "all", "heads": False})  # fmt: skip
        elif self.half_in:
            self.elementwise("half_to_float", h, self.a["inputs_embeds"],
                             self.tokens * spec.hidden)  # fmt: skip
        else:
            self.copy(h, self.a["inputs_embeds"], self.tokens * spec.hidden * 4)

    def linear(self, step: dict[str, Any]) -> None:
        from edgeomni.plugins import decoder_linear_cuda as lc
        from edgeomni.plugins.decoder_cuda import f32, i32, i64, ptr

        spec, p = self.spec, self.p
        x, out = step["x"], step["out"]
        src = {"embeds": self.a["inputs_embeds"], "h": p["h"], "attn": p["attn"],
               "act": p["act"]}[x]  # fmt: skip
        half_x = {"embeds": self.half_in, "h": False, "attn": self.half_out,
                  "act": self.half_act}[x]  # fmt: skip
        store = lc.STORE_ADD if step["add"] else lc.STORE_SET
        if step["swiglu"] and self.half_act:
            store = lc.STORE_HALF
        dst = p["logits32"] if out == "logits" and self.half_out else p[out]
        last = step["rows"] == "last"
        rows = self.b if last else self.tokens
        weight, k, n = step["weight"], step["k"], step["n"]
        if step["swiglu"]:  # n counts the gate and up rows; the kernel's N is its output's
            n //= 2
        int4 = weight in self.engine.int4
        plan = lc.linear_launch(self.engine.kernels.variant.weights, rows, k, n,
                                half_input=half_x, swiglu=step["swiglu"], int4=int4)  # fmt: skip
        heads = self.a.get("lm_head_index") if step["heads"] else None
        args = [ptr(src), ptr(self.a["last_indices"] if last else None), i32(self.s),
                ptr(self.w(step["norm"])), f32(spec.eps), ptr(self.w(weight)),
                i64(n * k if step["heads"] else 0), ptr(heads), ptr(self.w(step["bias"])),
                ptr(dst), i32(rows), i32(k), i32(n), i32(store)]  # fmt: skip
        if plan.scales:  # an int4 matrix's scales, one a row and group of K (GEMM: null, 0)
            args += [ptr(self.w(weight + ".scales") if int4 else None),
                     i32(spec.int4_group if int4 else 0)]  # fmt: skip
        self.launch(plan.name, plan.grid, plan.block, args)

    def qk_rope(self, step: dict[str, Any]) -> None:
        from edgeomni.plugins import decoder_cuda as dc
        from edgeomni.plugins.decoder_cuda import f32, i32, ptr

        spec, p = self.spec, self.p
        width = spec.heads + 2 * spec.kv_heads
        grid, block, shared = dc.rope_launch(self.tokens, width, spec.head_dim)
        self.launch("qk_rope", grid, block,
                    [ptr(p["qkv"]), ptr(self.a["position_ids"]), i32(self.tokens),
                     ptr(self.w(step["q_norm"])), ptr(self.w(step["k_norm"])), f32(spec.eps),
                     ptr(self.w("inv_freq")), ptr(self.w("freq_axis")), ptr(p["q"]),
                     ptr(p["k"]), ptr(p["v"]), i32(spec.heads), i32(spec.kv_heads),
                     i32(spec.head_dim), i32(int(spec.attn_gate)), i32(spec.rotary_dim)],
                    shared=shared)  # fmt: skip

    def attention(self, step: dict[str, Any], qk: dict[str, Any] | None = None) -> None:
        """Cached attention of one layer; with ``qk`` (a decode call) the q/k norm and rotary
        of that qk_rope step inside the attention kernel."""
        from edgeomni.plugins import attention_cuda as ac

        engine, spec, p, a = self.engine, self.spec, self.p, self.a
        n = step["layer"]
        key, value = a[f"past_key_{n}"], a[f"past_value_{n}"]
        common = dict(batch=self.b, capacity=self.binding.capacity, stream=engine.cu_stream,
                      overlap=self.overlap and self.follows_ours)  # fmt: skip
        if qk is not None:
            fused = ac.FusedQK(p["qkv"], a["position_ids"], self.w(qk["q_norm"]) or 0,
                               self.w(qk["k_norm"]) or 0, spec.eps, self.w("inv_freq") or 0,
                               self.w("freq_axis") or 0)  # fmt: skip
            engine.attention_qk.launch(0, 0, 0, key, value, a["past_lens"], a["query_lens"],
                                       p["attn"], seq=1, qk=fused, **common)  # fmt: skip
        else:
            engine.attention.launch(p["q"], p["k"], p["v"], key, value, a["past_lens"],
                                    a["query_lens"], p["attn"], seq=self.s, **common)  # fmt: skip
        self.follows_ours = True  # the attention kernel waits and triggers as ours do

    def moe(self, step: dict[str, Any]) -> None:
        """Routing from the router's logits, each chosen expert's SwiGLU, the weighted down
        projections added into h (plugins/moe_cuda.py); a call moe_cuda.grouped picks grouped
        by expert, in parts of at most GROUP_TOKENS tokens, its products as GEMMs where
        moe_cuda.uses_gemm says so."""
        from edgeomni.plugins import moe_cuda
        from edgeomni.plugins.decoder_cuda import f32, i32, ptr

        spec, p = self.spec, self.p
        k, inter, hidden = step["top_k"], step["intermediate"], spec.hidden
        experts, top_k, _ = spec.moe  # the scratch's sizes (_plan)
        shared = (ptr(p["shared_out"]), ptr(p["shared_gate"])) if step["shared"] else (ptr(None),) * 2
        route = [ptr(p["router"]), i32(step["experts"]), i32(k), i32(int(step["normalize"])),
                 ptr(p["route_ids"]), ptr(p["route_w"])]  # fmt: skip
        # int4 experts: each product's scales, and the group as the kernels take it (SIMT: its
        # log2, the GEMM: itself); float experts: null and 0
        int4 = step["fc1"] in self.engine.int4
        group = spec.int4_group if int4 else 0
        scales = [[ptr(self.w(step[fc] + ".scales") if int4 else None),
                   i32(group.bit_length() - 1 if int4 else 0)] for fc in ("fc1", "fc2")]
        gemm_scales = [[s, i32(group)] for s, _ in scales]
        if not moe_cuda.grouped(self.tokens, top_k, experts, self.s > 1):
            shapes = moe_cuda.launches(self.tokens, hidden, inter, k)
            args = {
                "moe_route": route,
                "moe_gate_up": [ptr(p["h"]), ptr(self.w(step["norm"])), f32(spec.eps),
                                ptr(self.w(step["fc1"])), ptr(p["route_ids"]), i32(k),
                                i32(hidden), i32(inter), ptr(p["moe_act"]), *scales[0]],
                "moe_down": [ptr(p["moe_act"]), ptr(self.w(step["fc2"])), ptr(p["route_ids"]),
                             ptr(p["route_w"]), i32(k), i32(hidden), i32(inter), *shared,
                             ptr(p["h"]), *scales[1]],
            }  # fmt: skip
            for name, (grid, block, smem) in shapes.items():
                self.launch(name, grid, block, args[name], shared=smem)
            return
        grid, block, _ = moe_cuda.launches(self.tokens, hidden, inter, k)["moe_route"]
        self.launch("moe_route", grid, block, route)
        gemm = moe_cuda.uses_gemm(self.s > 1, self.engine.kernels.variant.weights, hidden, inter)
        q4 = "_q4" if int4 else ""
        for t0 in range(0, self.tokens, moe_cuda.GROUP_TOKENS):
            n = min(moe_cuda.GROUP_TOKENS, self.tokens - t0)
            rows, slot = t0 * hidden * 4, t0 * k * 4  # the part's first token's bytes
            part = [ptr(p["shared_out"] + rows), ptr(p["shared_gate"] + t0 * 4)] \
                if step["shared"] else list(shared)  # fmt: skip
            products = {
                "moe_gate_up_gemm" + q4: [ptr(p["moe_xn"]), ptr(self.w(step["fc1"])),
                                          ptr(p["moe_offsets"]), ptr(p["moe_order"]),
                                          ptr(p["moe_tiles"]), i32(k), i32(hidden), i32(inter),
                                          ptr(p["moe_act"]), *gemm_scales[0]],
                "moe_down_gemm" + q4: [ptr(p["moe_act"]), ptr(self.w(step["fc2"])),
                                       ptr(p["moe_offsets"]), ptr(p["moe_order"]),
                                       ptr(p["moe_tiles"]), i32(hidden), i32(inter),
                                       ptr(p["moe_d"]), *gemm_scales[1]],
            } if gemm else {
                "moe_gate_up_grouped": [ptr(p["moe_xn"]), ptr(self.w(step["fc1"])),
                                        ptr(p["moe_offsets"]), ptr(p["moe_order"]), i32(k),
                                        i32(hidden), i32(inter), ptr(p["moe_act"]), *scales[0]],
                "moe_down_grouped": [ptr(p["moe_act"]), ptr(self.w(step["fc2"])),
                                     ptr(p["moe_offsets"]), ptr(p["moe_order"]), i32(hidden),
                                     i32(inter), ptr(p["moe_d"]), *scales[1]],
            }  # fmt: skip
            args = {
                "moe_group": [ptr(p["route_ids"] + slot), i32(n * k), i32(step["experts"]),
                              ptr(p["moe_offsets"]), ptr(p["moe_order"]),
                              ptr(p["moe_tiles"] if gemm else None)],
                "moe_norm": [ptr(p["h"] + rows), ptr(self.w(step["norm"])), f32(spec.eps),
                             i32(hidden), ptr(p["moe_xn"])],
                **products,
                "moe_combine": [ptr(p["moe_d"]), ptr(p["route_w"] + slot), i32(k), i32(hidden),
                                *part, ptr(p["h"] + rows)],
            }  # fmt: skip
            shapes = moe_cuda.launches(n, hidden, inter, k, step["experts"], gemm=gemm, int4=int4)
            for name in args:
                grid, block, smem = shapes[name]
                self.launch(name, grid, block, args[name], shared=smem)

    def deepstack(self, step: dict[str, Any]) -> None:
        count = self.tokens * self.spec.hidden
        deep = self.a["deepstack_embeds"] + step["index"] * count * (2 if self.half_in else 4)
        self.elementwise("add_into_h" if self.half_in else "add_into", self.p["h"], deep, count)

    def output_step(self, step: dict[str, Any]) -> None:
        self.output(step["name"], self.p["h"], self.tokens * self.spec.hidden)

    def last_hidden(self, step: dict[str, Any]) -> None:
        from edgeomni.plugins.decoder_cuda import f32, i32, ptr

        spec, p = self.spec, self.p
        last = p["last32"] if self.half_out else p["last_hidden"]
        self.launch("rms_rows", (self.b,), 256,
                    [ptr(p["h"]), ptr(self.a["last_indices"]), i32(self.s),
                     ptr(self.w(step["norm"])), f32(spec.eps), ptr(last),
                     i32(spec.hidden)])  # fmt: skip
        self.output("last_hidden", last, self.b * spec.hidden)

    def topk(self, step: dict[str, Any]) -> None:
        """The logits' top K (their float16 copy written by the same kernels), and with
        ``tables`` each row's draw from it and the drawn id's embedding."""
        from edgeomni.plugins import decoder_cuda as dc
        from edgeomni.plugins.decoder_cuda import i32, ptr

        spec, p, a = self.spec, self.p, self.a
        b, k = self.b, step["k"]
        logits = p["logits32"] if self.half_out else p["logits"]
        chunks = -(-spec.vocab // dc.TOPK_CHUNK)
        values = p["topk32"] if self.half_out else p["topk_values"]
        logits_h, values_h = (p["logits"], p["topk_values"]) if self.half_out else (None, None)
        if step["tables"] is not None:
            draw = [ptr(a["sample_uniform"]), ptr(a["sample_temperature"]),
                    ptr(a["sample_top_k"]), ptr(a["sample_top_p"]),
                    ptr(a.get("lm_head_index")), ptr(self.w(step["tables"])),
                    i32(spec.input_size or spec.hidden), ptr(p["sampled_ids"]),
                    ptr(p["sampled_embeds"])]  # fmt: skip
        else:
            draw = [ptr(None)] * 6 + [i32(0), ptr(None), ptr(None)]
        found = [ptr(values), ptr(p["topk_indices"]), ptr(values_h)]
        bias = ptr(self.w(step["bias"]))
        if chunks == 1:
            self.launch("topk_one", (1, b), 512,
                        [ptr(logits), bias, i32(spec.vocab), i32(k), ptr(logits_h), *found,
                         *draw])  # fmt: skip
        else:
            self.launch("topk_chunks", (chunks, b), 512,
                        [ptr(logits), bias, i32(spec.vocab), i32(k), ptr(logits_h),
                         ptr(p["cand_v"]), ptr(p["cand_i"])])  # fmt: skip
            self.launch("topk_merge", (b,), 512,
                        [ptr(p["cand_v"]), ptr(p["cand_i"]), i32(chunks * k), i32(k), *found,
                         i32(spec.vocab), *draw])  # fmt: skip
        self.logits_done = True
