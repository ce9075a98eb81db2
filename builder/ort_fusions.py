"""Graph rewrites for ONNX Runtime's CUDA provider that its own optimiser does not make.

ONNX Runtime fuses a residual Add into the next norm only for its own SimplifiedLayerNormalization;
the exporter writes ONNX's RMSNormalization (opset 23), so a decoder layer ran its two residual
Adds as kernels of their own (measured on the H200: 2 of ~32 kernels per decode layer).
"""

from __future__ import annotations

from typing import Any


def fuse_residual_rms_norm(model: Any) -> int:
    """Add(a, b) -> RMSNormalization over the last axis becomes one
    com.microsoft::SkipSimplifiedLayerNormalization, whose fourth output is the sum a + b for the
    Add's other readers. Returns how many pairs were fused (the model is changed in place).

    Only Adds of two activations are fused (no initializer or constant input), so both sides have
    the full [.., H] shape the fused kernel needs.
    """
    from onnx import helper

    graph = model.graph
    constants = {t.name for t in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    producer = {o: n for n in graph.node for o in n.output}
    fused: dict[int, Any] = {}  # id(RMSNormalization node) -> replacement
    dropped: set[int] = set()  # id(Add node) folded into a replacement
    for node in graph.node:
        if node.op_type != "RMSNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if int(attrs.get("axis", -1)) != -1 or int(attrs.get("stash_type", 1)) != 1:
            continue
        add = producer.get(node.input[0])
        if (
            add is None
            or add.op_type != "Add"
            or add.domain not in ("", "ai.onnx")
            or id(add) in dropped
            or any(i in constants for i in add.input)
        ):
            continue
        total = add.output[0]
        fused[id(node)] = helper.make_node(
            "SkipSimplifiedLayerNormalization",
            [add.input[0], add.input[1], node.input[1]],
            [node.output[0], "", "", total],
            name=(node.name or total) + "_skip",
            domain="com.microsoft",
            epsilon=float(attrs.get("epsilon", 1e-5)),
        )
        dropped.add(id(add))
    if not fused:
        return 0
    nodes = []
    for node in graph.node:
        if id(node) in dropped:
            continue  # its output now comes from the fused node, which takes its place below
        nodes.append(fused.get(id(node), node))
    # the fused node sits where the norm was; any reader of the sum between the Add and the norm
    # must then move after it: keep the order valid by a stable topological sort
    del graph.node[:]
    graph.node.extend(_topological(nodes))
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return len(fused)


def _topological(nodes: list[Any]) -> list[Any]:
    """Nodes in an order where each comes after the producers of its inputs, otherwise as given."""
    made_by = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    order: list[Any] = []
    state = [0] * len(nodes)  # 0 new, 1 visiting, 2 placed

    for start in range(len(nodes)):
        stack = [(start, False)]
        while stack:
            i, expanded = stack.pop()
            if state[i] == 2:
                continue
            if expanded:
                state[i] = 2
                order.append(nodes[i])
                continue
            if state[i] == 1:
                raise ValueError(f"cycle through node {nodes[i].name!r}")
            state[i] = 1
            stack.append((i, True))
            for name in reversed([x for x in nodes[i].input if x]):
                j = made_by.get(name)
                if j is not None and state[j] != 2:
                    stack.append((j, False))
    return order
