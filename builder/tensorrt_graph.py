"""Edits of a lowered ONNX graph for TensorRT's builder: same values, forms its parser and
optimiser take. Each returns what it changed, for the engine's config.json ("lowering").

They work on a model loaded without its external data: weights are re-shaped by their dims only
(the bytes of [O, I, K] and [O, I, 1, K] are the same), so a large checkpoint's data file is
neither read nor copied.
"""

from __future__ import annotations

from typing import Any

CONV2D_AXIS = "trt_conv1d_axis"  # the initializer [2] the 1-D convs' Unsqueeze/Squeeze use


def allow_decomposed_attention(model: Any) -> int:
    """Let TensorRT run each Attention node as several kernels where it has no fused kernel for
    its shapes and types (head size 16 in float32, say: the build fails otherwise). The ONNX
    parser reads this TensorRT-only attribute; it is set here, not in the lowering, so the
    lowered graph stays plain ONNX for other runtimes. Returns the nodes marked."""
    from onnx import helper

    marked = 0
    for node in model.graph.node:
        if node.op_type == "Attention" and node.domain in ("", "ai.onnx"):
            node.attribute.append(helper.make_attribute("TRT_decomposable", 1))
            marked += 1
    return marked


def conv1d_as_conv2d(model: Any) -> int:
    """Each 1-D Conv ([N, C, L] input, an [O, I/g, K] weight initializer) as Unsqueeze -> 2-D
    Conv on [N, C, 1, L] -> Squeeze. Returns the convs rewritten.

    Why: TensorRT runs a 1-D conv as a 2-D one inside, and TensorRT-RTX 1.7's Myelin fuses the
    pointwise op after it (code2wav's final Conv + Clip) in a form whose 4 dims meet the graph
    tensor's 3 strides: the build fails with ``CHECK_EQ(dim_count(), stride_order().size())``.
    With the conv 2-D in the graph, the tiny and the real-size code2wav build (H200, 2026-12-02;
    docs/benchmarks.md). ONNX Runtime gives the same values either way (tests).
    """
    import numpy as np
    from onnx import helper, numpy_helper

    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    other_uses = {  # weights something other than a 1-D conv's weight input reads
        name
        for node in graph.node
        for k, name in enumerate(node.input)
        if not (k == 1 and _conv1d_weight(node, weights) is not None)
    }
    reshaped: dict[str, str] = {}  # 1-D weight -> its 2-D initializer
    nodes, done = [], 0
    for node in graph.node:
        w = _conv1d_weight(node, weights)
        if w is None:
            nodes.append(node)
            continue
        if w.name not in reshaped:
            reshaped[w.name] = _weight_2d(graph, w, shared=w.name in other_uses)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        x4, y4 = node.output[0] + "_trt_x4", node.output[0] + "_trt_y4"
        nodes.append(helper.make_node("Unsqueeze", [node.input[0], CONV2D_AXIS], [x4]))
        nodes.append(helper.make_node(
            "Conv", [x4, reshaped[w.name], *node.input[2:]], [y4], name=node.name,
            **{k: _attr_2d(k, v) for k, v in attrs.items()}))  # fmt: skip
        nodes.append(helper.make_node("Squeeze", [y4, CONV2D_AXIS], [node.output[0]]))
        done += 1
    if done:
        graph.initializer.append(numpy_helper.from_array(np.array([2], np.int64), CONV2D_AXIS))
        del graph.node[:]
        graph.node.extend(nodes)
    return done


def _conv1d_weight(node: Any, weights: dict[str, Any]) -> Any:
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
        return None
    w = weights.get(node.input[1])
    return w if w is not None and len(w.dims) == 3 else None


def _weight_2d(graph: Any, w: Any, shared: bool) -> str:
    """[O, I, K] -> [O, I, 1, K] by its dims: in place, or as a copy when a node other than a
    1-D conv reads it too (an external tensor's copy points at the same bytes of the same file)."""
    if shared:
        copy = graph.initializer.add()
        copy.CopyFrom(w)
        copy.name = w.name + "_trt_2d"
        w = copy
    o, i, k = list(w.dims)
    del w.dims[:]
    w.dims.extend([o, i, 1, k])
    return w.name


def _attr_2d(key: str, value: Any) -> Any:
    """A 1-D conv attribute as the 2-D conv's (height 1: kernel, stride, dilation 1, no pads)."""
    if key in ("kernel_shape", "strides", "dilations"):
        return [1, *value]
    if key == "pads":
        return [0, value[0], 0, value[1]]
    return value  # group, auto_pad (SAME_* pads nothing on a height-1 kernel)
