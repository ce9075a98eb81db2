"""Rewrite the edgeomni plugin ops of an exported model into what one backend runs."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeomni.plugins import attention, gated_delta, moe, quant_linear, quant_moe, rotary

# op_type -> {backend -> lowering(node, ctx) -> replacement nodes}
PLUGINS: dict[str, dict[str, Callable[[Any, LoweringContext], list[Any]]]] = {
    attention.OP_TYPE: attention.LOWERINGS,
    gated_delta.CONV_OP_TYPE: gated_delta.CONV_LOWERINGS,
    gated_delta.RULE_OP_TYPE: gated_delta.RULE_LOWERINGS,
    moe.OP_TYPE: moe.LOWERINGS,
    quant_linear.OP_TYPE: quant_linear.LOWERINGS,
    quant_moe.OP_TYPE: quant_moe.LOWERINGS,
    rotary.OP_TYPE: rotary.LOWERINGS,
}
BACKENDS = ("onnxruntime", "tensorrt")
DOMAIN = attention.DOMAIN
# Opsets a backend's lowerings may use, added to the model's imports as needed (a lowering
# that needs a newer standard opset says so: LoweringContext.require_opset).
_EXTRA_OPSETS = {"onnxruntime": {"com.microsoft": 1}, "tensorrt": {}}


@dataclass
class LoweringContext:
    """What a lowering may add to the graph: fresh names, shared constants, helper nodes."""

    taken: set[str]
    options: dict[str, Any] = field(default_factory=dict)
    graph_inputs: frozenset[str] = frozenset()  # what the runtime binds (a KV cache, say)
    cache: dict[Any, Any] = field(default_factory=dict)
    prelude: list[Any] = field(default_factory=list)
    initializers: list[Any] = field(default_factory=list)
    inputs: list[tuple[str, str, list[Any]]] = field(default_factory=list)
    opsets: dict[str, int] = field(default_factory=dict)
    # the model's initializers by name, and the folder their external data is relative to
    tensors: dict[str, Any] = field(default_factory=dict)
    base_dir: str | None = None
    _counter: itertools.count = field(default_factory=itertools.count)

    def fresh(self, stem: str) -> str:
        while True:
            name = f"{stem}_{next(self._counter)}"
            if name not in self.taken:
                self.taken.add(name)
                return name

    def add_input(self, name: str, elem_type: str, shape: list[Any]) -> None:
        """A new graph input the runtime must feed (once per name)."""
        if not any(i[0] == name for i in self.inputs):
            self.inputs.append((name, elem_type, shape))

    def require_opset(self, domain: str, version: int) -> None:
        """The lowered graph needs at least this version of ``domain`` (imported, or raised)."""
        self.opsets[domain] = max(version, self.opsets.get(domain, 0))

    def tensor(self, name: str) -> np.ndarray:
        """An initializer's value (read from its external data file when it has one)."""
        from onnx import numpy_helper

        if name not in self.tensors:
            raise ValueError(f"{name!r} is not an initializer: a lowering needs its value")
        return numpy_helper.to_array(self.tensors[name], self.base_dir or "")

    def emit(self, node: Any) -> None:
        self.prelude.append(node)

    def constant(self, stem: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        key = ("const", stem)
        if key not in self.cache:
            name = self.fresh(stem)
            self.initializers.append(numpy_helper.from_array(value, name))
            self.cache[key] = name
        return self.cache[key]


def onnxruntime_options(version: str | None = None) -> dict[str, Any]:
    """What the target ONNX Runtime's contrib ops accept (default: the installed version).

    GroupQueryAttention takes per-row query lengths (``query_seqlens``) from 1.32 on; before,
    a call with past context and several new tokens must be a batch of one. From 1.31 on its
    CUDA kernel applies per-head q/k RMS norms itself (``q_norm_weight``/``k_norm_weight``).
    GatedDeltaNet and CausalConvWithState (Qwen3.5's DeltaNet layers) are in 1.32 (before, the
    DeltaNet ops lower to plain ONNX: plugins/gated_delta.py)."""
    if version is None:
        import onnxruntime

        version = onnxruntime.__version__
    major, minor = (int(x) for x in version.split(".")[:2])
    return {
        "gqa_query_seqlens": (major, minor) >= (1, 32),
        "qk_norm_attention": (major, minor) >= (1, 31),
        "gated_delta_net": (major, minor) >= (1, 32),
        "onnxruntime": version,
    }


def lower_model(
    model: Any, backend: str, options: dict[str, Any] | None = None, base_dir: Any = None
) -> Any:
    """Lower every edgeomni op in ``model`` (an onnx.ModelProto, changed in place and returned).

    ``options`` say what the target backend version supports (onnxruntime_options());
    ``base_dir`` is where the model's external data lies, for a lowering that re-lays weights.
    Initializers no node reads any more (weights a lowering re-laid) are dropped."""
    from onnx import TensorProto, helper

    if backend not in BACKENDS:
        raise ValueError(
            f"no plugin lowering for backend {backend!r}; lowerings exist for {', '.join(BACKENDS)}"
        )
    graph = model.graph
    taken = {n for node in graph.node for n in (*node.input, *node.output)}
    taken |= {i.name for i in graph.initializer} | {i.name for i in graph.input}
    if options is None:
        options = onnxruntime_options() if backend == "onnxruntime" else {}
    inputs = frozenset(i.name for i in graph.input)
    ctx = LoweringContext(
        taken=taken,
        options=dict(options),
        graph_inputs=inputs,
        tensors={t.name: t for t in graph.initializer},
        base_dir=None if base_dir is None else str(base_dir),
    )
    lowered = []
    replaced = 0
    for node in graph.node:
        if node.domain != DOMAIN:
            lowered.append(node)
            continue
        by_backend = PLUGINS.get(node.op_type)
        if by_backend is None:
            raise ValueError(f"unknown plugin op {DOMAIN}::{node.op_type} in node {node.name!r}")
        if backend not in by_backend:
            raise ValueError(f"plugin op {node.op_type} has no lowering for {backend}")
        new_nodes = by_backend[backend](node, ctx)
        # helper nodes go right before their first user, so the graph stays topologically sorted
        lowered.extend(ctx.prelude)
        ctx.prelude.clear()
        lowered.extend(new_nodes)
        replaced += 1
    del graph.node[:]
    graph.node.extend(lowered)
    graph.initializer.extend(ctx.initializers)
    if replaced:
        _drop_unread(graph)
    types = {"int32": TensorProto.INT32, "int64": TensorProto.INT64}
    for name, elem_type, shape in ctx.inputs:
        graph.input.append(helper.make_tensor_value_info(name, types[elem_type], shape))
    # function bodies the exporter may have attached for the custom domain are no longer used
    keep = [f for f in model.functions if f.domain != DOMAIN]
    del model.functions[:]
    model.functions.extend(keep)
    imports = {o.domain: o for o in model.opset_import}
    for domain, version in {**_EXTRA_OPSETS[backend], **ctx.opsets}.items():
        if domain not in imports:
            model.opset_import.append(helper.make_opsetid(domain, version))
        elif imports[domain].version < version:
            imports[domain].version = version
    if DOMAIN in imports and not any(n.domain == DOMAIN for n in graph.node):
        model.opset_import.remove(imports[DOMAIN])  # kept where a lowering keeps its nodes
    model.metadata_props.add(key="edgeomni.lowered_for", value=backend)
    model.metadata_props.add(key="edgeomni.plugin_nodes", value=str(replaced))
    return model


def _drop_unread(graph: Any) -> None:
    """Remove initializers that no node, subgraph or graph output reads."""
    read = {o.name for o in graph.output} | {i.name for i in graph.input}

    def walk(g: Any) -> None:
        for node in g.node:
            read.update(node.input)
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    walk(sub)

    walk(graph)
    keep = [t for t in graph.initializer if t.name in read]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)
