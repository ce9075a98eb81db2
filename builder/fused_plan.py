"""The fused backend's compiler: an exported decoder's ONNX graph (after the one int4 pass,
builder/quantize.py, where the build quantizes) becomes the launch plan the fused engine runs
(runtime/fused_spec.py) and the weights it reads.

The walk follows the residual stream through the graph in its order. Plugin ops map to kernel
families (``CachedAttention`` with the ``Rotary`` of its q and k: ``qk_rope`` then
``attention``; ``QuantMatMul`` and ``MatMul``: ``linear``), and the plain ops around them fold
into those kernels' options where the kernels compute the same thing: an ``RMSNormalization``
before a product is the product's input norm, ``Add(h, x @ W)`` its residual store, a bias
``Add`` its bias, ``Split`` then ``x * sigmoid(x) * y`` its SwiGLU, the last positions'
``GatherElements`` its row map, a stacked head's ``Gather`` its head index. Two regions of
plain ops are proven rather than matched: the rotary angles (evaluated for probe positions: they
must be ``position * inv_freq`` of one position axis a frequency, which gives inv_freq and the
axes) and an in-engine sampler (evaluated on random top-K rows against the draw kernel's
reference). Anything else is refused, naming the node, and edge-build builds that component with
ONNX Runtime instead; a graph is never run approximately. Qwen3.5's gated attention compiles
(q beside its output gate, rope on a head's first dims by ``Slice``, ``Rotary``, ``Concat``,
the output times the gate's sigmoid: ``attn_gate``), and so do its Gated DeltaNet layers
(builder/fused_delta.py), and the engine runs them (runtime/fused_state_steps.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.builder import fused_delta
from edgeomni.builder import fused_proofs as proofs
from edgeomni.builder.fused_proofs import Unfused
from edgeomni.builder.fused_values import (
    Act,
    AttnGate,
    Buf,
    Const,
    Gate,
    HeadSlice,
    Lin,
    Moe,
    Norm,
    Part,
    Rows,
    Shared,
)

# the fused engine's kernels read these int4 group sizes
INT4_GROUPS = (32, 64, 128)
VIEWS = ("Reshape", "Squeeze", "Unsqueeze", "Identity", "Cast")
SAMPLER_INPUTS = ("sample_uniform", "sample_temperature", "sample_top_k", "sample_top_p")
SAMPLER_OUTPUTS = ("sampled_ids", "sampled_embeds")
ELEM = {1: "float32", 10: "float16", 6: "int32", 7: "int64", 11: "float64"}


class Compiler:
    def __init__(self, model: Any, base_dir: Path) -> None:
        from onnx import numpy_helper

        self.model, self.graph = model, model.graph
        self.inits = {t.name: t for t in self.graph.initializer}
        self.base = str(base_dir)
        self._array = numpy_helper.to_array
        self.inputs = {i.name: ELEM.get(i.type.tensor_type.elem_type, "?")
                       for i in self.graph.input}  # fmt: skip
        self.outputs = [o.name for o in self.graph.output]
        self.ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in (
            *self.graph.value_info, *self.graph.output) if v.type.tensor_type.HasField("shape")}
        keys = [i for i in self.inputs if i.startswith("past_key_")]  # Qwen3.5: not layer 0's
        if not keys:
            raise Unfused("it has no KV cache (past_key_*)")
        self.dtype = self.inputs[keys[0]]
        if self.dtype not in ("float16", "float32"):
            raise Unfused(f"its cache is {self.dtype}; the fused kernels take float16 or float32")
        self.env: dict[str, Any] = {"inputs_embeds": Buf("embeds"),
                                    "deepstack_embeds": Const("deepstack")}
        self.renamed: dict[str, str] = {}
        self.steps: list[dict[str, Any]] = []
        self.tensors: dict[str, np.ndarray] = {}
        self.named: dict[str, str] = {}  # initializer -> the weight name it was stored under
        self.spec: dict[str, Any] = {"dtype": self.dtype, "embeds_dtype": self.inputs.get(
            "inputs_embeds", "?"), "qk_norm": False, "attention_bias": False, "mrope": False,
            "hidden_output_layer": None, "last_hidden_output": False, "deepstack_layers": 0,
            "lm_heads": 1, "input_size": 0, "logits_topk": 0, "sampler": False}  # fmt: skip
        self.layers = 0
        self.eps: float | None = None
        self.int4_group = 0
        self.produced: set[str] = set()
        self.angle: str | None = None  # the rotary angles' value (Cos's input), by classify_aux
        self.qkv: Lin | None = None  # the last layer's qkv product
        self.delta: dict[str, Any] = {}  # the Gated DeltaNet layer being walked (fused_delta)
        # each buffer's writes so far: the plan updates buffers in place, so a value that reads
        # one must be read before the buffer's next write (checked: ``current``)
        self.versions = {"h": 0, "attn": 0, "act": 0}

    # -- values -----------------------------------------------------------------------------
    def wrote(self, buffer: str) -> int:
        """A step writes ``buffer``: its new version."""
        self.versions[buffer] += 1
        return self.versions[buffer]

    def current(self, buffer: str, version: int, where: str) -> None:
        if self.versions.get(buffer, 0) != version:
            raise Unfused(f"{where} reads {buffer} as it was before a later write; the plan "
                          "updates it in place")  # fmt: skip

    def array(self, name: str) -> np.ndarray:
        return np.asarray(self._array(self.inits[name], self.base))

    def weight(self, init: str, role: str, make: Any) -> str:
        """Store ``make(initializer)`` under ``role`` (once per initializer)."""
        if init not in self.named:
            self.named[init] = role
            self.tensors[role] = np.ascontiguousarray(make(self.array(init)))
        return self.named[init]

    def vec(self, init: str, role: str) -> str:
        return self.weight(init, role, lambda a: a.astype(np.float32).reshape(-1))

    def kind(self, name: str) -> Any:
        if name in self.env:
            return self.env[name]
        if name in self.inits:
            return ("init", name)
        if name in self.inputs:
            return ("input", name)
        if name == "":
            return Const("")
        raise Unfused(f"value {name!r} comes from nothing the walk matched")

    # -- the walk ---------------------------------------------------------------------------
    def run(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        nodes = list(self.graph.node)
        sampler = self.sampler_region(nodes)
        self.classify_aux(nodes, sampler)
        for node in nodes:
            if id(node) in sampler or all(o in self.env for o in node.output):
                continue
            self.visit(node)
            for out in node.output:
                self.on_output(out)
        if sampler:
            self.compile_sampler(nodes, sampler)
        missing = [o for o in self.outputs if o not in self.produced]
        if missing:
            raise Unfused(f"the walk produced no {', '.join(missing)}")
        if self.layers == 0:
            raise Unfused("it has no attention layers")
        spec = self.spec
        spec.update(num_layers=self.layers, rms_norm_eps=self.eps if self.eps else 1e-6)
        if self.int4_group:
            spec["int4"] = {"group_size": self.int4_group}
        for step in self.steps:  # the weights' final names
            for key, value in step.items():
                if isinstance(value, str) and value.startswith("?"):
                    step[key] = self.resolve(value)
        unnamed = sorted(n for n in self.tensors if n.startswith("?"))
        if unnamed:
            raise Unfused(f"weights of no known use: {', '.join(unnamed)}")
        spec["plan"] = self.steps
        return spec, self.tensors

    def sampler_region(self, nodes: list[Any]) -> set[int]:
        """The nodes computing the sampler's outputs from the top-K and the draw's inputs."""
        if not set(SAMPLER_OUTPUTS) & set(self.outputs):
            return set()
        producer = {o: n for n in nodes for o in n.output}
        stop = {"topk_values", "topk_indices", *SAMPLER_INPUTS, "lm_head_index"}
        region: set[int] = set()
        todo = list(SAMPLER_OUTPUTS)
        while todo:
            name = todo.pop()
            node = producer.get(name)
            if name in stop or node is None or id(node) in region:
                continue
            region.add(id(node))
            todo.extend(node.input)
        return region

    def classify_aux(self, nodes: list[Any], sampler: set[int]) -> None:
        """Values of shapes and constants, and the index paths of position_ids (the rotary
        angles, proven in ``rotary``), last_indices and lm_head_index."""
        roots = {"position_ids": "position", "last_indices": "last", "lm_head_index": "head"}
        for node in nodes:
            if id(node) in sampler:
                continue
            if node.op_type == "Shape":
                for o in node.output:
                    self.env[o] = Const("")
                continue
            if node.op_type in VIEWS and node.input[0] in self.inits:  # a stacked head, say
                self.env[node.output[0]] = ("init", node.input[0])
                continue
            kinds: set[str] = set()
            for i in node.input:
                if i in roots:
                    kinds.add(roots[i])
                elif i in self.inits or i == "":
                    continue
                elif isinstance(self.env.get(i), Const) and self.env[i].what in roots.values():
                    kinds.add(self.env[i].what)
                elif isinstance(self.env.get(i), Const) and self.env[i].what == "":
                    continue
                else:
                    kinds.add("?")
            if "?" in kinds or len(kinds) > 1:
                continue
            if node.op_type in ("Cos", "Sin"):
                if self.angle not in (None, node.input[0]):
                    raise Unfused("its rotary has two angle regions; the plan proves one")
                self.angle = node.input[0]  # proven by rotary()
            for o in node.output:
                self.env[o] = Const(kinds.pop() if kinds else "")

    def on_output(self, name: str) -> None:
        """A graph output the walk just produced: stored where the engine outputs it."""
        if name not in self.outputs or name in self.produced:
            return
        v = self.env.get(name)
        if name == "hidden_states" and isinstance(v, Buf) and v.name == "h":
            self.current("h", v.version, "hidden_states")
            self.spec["hidden_output_layer"] = self.layers
            self.steps.append({"op": "output", "name": "hidden_states"})
        elif name == "last_hidden" and isinstance(v, Rows):
            self.current("h", v.version, "last_hidden")
            self.spec["last_hidden_output"] = True
            self.steps.append({"op": "last_hidden", "norm": self.rename(v.norm, "norm")})
        elif name == "logits" and isinstance(v, Lin) and v.rows == "last":
            self.store(v, "logits")
            self.env[name] = Buf("logits")
        elif name.startswith("present_") or name in ("topk_values", "topk_indices"):
            pass  # written by the attention or top-K step that made it
        else:
            raise Unfused(f"its output {name!r} is {type(v).__name__}, not what the fused "
                          "engine outputs")  # fmt: skip
        self.produced.add(name)

    def store(self, lin: Lin, out: str, *, add: bool = False, swiglu: bool = False) -> None:
        if lin.x in self.versions:
            self.current(lin.x, lin.version, f"the product by {lin.weight}")
        if out in self.versions:
            self.wrote(out)
        step = {"op": "linear", "x": lin.x, "weight": lin.weight, "out": out, "k": lin.k,
                "n": lin.n, "norm": lin.norm, "bias": lin.bias, "add": add, "swiglu": swiglu,
                "rows": lin.rows, "heads": lin.heads}  # fmt: skip
        self.steps.append(step)
        if out == "logits":
            self.spec["vocab_size"] = lin.n

    def residual(self, v: Any, why: str) -> None:
        """``v`` becomes the residual stream h (the first layer's input)."""
        if isinstance(v, Buf) and v.name == "h":
            return
        if self.versions["h"]:
            raise Unfused(f"{why}: a second residual stream")
        self.wrote("h")
        if isinstance(v, Buf) and v.name == "embeds":
            self.steps.append({"op": "embed", "weight": None, "bias": None})
        elif isinstance(v, Lin) and v.x == "embeds" and v.norm is None:
            self.spec["input_size"] = v.k
            self.steps.append({"op": "embed", "weight": v.weight, "bias": v.bias})
        else:
            raise Unfused(f"{why}: the residual stream starts from {type(v).__name__}")

    def visit(self, node: Any) -> None:
        op, ins, outs = node.op_type, list(node.input), list(node.output)
        where = f"node {node.name or outs[0]!r} ({op})"
        attrs = _attrs(node)
        if op == "Cast" and ins[0] == "inputs_embeds":
            self.env[outs[0]] = Buf("embeds")
            return
        if op == "Cast" and ins[0] == "deepstack_embeds":
            self.env[outs[0]] = Const("deepstack")
            return
        args = [self.kind(i) for i in ins]
        if op in VIEWS and (not isinstance(args[0], (Const, tuple)) or isinstance(
                args[0], Const) and args[0].what.startswith(("stacked:", "deep"))):  # fmt: skip
            self.env[outs[0]] = args[0]  # a view: the kernels index rows and heads themselves
            return
        if fused_delta.claims(self, op, args):
            fused_delta.visit(self, op, args, ins, outs, attrs, where)
        elif op == "RMSNormalization":
            self.norm(args, ins, outs, attrs, where)
        elif op in ("MatMul", "QuantMatMul", "Gemm"):
            self.matmul(node, args, ins, outs, attrs, where)
        elif op in ("MoE", "QuantMoE"):
            self.moe(op, args, ins, outs, attrs, where)
        elif op == "Add":
            self.add(args, ins, outs, where)
        elif op == "Split":
            self.split(args, ins, outs, attrs, where)
        elif op == "Slice":
            self.head_slice(args, ins, outs, where)
        elif op == "Concat":
            self.concat(args, outs, attrs, where)
        elif op == "Sigmoid" and isinstance(args[0], AttnGate) and not args[0].sig:
            self.env[outs[0]] = AttnGate(args[0].lin, sig=True)
        elif op == "Sigmoid" and isinstance(args[0], Part):
            self.env[outs[0]] = dataclasses.replace(args[0], sig=True)
        elif op == "Sigmoid" and isinstance(args[0], Lin) and args[0].n == 1 and \
                args[0].rows == "all":  # fmt: skip
            self.env[outs[0]] = Gate(args[0])
        elif op == "Mul":
            self.mul(args, outs, where)
        elif op == "Rotary":
            self.rotary(args, ins, outs, attrs, where)
        elif op == "CachedAttention":
            self.attention(args, ins, outs, attrs, where)
        elif op == "GatherElements" and isinstance(args[0], Norm) and isinstance(
                args[1], Const) and args[1].what == "last" and attrs.get("axis") == 1:  # fmt: skip
            self.env[outs[0]] = Rows(args[0].weight, args[0].version)
        elif op == "Gather" and isinstance(args[1], Const) and args[1].what == "head" and \
                isinstance(args[0], tuple):  # fmt: skip
            self.env[outs[0]] = Const("stacked:" + args[0][1])
        elif op == "Gather" and isinstance(args[0], Const) and args[0].what == "deepstack":
            self.env[outs[0]] = Const(f"deep:{int(self.array(ins[1]))}")
        elif op == "TopK":
            self.topk(args, ins, outs, attrs, where)
        else:
            raise Unfused(f"{where} is not something the fused kernels compute")

    def norm(self, args: list[Any], ins: list[str], outs: list[str], attrs: dict[str, Any],
             where: str) -> None:  # fmt: skip
        x, w = args[0], ins[1]
        if attrs.get("axis", -1) != -1 or not isinstance(args[1], tuple):
            raise Unfused(f"{where}: a norm over the last axis by a weight is what is fused")
        self.same_eps(attrs, where)
        if isinstance(x, Part) and x.index < 2 and x.norm is None and not x.rope:
            which = "q_norm" if x.index == 0 else "k_norm"
            self.spec["qk_norm"] = True
            self.env[outs[0]] = dataclasses.replace(
                x, norm=self.vec(w, f"layers.{self.layers}.{which}"))
            return
        if not (isinstance(x, Buf) and x.name == "h"):
            self.residual(x, where)
            for name, v in list(self.env.items()):
                if v is x:
                    self.env[name] = Buf("h", self.versions["h"])
            x = Buf("h", self.versions["h"])
        self.current("h", x.version, where)
        self.env[outs[0]] = Norm(self.vec(w, "?" + w), x.version)

    def same_eps(self, attrs: dict[str, Any], where: str) -> None:
        """Every norm of the model has one epsilon (the kernels take one)."""
        eps = float(attrs.get("epsilon", 1e-5))
        if self.eps is not None and abs(eps - self.eps) > 1e-12:
            raise Unfused(f"{where}: epsilon {eps} differs from the model's {self.eps}")
        self.eps = eps

    def matmul(self, node: Any, args: list[Any], ins: list[str], outs: list[str],
               attrs: dict[str, Any], where: str) -> None:  # fmt: skip
        x = args[0]
        quant = node.op_type == "QuantMatMul"
        if quant:
            if len(ins) > 3 and ins[3]:
                raise Unfused(f"{where}: int4 zero points (asymmetric); the fused kernels take "
                              "symmetric int4")  # fmt: skip
            k, n, group = int(attrs["K"]), int(attrs["N"]), int(attrs["block_size"])
            if group not in INT4_GROUPS or (self.int4_group and group != self.int4_group):
                raise Unfused(f"{where}: int4 group {group}; the fused kernels take one group "
                              f"size of {INT4_GROUPS}")  # fmt: skip
            self.int4_group = group
        elif node.op_type == "Gemm":
            if len(ins) > 2 and ins[2] or attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1:
                raise Unfused(f"{where}: a Gemm other than x @ W")
            if not isinstance(args[1], tuple) or args[1][0] != "init":
                raise Unfused(f"{where}: its weight is not a constant matrix")
            n, k = (int(d) for d in self.inits[ins[1]].dims)
            if not attrs.get("transB", 0):
                k, n = n, k
        elif isinstance(args[1], tuple):
            k, n = (int(d) for d in self.inits[ins[1]].dims)
        elif isinstance(args[1], Const) and args[1].what.startswith("stacked:"):
            init = args[1].what.split(":", 1)[1]
            heads, k, n = (int(d) for d in self.inits[init].dims)
        else:
            raise Unfused(f"{where}: its weight is not a constant matrix")
        role = self.role(x, where) or "?" + (init if isinstance(args[1], Const) else ins[1])
        if quant:
            if self.inits[ins[2]].data_type != 10:  # TensorProto.FLOAT16
                raise Unfused(f"{where}: int4 scales of {self.array(ins[2]).dtype}; the fused "
                              "kernels read float16 scales")  # fmt: skip
            w = self.weight(ins[1], role, lambda a: a.reshape(a.shape[0], -1))
            self.weight(ins[2], role + ".scales", lambda a: a)
        elif node.op_type == "Gemm" and attrs.get("transB", 0):  # already [N, K]
            w = self.weight(ins[1], role, lambda a: a)
        elif isinstance(args[1], tuple):
            w = self.weight(ins[1], role, lambda a: a.T)
        else:
            self.spec["lm_heads"] = heads
            w = self.weight(init, role, lambda a: a.transpose(0, 2, 1))
        # its last axis: by the product's rank where the graph records it (an int4 pass's
        # QuantMatMul of 2-D rows, say), else a Gemm's 1 and a MatMul's of [B, S, K] 2
        rank = self.ranks.get(outs[0], 2 if node.op_type == "Gemm" else 3)
        lin = Lin("?", w, k, n, heads=isinstance(args[1], Const), axes=(-1, rank - 1))
        if isinstance(x, Norm):
            lin.x, lin.norm, lin.version = "h", x.weight, x.version
        elif isinstance(x, Rows):
            lin.x, lin.norm, lin.rows, lin.version = "h", x.norm, "last", x.version
        elif isinstance(x, Buf) and x.name in ("attn", "embeds"):
            lin.x, lin.version = x.name, x.version
        elif isinstance(x, Act):
            self.store(x.lin, "act", swiglu=True)
            lin.x, lin.version = "act", self.versions["act"]
        else:
            raise Unfused(f"{where}: its input is {type(x).__name__}")
        self.env[outs[0]] = lin

    def role(self, x: Any, where: str) -> str | None:
        """The weight's name in the engine file (the layer's matrices by their place)."""
        n = f"layers.{max(self.layers - 1, 0)}."
        if isinstance(x, Norm):
            return None  # named by its use: attention() (qkv) or mul() (gate_up)
        if isinstance(x, Rows):
            self.rename(x.norm, "norm")
            return "lm_head"
        if isinstance(x, Buf) and x.name == "attn":
            return n + "o"
        if isinstance(x, Buf) and x.name == "embeds":
            return "input_proj"
        if isinstance(x, Act):
            return n + "down"
        raise Unfused(f"{where}: its input is {type(x).__name__}")

    def add(self, args: list[Any], ins: list[str], outs: list[str], where: str) -> None:
        a, b = args
        if isinstance(b, Buf) and b.name in ("h", "logits") or (
                isinstance(b, Lin | Moe) and not isinstance(a, Buf)):  # fmt: skip
            a, b = b, a  # the stream or the logits first, else the product
        constant = b[1] if isinstance(b, tuple) and b[0] == "init" else None
        if isinstance(a, Lin) and constant and a.bias is None:
            if list(self.inits[constant].dims) != [a.n]:
                raise Unfused(f"{where}: a bias of {list(self.inits[constant].dims)} for {a.n}")
            bias = self.vec(constant, "?" + constant if a.weight.startswith("?") else
                            a.weight + "_bias")  # fmt: skip
            self.env[outs[0]] = dataclasses.replace(a, bias=bias)
        elif isinstance(a, Buf) and a.name == "h" and isinstance(b, Lin) and b.rows == "all":
            if b.x not in ("attn", "act"):
                raise Unfused(f"{where}: a residual add of a product of {b.x}")
            self.current("h", a.version, where)
            self.store(b, "h", add=True)
            self.env[outs[0]] = Buf("h", self.versions["h"])
        elif isinstance(a, Moe) and isinstance(b, Shared) and a.shared is None or (
                isinstance(a, Shared) and isinstance(b, Moe) and b.shared is None):  # fmt: skip
            moe, shared = (a, b) if isinstance(a, Moe) else (b, a)
            self.env[outs[0]] = dataclasses.replace(moe, shared=shared)
        elif isinstance(a, Buf) and a.name == "h" and isinstance(b, Moe):
            self.current("h", a.version, where)
            self.store_moe(b)
            self.env[outs[0]] = Buf("h", self.versions["h"])
        elif isinstance(a, Buf) and a.name == "h" and isinstance(b, Const) and \
                b.what.startswith("deep:"):  # fmt: skip
            index = int(b.what.split(":")[1])
            if index != self.spec["deepstack_layers"] or index >= self.layers:
                raise Unfused(f"{where}: deepstack slice {index} after layer {self.layers}")
            self.spec["deepstack_layers"] = index + 1
            self.current("h", a.version, where)
            self.steps.append({"op": "deepstack", "index": index})
            self.env[outs[0]] = Buf("h", self.wrote("h"))
        elif isinstance(a, Buf) and a.name == "logits" and constant:
            self.env[outs[0]] = Const("bias:" + self.vec(constant, "topk_bias"))
        else:
            raise Unfused(f"{where} adds {type(a).__name__} and {type(b).__name__}")

    def moe(self, op: str, args: list[Any], ins: list[str], outs: list[str],
            attrs: dict[str, Any], where: str) -> None:  # fmt: skip
        """edgeomni::MoE of the normed stream, routed by a product of the same normed stream;
        edgeomni::QuantMoE's int4 experts as they are (codes [E, rows, K / 2] and float16
        scales, the linears' int4 layout)."""
        x, router = args[0], args[1]
        if not (isinstance(x, Norm) and isinstance(router, Lin) and router.x == "h" and
                router.norm == x.weight and router.version == x.version and
                router.bias is None and router.rows == "all"):  # fmt: skip
            raise Unfused(f"{where}: its input and router are not the normed residual stream "
                          "and a product of it")  # fmt: skip
        quant = op == "QuantMoE"
        fc1, fc2 = (ins[2], ins[4]) if quant else (ins[2], ins[3])
        scales = (ins[3], ins[5]) if quant else ()
        if any(i not in self.inits for i in (fc1, fc2, *scales)):
            raise Unfused(f"{where}: its experts' weights are not constants")
        experts, rows, hidden = (int(d) for d in self.inits[fc1].dims)
        inter = rows // 2
        if quant:  # the dims count codes, two a byte
            group, bits = int(attrs["block_size"]), int(attrs.get("bits", 4))
            if bits != 4 or group not in INT4_GROUPS or (self.int4_group and
                                                          group != self.int4_group):  # fmt: skip
                raise Unfused(f"{where}: int{bits} experts in groups of {group}; the fused "
                              f"kernels take int4 in one group size of {INT4_GROUPS}")  # fmt: skip
            if any(self.inits[sc].data_type != 10 for sc in scales):  # TensorProto.FLOAT16
                raise Unfused(f"{where}: int4 scales other than float16; the fused kernels read "
                              "float16 scales")  # fmt: skip
            self.int4_group = group
            hidden *= 2
        top_k = int(attrs["top_k"])
        down = [experts, hidden, inter // 2 if quant else inter]
        if router.n != experts or hidden != router.k or list(self.inits[fc2].dims) != down \
                or not 1 <= top_k <= min(experts, 32):  # fmt: skip
            raise Unfused(f"{where}: experts of {list(self.inits[fc1].dims)} and "
                          f"{list(self.inits[fc2].dims)}, top {top_k}, router of {router.n}")
        n = max(self.layers - 1, 0)
        router.weight = self.rename(router.weight, f"layers.{n}.router")
        names = (f"layers.{n}.experts_gate_up", f"layers.{n}.experts_down")
        if quant:
            for sc, name in zip(scales, names, strict=True):
                self.weight(sc, name + ".scales", lambda a: a)
        self.env[outs[0]] = Moe(router, self.weight(fc1, names[0], lambda a: a),
                                self.weight(fc2, names[1], lambda a: a), top_k,
                                int(attrs.get("normalize_routing", 0)))  # fmt: skip

    def store_moe(self, m: Moe) -> None:
        """The router's product, then the MoE step adding the experts' sum into h."""
        n = max(self.layers - 1, 0)
        norm = m.router.norm = self.rename(m.router.norm or "", f"layers.{n}.post_norm")
        if m.shared is not None:  # read h before the step adds into it
            gate, down = m.shared.gate, m.shared.down
            if gate.x != "h" or self.resolve(gate.norm or "") != norm or gate.bias or down.bias:
                raise Unfused("a shared expert's gate of other than the MoE's normed input")
            gate.weight = self.rename(gate.weight, f"layers.{n}.shared_gate")
            self.store(gate, "shared_gate")
            self.store(down, "shared_out")
        self.store(m.router, "router")
        experts, rows, _ = self.tensors[self.resolve(m.fc1)].shape
        self.steps.append({"op": "moe", "norm": norm, "fc1": m.fc1, "fc2": m.fc2,
                           "experts": int(experts), "top_k": m.top_k,
                           "intermediate": int(rows) // 2, "normalize": bool(m.normalize),
                           "shared": m.shared is not None})
        self.wrote("h")

    def split(self, args: list[Any], ins: list[str], outs: list[str], attrs: dict[str, Any],
              where: str) -> None:  # fmt: skip
        lin = args[0]
        sizes = tuple(int(s) for s in self.array(ins[1])) if len(ins) > 1 else ()
        if isinstance(lin, Part) and lin.index == 0 and len(lin.sizes) == 3 and not (
                lin.norm or lin.rope or lin.gated) and len(sizes) == 2 and sizes[0] == sizes[1] \
                and attrs.get("axis") in (-1, 3):  # fmt: skip
            # Qwen3.5's gated q: each head's q then its output gate (the split of its view)
            self.env[outs[0]] = dataclasses.replace(lin, gated=True)
            self.env[outs[1]] = AttnGate(lin.lin)
            return
        if not isinstance(lin, Lin) or sum(sizes) != lin.n or attrs.get("axis") not in lin.axes:
            raise Unfused(f"{where}: a split of {type(lin).__name__} into {sizes}")
        for i, out in enumerate(outs):
            self.env[out] = Part(lin, i, sizes)

    def mul(self, args: list[Any], outs: list[str], where: str) -> None:
        a, b = args
        if isinstance(a, AttnGate):
            a, b = b, a
        if isinstance(a, Buf) and a.name == "attn" and isinstance(b, AttnGate) and b.sig and \
                b.lin is self.qkv:  # fmt: skip
            # the attention's output times sigmoid of its gates (read from the qkv product)
            self.current("attn", a.version, where)
            self.steps.append({"op": "attn_gate"})
            self.env[outs[0]] = Buf("attn", self.wrote("attn"))
            return
        if isinstance(a, Lin) and isinstance(b, Gate):
            a, b = b, a
        if isinstance(a, Gate) and isinstance(b, Lin) and b.x == "act" and b.rows == "all":
            self.env[outs[0]] = Shared(b, a.lin)
            return
        if any(isinstance(p, Part) and (p.norm or p.rope) for p in args):
            raise Unfused(f"{where}: a product of normed or rotated parts, not SwiGLU")
        if isinstance(a, Part) and isinstance(b, Part) and a.lin is b.lin and b.sig and \
                a.index == b.index == 0 and len(a.sizes) == 2:  # fmt: skip
            self.env[outs[0]] = dataclasses.replace(a, silu=True)
        elif isinstance(a, Part) and isinstance(b, Part) and a.lin is b.lin and a.silu and \
                (a.index, b.index) == (0, 1) and a.sizes[0] == a.sizes[1]:  # fmt: skip
            lin = a.lin
            lin.weight = self.rename(lin.weight, f"layers.{self.layers - 1}.gate_up")
            if lin.norm is not None:
                lin.norm = self.rename(lin.norm, f"layers.{self.layers - 1}.post_norm")
            self.env[outs[0]] = Act(lin)
        else:
            raise Unfused(f"{where}: a product of {type(a).__name__} and {type(b).__name__} "
                          "that is not SwiGLU")  # fmt: skip

    def head_slice(self, args: list[Any], ins: list[str], outs: list[str], where: str) -> None:
        """A normed q or k part's first dims of each head, or the rest (partial rotary)."""
        x = args[0]
        consts = [np.asarray(self.array(i)).reshape(-1) if i in self.inits else None
                  for i in ins[1:]]  # fmt: skip
        if not isinstance(x, Part) or x.index > 1 or x.rope or x.norm is None or \
                any(c is None or c.size != 1 for c in consts[:3]):  # fmt: skip
            raise Unfused(f"{where}: a slice of {type(x).__name__}, not of a normed q or k")
        start, end, axis = (int(c[0]) for c in consts[:3])
        step = int(consts[3][0]) if len(consts) > 3 and consts[3] is not None else 1
        d = self.part_head_dim(x)
        if axis not in (-1, 3) or step != 1 or not (start == 0 < end < d or 0 < start < d <= end):
            raise Unfused(f"{where}: a slice [{start}:{end}] of axis {axis}, not a head's first "
                          "dims or the rest")  # fmt: skip
        self.env[outs[0]] = HeadSlice(x, end if start == 0 else start, start == 0)

    def part_head_dim(self, x: Part) -> int:
        """The head dim of a q or k part: its normed heads' weight."""
        return int(self.tensors[self.resolve(x.norm or "")].shape[0])

    def concat(self, args: list[Any], outs: list[str], attrs: dict[str, Any], where: str) -> None:
        """A head's rotated first dims and its untouched rest, back together."""
        a, b = args
        if not (isinstance(a, HeadSlice) and isinstance(b, HeadSlice) and a.part is b.part and
                a.first and a.rope and not b.first and not b.rope and a.dims == b.dims and
                attrs.get("axis") in (-1, 3)):  # fmt: skip
            raise Unfused(f"{where}: a concat of {type(a).__name__} and {type(b).__name__}, not "
                          "a head's rotated first dims and its rest")  # fmt: skip
        self.env[outs[0]] = dataclasses.replace(a.part, rope=True, rotary=a.dims)

    def rename(self, old: str, new: str) -> str:
        """A weight named before its use was known, given the name its use gives it."""
        old = self.resolve(old)
        if old == new or not old.startswith("?"):
            return old  # named by an earlier use (an initializer two uses share)
        for suffix in ("", ".scales"):
            if old + suffix in self.tensors:
                self.tensors[new + suffix] = self.tensors.pop(old + suffix)
                self.renamed[old + suffix] = new + suffix
        for init, name in self.named.items():
            if name in (old, old + ".scales"):
                self.named[init] = self.renamed[name]
        return new

    def resolve(self, name: str) -> str:
        while name in self.renamed:
            name = self.renamed[name]
        return name

    def rotary(self, args: list[Any], ins: list[str], outs: list[str], attrs: dict[str, Any],
               where: str) -> None:  # fmt: skip
        x = args[0]
        partial = isinstance(x, HeadSlice) and x.first and not x.rope  # a head's first dims
        if partial and int(attrs["head_dim"]) != x.dims:
            raise Unfused(f"{where}: a rotary of {attrs['head_dim']} dims of a slice of {x.dims}")
        if not partial and (not isinstance(x, Part) or x.index > 1 or x.rope):
            raise Unfused(f"{where}: rotary of {type(x).__name__}, not of a q or k projection")
        if any(not (isinstance(a, Const) and a.what == "position") for a in args[1:]):
            raise Unfused(f"{where}: its cos and sin are not functions of position_ids alone")
        if "inv_freq" not in self.tensors:
            self.prove_rotary(int(attrs["head_dim"]))
        self.env[outs[0]] = dataclasses.replace(x, rope=True)

    def prove_rotary(self, head_dim: int) -> None:
        """inv_freq and each frequency's position axis (builder/fused_proofs.py)."""
        if self.angle is None:
            raise Unfused("its rotary cos and sin are not a Cos and Sin of position_ids")
        angle, mrope = self.angle, self.graph_input_rank("position_ids") == 3
        inv, axis = proofs.rotary_tables(
            lambda pos: self.evaluate([angle], {"position_ids": pos})[0], head_dim, mrope)
        self.tensors["inv_freq"] = inv
        if mrope:
            self.spec["mrope"] = True
            self.tensors["freq_axis"] = axis

    def attention(self, args: list[Any], ins: list[str], outs: list[str],
                  attrs: dict[str, Any], where: str) -> None:  # fmt: skip
        q, k, v = args[:3]
        n = self.layers
        if ins[3:5] != [f"past_key_{n}", f"past_value_{n}"] or ins[5:7] != ["past_lens",
                                                                          "query_lens"]:  # fmt: skip
            raise Unfused(f"{where}: layer {n} reads {ins[3:7]}")
        if outs[1:] != [f"present_key_{n}", f"present_value_{n}"]:
            raise Unfused(f"{where}: layer {n} writes {outs[1:]}")
        parts = (q, k, v)
        if not all(isinstance(p, Part) for p in parts) or not (q.lin is k.lin is v.lin) or \
                [p.index for p in parts] != [0, 1, 2] or not (q.rope and k.rope) or v.rope or \
                v.norm is not None or (q.norm is None) != (k.norm is None):  # fmt: skip
            raise Unfused(f"{where}: q, k and v are not one product's rotated thirds")
        heads, kv = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
        if attrs.get("window", 0) or attrs.get("causal", 1) != 1 or attrs.get("scale", 0.0):
            raise Unfused(f"{where}: a window, a scale or non-causal attention")
        lin = q.lin
        d = q.sizes[0] // (2 * heads if q.gated else heads)
        if q.sizes != ((2 if q.gated else 1) * heads * d, kv * d, kv * d) or k.gated:
            raise Unfused(f"{where}: q, k, v of {q.sizes} for {heads} and {kv} heads")
        rotary = q.rotary or d
        if (k.rotary or d) != rotary:
            raise Unfused(f"{where}: q's rotary takes {rotary} dims of a head, k's {k.rotary or d}")
        for key, value in (("attn_gate", q.gated), ("rotary_dim", rotary)):
            if self.spec.setdefault(key, value) != value:
                raise Unfused(f"{where}: {key} {value}, not the model's {self.spec[key]}")
        for key, value in (("num_heads", heads), ("num_kv_heads", kv), ("head_dim", d),
                           ("hidden_size", lin.k)):  # fmt: skip
            if self.spec.setdefault(key, value) != value:
                raise Unfused(f"{where}: {key} {value}, not the model's {self.spec[key]}")
        for norm in (q.norm, k.norm):
            if norm is not None and self.tensors[self.resolve(norm)].shape != (d,):
                raise Unfused(f"{where}: a q/k norm of {self.tensors[self.resolve(norm)].shape} "
                              f"for heads of {d}")  # fmt: skip
        p = f"layers.{n}."
        lin.weight = self.rename(lin.weight, p + "qkv")
        if lin.norm is not None:
            lin.norm = self.rename(lin.norm, p + "input_norm")
        if lin.bias is not None:
            lin.bias = self.rename(lin.bias, p + "qkv_bias")
            self.spec["attention_bias"] = True
        self.store(lin, "qkv")
        self.qkv = lin  # the product the qkv buffer holds (an output gate reads it)
        self.steps.append({"op": "qk_rope", "q_norm": q.norm, "k_norm": k.norm})
        self.steps.append({"op": "attention", "layer": n})
        self.layers += 1
        self.env[outs[0]] = Buf("attn", self.wrote("attn"))
        self.produced.update(outs[1:])

    def topk(self, args: list[Any], ins: list[str], outs: list[str], attrs: dict[str, Any],
             where: str) -> None:  # fmt: skip
        x = args[0]
        bias = x.what.split(":", 1)[1] if isinstance(x, Const) and x.what.startswith("bias:") \
            else None  # fmt: skip
        if not (bias or isinstance(x, Buf) and x.name == "logits"):
            raise Unfused(f"{where}: a top-K of {type(x).__name__}, not of the logits")
        if attrs.get("largest", 1) != 1 or attrs.get("axis", -1) not in (-1, 1) or \
                attrs.get("sorted", 1) != 1 or outs != ["topk_values", "topk_indices"]:  # fmt: skip
            raise Unfused(f"{where}: not the sorted largest top-K of the logits")
        k = int(np.asarray(self.array(ins[1])).reshape(-1)[0])
        self.spec["logits_topk"] = k
        self.steps.append({"op": "topk", "k": k, "bias": bias, "tables": None})
        self.produced.update(outs)

    # -- proven regions ---------------------------------------------------------------------
    def graph_input_rank(self, name: str) -> int:
        for i in self.graph.input:
            if i.name == name:
                return len(i.type.tensor_type.shape.dim)
        return 0

    def evaluate(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return proofs.evaluate(self.model, self.inits, outputs, feeds)

    def compile_sampler(self, nodes: list[Any], region: set[int]) -> None:
        """The draw from each row's top-K and its embedding: the draw kernel's, if the region
        computes what its reference does on random rows; the tables are the region's one
        matrix initializer [heads * V, width]."""
        if [o for o in SAMPLER_OUTPUTS if o not in self.outputs] or not self.steps or \
                self.steps[-1]["op"] != "topk":  # fmt: skip
            raise Unfused("a sampler needs sampled_ids and sampled_embeds after the top-K")
        tables = [i for n in nodes if id(n) in region for i in n.input
                  if i in self.inits and len(self.inits[i].dims) == 2]  # fmt: skip
        if len(set(tables)) != 1:
            raise Unfused(f"the sampler reads {len(set(tables))} matrices, not one table")
        heads, vocab = self.spec["lm_heads"], self.spec.get("vocab_size", 0)
        rows, width = (int(d) for d in self.inits[tables[0]].dims)
        if rows != heads * vocab:
            raise Unfused(f"the sampler's table has {rows} rows, not {heads} x {vocab}")
        table = self.array(tables[0]).reshape(heads, vocab, width)
        self.prove_sampler(table, heads, vocab)
        self.tensors["sampler_tables"] = np.ascontiguousarray(table)
        self.steps[-1]["tables"] = "sampler_tables"
        self.spec["sampler"] = True
        self.produced.update(SAMPLER_OUTPUTS)

    def prove_sampler(self, table: np.ndarray, heads: int, vocab: int) -> None:
        feeds = [n for n in (*SAMPLER_INPUTS, "lm_head_index") if n in self.inputs]
        proofs.check_sampler(lambda f: self.evaluate(list(SAMPLER_OUTPUTS), f), table, heads,
                             vocab, self.spec["logits_topk"], self.dtype, feeds)  # fmt: skip


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def compile_file(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The ``fused`` config table (dimensions, options, ``plan``) and the weights of the
    decoder exported to ``path``; raises Unfused with what the kernels do not compute."""
    import onnx

    from edgeomni.plugins import attention, quant_linear, rotary

    for op in (attention, rotary):
        op.register_onnx_schema()
    del quant_linear  # QuantMatMul has no schema: the evaluator never runs it
    model = onnx.load(str(path))
    compiler = Compiler(model, path.parent)
    spec, tensors = compiler.run()
    _finish(spec, tensors)
    return spec, tensors


def _finish(spec: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    """The dimensions the plan's steps imply, and a check that every named weight is stored."""
    plan = spec["plan"]
    lm = next(s for s in plan if s["op"] == "linear" and s["out"] == "logits")
    spec["vocab_size"] = lm["n"]
    down = [s["k"] for s in plan if s["op"] == "linear" and s["x"] == "act"]
    down += [s["intermediate"] for s in plan if s["op"] == "moe"]
    if not down:
        raise Unfused("it has no SwiGLU MLP or MoE layer")
    spec["intermediate_size"] = down[0]
    named = {s.get(key) for s in plan for key in ("weight", "norm", "bias", "q_norm", "k_norm",
                                                  "tables", "fc1", "fc2")} - {None}  # fmt: skip
    lost = sorted(n for n in named if n not in tensors)
    if lost:
        raise Unfused(f"the plan names weights it did not store: {', '.join(lost)}")
