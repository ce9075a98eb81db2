"""Graph rewrites for ONNX Runtime's CUDA provider that its own optimiser does not make.

ONNX Runtime fuses a residual Add into the next norm only for its own SimplifiedLayerNormalization;
the exporter writes ONNX's RMSNormalization (opset 23), so a decoder layer ran its two residual
Adds as kernels of their own (measured on the H200: 2 of ~32 kernels per decode layer).
"""

from __future__ import annotations

from typing import Any

import numpy as np


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


# ---------------------------------------------------------------------------------------------
# q/k norm and rotary into GroupQueryAttention
# ---------------------------------------------------------------------------------------------
def fuse_attention_prologue(model: Any, positions: int, *, norms: bool = True) -> int:
    """Fold each layer's attention prologue into its GroupQueryAttention node (CUDA provider):

        Split(qkv) -> q: [Reshape -> RMSNormalization -> Reshape] -> RotaryEmbedding ┐
                   -> k: [Reshape -> RMSNormalization -> Reshape] -> RotaryEmbedding ├-> GQA
                   -> v ─────────────────────────────────────────────────────────────┘

    becomes one GroupQueryAttention on the packed projection, with the norm weights as its
    ``q_norm_weight``/``k_norm_weight`` and ``do_rotary`` over a cos/sin table indexed by position
    (``positions`` rows, at least the KV capacity, as the op requires). On the H200 that takes 5
    kernels per layer (a split, two norms, two rotaries) and the per-call cos/sin graph away.

    1-D RoPE (the tokens' cos/sin are ``cos(position_ids * inv_freq)`` computed in the graph
    from the ``position_ids`` input [B, S]) gets a table by position, built here. Any other
    rotation (Qwen3-Omni's 3-axis MRoPE, in the thinker and the talker) keeps the RotaryEmbedding
    nodes' own inputs: the call's per-token cos/sin rows, which token (b, s) reads at row
    b*S + s (the fused rotary lowering, plugins/rotary.py), padded with zero rows up to the
    cache's length because the op wants a table at least that long; the same rows and
    positions give the same rotation inside GroupQueryAttention.

    ``norms=False`` leaves the q/k norms (and the split) where they are and folds the rotary
    alone, on unpacked q and k: the CPU provider runs that (it has no q/k norm inputs), so the
    folding itself is checked there (tests/test_gpu_lowering_on_cpu.py). Returns how many
    attention nodes were fused.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    init = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output if o}
    readers: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    inputs = {i.name: i for i in graph.input}

    def made(name: str, op_type: str) -> Any:
        node = producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def attr(node: Any, name: str, default: Any = None) -> Any:
        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    tables: dict[tuple[str, ...], tuple[str, str]] = {}

    def table(cos_rows: str, sin_rows: str) -> tuple[str, str] | None:
        """Position-indexed cos/sin [positions, D/2] for a RotaryEmbedding's per-token rows, if
        those are 1-D RoPE of position_ids."""
        found = []
        for rows, fn in ((cos_rows, "Cos"), (sin_rows, "Sin")):
            chain = _one_d_rope(rows, fn, made, init, inputs)
            if chain is None:
                return None
            found.append(chain)
        (inv_freq, dtype), other = found
        if other[1] != dtype or not np.array_equal(other[0], inv_freq):
            return None
        key = (inv_freq.tobytes(), str(dtype))
        if key not in tables:
            freqs = np.arange(positions, dtype=np.float32)[:, None] * inv_freq[None, :]
            names = []
            for fn in (np.cos, np.sin):
                name = f"gqa_{fn.__name__}_cache_{len(tables)}"
                graph.initializer.append(numpy_helper.from_array(fn(freqs).astype(dtype), name))
                names.append(name)
            tables[key] = (names[0], names[1])
        return tables[key]

    padded_tables: dict[tuple[str, str], tuple[str, str]] = {}

    def padded(cos_rows: str, sin_rows: str, cache: str) -> tuple[str, str]:
        """The per-token rows [N, D/2], zero rows added up to the length of ``cache`` (a past
        key [B, Hkv, C, D]; none past N); the pad amounts are shape arithmetic, which the CUDA
        provider does on the host."""
        key = (cos_rows, sin_rows)
        if key not in padded_tables:
            n = len(padded_tables)
            stem = f"gqa_rows_{n}"
            const = {
                f"{stem}_zero": np.array([0], np.int64),
                f"{stem}_zeros2": np.array([0, 0], np.int64),
            }
            for name, value in const.items():
                graph.initializer.append(numpy_helper.from_array(value, name))
            nodes = [
                helper.make_node("Shape", [cache], [f"{stem}_capacity"], start=2, end=3),
                helper.make_node("Shape", [cos_rows], [f"{stem}_count"], start=0, end=1),
                helper.make_node("Sub", [f"{stem}_capacity", f"{stem}_count"], [f"{stem}_short"]),
                helper.make_node("Max", [f"{stem}_short", f"{stem}_zero"], [f"{stem}_more"]),
                helper.make_node(
                    "Concat",
                    [f"{stem}_zeros2", f"{stem}_more", f"{stem}_zero"],
                    [f"{stem}_pads"],
                    axis=0,
                ),
            ]
            names = []
            for rows, kind in ((cos_rows, "cos"), (sin_rows, "sin")):
                names.append(f"{stem}_{kind}")
                nodes.append(helper.make_node("Pad", [rows, f"{stem}_pads"], [names[-1]]))
            graph.node.extend(nodes)  # placed by the topological sort below
            padded_tables[key] = (names[0], names[1])
        return padded_tables[key]

    fused = 0
    for index, gqa in enumerate(graph.node):
        if gqa.op_type != "GroupQueryAttention" or gqa.domain != "com.microsoft":
            continue
        if int(attr(gqa, "do_rotary", 0)) or len(gqa.input) < 7 or any(gqa.input[7:16]):
            continue
        q_side = _rotary_branch(gqa.input[0], made, init)
        k_side = _rotary_branch(gqa.input[1], made, init)
        if q_side is None or k_side is None:
            continue
        (q_src, q_norm, q_rot), (k_src, k_norm, k_rot) = q_side, k_side
        split = producer.get(q_src)
        if (
            split is None
            or split.op_type != "Split"
            or len(split.output) != 3
            or list(split.output) != [q_src, k_src, gqa.input[2]]
            or int(attr(split, "axis", 0)) not in (-1, 2)
            or (q_norm is None) != (k_norm is None)
            or list(q_rot.input[1:]) != list(k_rot.input[1:])
            or any(readers.get(o, 0) != 1 for o in split.output)
        ):
            continue
        head_dim = int(attr(q_rot, "rotary_embedding_dim", 0))
        if head_dim % 16:  # the op's rotary needs head_size % 16 == 0
            continue
        caches = table(q_rot.input[2], q_rot.input[3])
        position_ids = "position_ids"
        if caches is None:  # MRoPE or other per-token rows: fold them as they are
            caches = padded(q_rot.input[2], q_rot.input[3], gqa.input[3])
            position_ids = q_rot.input[1]
        norm_inputs = ["", ""]
        extra: dict[str, Any] = {}
        if not norms:  # rotary only: q and k as the norms left them, unpacked
            new_inputs = [q_rot.input[0], k_rot.input[0], gqa.input[2], *gqa.input[3:7]]
            new_inputs += [*caches, position_ids, *gqa.input[10:]]
        elif q_norm is not None:
            eps = {float(attr(n, "epsilon", 1e-5)) for n in (q_norm, k_norm)}
            if len(eps) != 1:
                continue
            norm_inputs = [q_norm.input[1], k_norm.input[1]]
            extra["qk_norm_epsilon"] = eps.pop()
        if norms:
            new_inputs = [split.input[0], "", "", *gqa.input[3:7], *caches, position_ids]
            new_inputs += ["", "", "", "", *norm_inputs, *gqa.input[16:]]
        kwargs = {a.name: helper.get_attribute_value(a) for a in gqa.attribute}
        kwargs.update(do_rotary=1, rotary_interleaved=0, **extra)
        graph.node[index].CopyFrom(
            helper.make_node(
                "GroupQueryAttention",
                new_inputs,
                list(gqa.output),
                name=gqa.name or None,
                domain="com.microsoft",
                **kwargs,
            )
        )
        fused += 1
    if fused:
        if padded_tables:  # the pads were appended after the nodes that read them
            ordered = _topological(list(graph.node))
            del graph.node[:]
            graph.node.extend(ordered)
        _drop_unused(graph)
    return fused


def _rotary_branch(name: str, made: Any, init: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """RotaryEmbedding(Reshape(RMSNormalization(Reshape(x))) or of x itself: (x, norm or None,
    rotary node)."""
    rot = made(name, "RotaryEmbedding")
    if rot is None or rot.domain != "com.microsoft":
        return None
    if any(a.name == "interleaved" and a.i for a in rot.attribute):
        return None
    outer = made(rot.input[0], "Reshape")
    norm = made(outer.input[0], "RMSNormalization") if outer is not None else None
    inner = made(norm.input[0], "Reshape") if norm is not None else None
    if inner is None:
        return rot.input[0], None, rot
    if norm.input[1] not in init or any(a.name == "axis" and a.i != -1 for a in norm.attribute):
        return None
    return inner.input[0], norm, rot


def _one_d_rope(
    rows: str, fn: str, made: Any, init: dict[str, Any], inputs: dict[str, Any]
) -> tuple[np.ndarray, np.dtype] | None:
    """rows = Reshape(Slice(Cast(fn(Concat(f, f))))), f = Mul(Unsqueeze(Cast(position_ids)),
    inv_freq): the first halves of fn(position * inv_freq). Returns (inv_freq, table dtype)."""
    from onnx import helper, numpy_helper

    reshape = made(rows, "Reshape")
    sliced = made(reshape.input[0], "Slice") if reshape is not None else None
    cast = made(sliced.input[0], "Cast") if sliced is not None else None
    trig = made(cast.input[0], fn) if cast is not None else None
    cat = made(trig.input[0], "Concat") if trig is not None else None
    if cat is None or len(cat.input) != 2 or cat.input[0] != cat.input[1]:
        return None
    mul = made(cat.input[0], "Mul")
    if mul is None or mul.input[1] not in init:
        return None
    unsq = made(mul.input[0], "Unsqueeze")
    pos = made(unsq.input[0], "Cast") if unsq is not None else None
    if pos is None or pos.input[0] != "position_ids" or "position_ids" not in inputs:
        return None
    if len(inputs["position_ids"].type.tensor_type.shape.dim) != 2:  # [3, B, S]: MRoPE
        return None
    inv_freq = numpy_helper.to_array(init[mul.input[1]]).astype(np.float32).reshape(-1)
    to = next(a.i for a in cast.attribute if a.name == "to")
    return inv_freq, helper.tensor_dtype_to_np_dtype(to)


def _drop_unused(graph: Any) -> None:
    """Remove nodes none of whose outputs is read (repeatedly), then unread initializers."""
    outputs = {o.name for o in graph.output}
    while True:
        read = {i for n in graph.node for i in n.input} | outputs
        keep = [n for n in graph.node if any(o in read for o in n.output if o)]
        if len(keep) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(keep)
    read = {i for n in graph.node for i in n.input} | outputs
    unread = [t for t in graph.initializer if t.name not in read]
    for t in unread:
        graph.initializer.remove(t)
