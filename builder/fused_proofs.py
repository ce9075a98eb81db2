"""What builder/fused_plan.py proves by running part of a graph rather than matching it: the
rotary angles (inv_freq and each frequency's position axis) and an in-engine sampler's draw,
each evaluated by onnx's reference evaluator on probes and compared with what the fused kernels
compute."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


class Unfused(ValueError):
    """The graph holds something the fused kernels do not compute (the message says what)."""


def evaluate(model: Any, inits: dict[str, Any], outputs: list[str],
             feeds: dict[str, np.ndarray]) -> list[np.ndarray]:  # fmt: skip
    """The graph's values ``outputs`` for ``feeds`` (onnx's reference evaluator, on the nodes
    they need, from the feeds and initializers)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    todo, used = list(outputs), set()
    seen: set[int] = set()
    while todo:
        name = todo.pop()
        if name in inits:
            used.add(name)
        node = producer.get(name)
        if node is None or id(node) in seen or name in feeds:
            continue
        seen.add(id(node))
        todo.extend(node.input)
    order = [n for n in graph.node if id(n) in seen]
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), None)
           for n, v in feeds.items()]  # fmt: skip
    outs = [helper.make_tensor_value_info(o, 0, None) for o in outputs]
    probe = helper.make_graph(order, "probe", ins, outs)
    probe.initializer.extend(inits[n] for n in sorted(used))
    return list(ReferenceEvaluator(helper.make_model(probe, opset_imports=model.opset_import))
                .run(None, feeds))  # fmt: skip


def rotary_tables(
    angles_of: Callable[[np.ndarray], np.ndarray], head_dim: int, mrope: bool
) -> tuple[np.ndarray, np.ndarray]:
    """inv_freq [D/2] (float32) and each frequency's position axis [D/2] (int32) of the angles
    ``angles_of(position_ids)`` gives; the kernels compute cos and sin of position * inv_freq
    over both halves (rotate-half), so anything else is refused."""
    half = head_dim // 2
    axes = 3 if mrope else 1
    shape = (axes, 2, 3) if mrope else (2, 3)

    def angles(pos: np.ndarray) -> np.ndarray:
        got = np.asarray(angles_of(pos.reshape(shape)), np.float64)
        return got.reshape(-1, got.shape[-1])

    inv = np.zeros(half)
    axis = np.full(half, -1)
    for a in range(axes):
        pos = np.zeros((axes, 6), np.int64)
        pos[a] = 1
        got = angles(pos)
        if got.shape[-1] != head_dim or not np.array_equal(got[:, :half], got[:, half:]):
            raise Unfused(f"its rotary angles are not rotate-half of head_dim {head_dim}")
        hit = got[0, :half] != 0
        if (axis[hit] >= 0).any():
            raise Unfused("a rotary frequency follows more than one position axis")
        axis[hit], inv[hit] = a, got[0, :half][hit]
    if (axis < 0).any():
        raise Unfused("a rotary frequency follows no position axis")
    pos = np.random.default_rng(0).integers(0, 4096, (axes, 6))
    want = (pos.astype(np.float32)[axis].T * inv.astype(np.float32)).astype(np.float32)
    if not np.allclose(angles(pos)[:, :half], want, rtol=1e-6, atol=1e-6):
        raise Unfused("its rotary angles are not position * inv_freq")
    return inv.astype(np.float32), axis.astype(np.int32)


def check_sampler(
    draw: Callable[[dict[str, np.ndarray]], list[np.ndarray]], table: np.ndarray, heads: int,
    vocab: int, k: int, dtype: str, inputs: Sequence[str],
) -> None:  # fmt: skip
    """``draw(feeds)`` (the graph's sampled ids and embeddings for top-K rows and draw settings,
    ``inputs`` the graph's draw inputs) draws what the fused draw kernel's reference draws, on
    random rows, a row the K cannot decide among them."""
    from edgeomni.plugins.decoder_cuda import sample_reference

    rng = np.random.default_rng(0)
    rows = 8
    vtype = np.float16 if dtype == "float16" else np.float32
    for temperature, top_k, top_p in ((1.0, k, 1.0), (0.7, max(k // 2, 2), 0.8)):
        values = -np.sort(-rng.standard_normal((rows, k)) * 2, axis=1).astype(vtype)
        values[0, 1:] = values[0, 0]  # a row the K cannot decide
        ids = np.stack([rng.permutation(vocab)[:k] for _ in range(rows)]).astype(np.int64)
        uniform = rng.random(rows)
        head = int(rng.integers(heads))
        feeds = {"topk_values": values, "topk_indices": ids, "sample_uniform": uniform,
                 "sample_temperature": np.array([temperature]),
                 "sample_top_k": np.array([top_k], np.int64), "sample_top_p": np.array([top_p]),
                 "lm_head_index": np.array([head], np.int64)}  # fmt: skip
        feeds = {n: v for n, v in feeds.items() if n in inputs or n.startswith("topk")}
        got_ids, got_rows = draw(feeds)
        want_ids, want_rows = sample_reference(
            values, ids, uniform, temperature=temperature, top_k=top_k, top_p=top_p,
            tables=table, head=head)  # fmt: skip
        if not np.array_equal(np.asarray(got_ids).reshape(-1), want_ids) or \
                not np.array_equal(np.asarray(got_rows), want_rows):  # fmt: skip
            raise Unfused("its sampler draws other ids than the fused draw kernel")
