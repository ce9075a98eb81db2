"""builder.ort_fusions: residual Add + RMSNormalization -> SkipSimplifiedLayerNormalization."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from edgeomni.builder.ort_fusions import fuse_residual_rms_norm

H = 8


def residual_model() -> object:
    """Two decoder-like residual steps, a reader of the first sum placed before its norm (the
    fused node must move ahead of it), and a norm after an Add of a weight (left alone)."""
    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, H).astype(np.float32), n)
        for n in ("w1", "w2", "w3")
    ]
    inits.append(numpy_helper.from_array(rng.standard_normal(H).astype(np.float32), "bias"))

    def norm(x: str, w: str, y: str) -> object:
        return helper.make_node("RMSNormalization", [x, w], [y], epsilon=1e-6, axis=-1)

    nodes = [
        helper.make_node("Add", ["h", "attn"], ["s1"]),
        helper.make_node("Mul", ["s1", "s1"], ["early"]),  # reads the sum before the norm
        norm("s1", "w1", "n1"),
        helper.make_node("Tanh", ["n1"], ["mlp"]),
        helper.make_node("Add", ["s1", "mlp"], ["s2"]),
        norm("s2", "w2", "out"),
        helper.make_node("Add", ["s2", "bias"], ["s3"]),  # a weight: not fused
        norm("s3", "w3", "out3"),
    ]
    inputs = [vi("h", f, [None, None, H]), vi("attn", f, [None, None, H])]
    outputs = [vi(n, f, None) for n in ("out", "s2", "early", "out3")]
    graph = helper.make_graph(nodes, "residual", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def run(model: object, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_fused_graph_computes_the_same() -> None:
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal((2, 3, H)).astype(np.float32) for n in ("h", "attn")}
    model = residual_model()
    before = run(model, feeds)
    assert fuse_residual_rms_norm(model) == 2
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("SkipSimplifiedLayerNormalization") == 2
    assert ops.count("RMSNormalization") == 1 and ops.count("Add") == 1  # the weight's
    after = run(model, feeds)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_nothing_to_fuse_leaves_the_model_alone() -> None:
    model = residual_model()
    del model.graph.node[:6]  # only the weight's Add and its norm are left
    model.graph.input.append(helper.make_tensor_value_info("s2", TensorProto.FLOAT, None))
    keep = [o for o in model.graph.output if o.name == "out3"]
    del model.graph.output[:]
    model.graph.output.extend(keep)
    before = model.SerializeToString()
    assert fuse_residual_rms_norm(model) == 0
    assert model.SerializeToString() == before
