"""edgeomni::QuantMoE: int4 experts, the ONNX Runtime lowering (QMoE) and the TensorRT one
(DequantizeLinear + MoE's dense ops, run here on ONNX Runtime's CPU provider) against numpy."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgeomni.plugins import lower_model, moe, quant_moe
from edgeomni.plugins.lowering import onnxruntime_options

H, INTER, E = 128, 64, 6
NAMES = quant_moe.INPUTS[2:]


def experts(block: int, dtype: type = np.float32, seed: int = 0) -> dict[str, np.ndarray]:
    """fc1 [E, 2I, H] and fc2 [E, H, I] packed at ``block``, scales in ``dtype``."""
    rng = np.random.default_rng(seed)
    fc1 = rng.standard_normal((E, 2 * INTER, H)) / math.sqrt(H)
    fc2 = rng.standard_normal((E, H, INTER)) / math.sqrt(INTER)
    fc1[0, 3] *= 30  # an outlier row: its blocks get their own, larger scales
    fc2[1, :, :block] = 0.0  # all-zero blocks
    out = {}
    for name, w in (("fc1", fc1), ("fc2", fc2)):
        out[name], out[name + "_scales"] = quant_moe.quantize_experts(w, block, dtype)
    return out


def model(weights: dict[str, np.ndarray], top_k: int, normalize: int, block: int,
          dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:  # fmt: skip
    """x, router_logits -> QuantMoE -> y, the experts as initializers; not yet lowered."""
    vi = helper.make_tensor_value_info
    node = quant_moe.make_node(
        list(quant_moe.INPUTS), "y", top_k=top_k, normalize_routing=normalize, block_size=block
    )
    graph = helper.make_graph(
        [node], "qmoe", [vi("x", dtype, [None, H]), vi("router_logits", dtype, [None, E])],
        [vi("y", dtype, [None, H])],
        [onnx.numpy_helper.from_array(weights[n], n) for n in NAMES],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid(quant_moe.DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets)


def run(m: onnx.ModelProto, x: np.ndarray, logits: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # ops as written
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x, "router_logits": logits})[0]


def inputs(t: int, dtype: type, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((t, H)).astype(dtype),
            (2 * rng.standard_normal((t, E))).astype(dtype))  # fmt: skip


def test_quantize_round_trip() -> None:
    """Packing is MatMulNBits' per row; dequantized experts are within half a step."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 8, 64)).astype(np.float32)
    packed, scales = quant_moe.quantize_experts(w, 32)
    assert packed.shape == (3, 8, 32) and scales.shape == (3, 8, 2)
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(3, 8, 64).astype(np.float32)
    step = np.repeat(scales, 32, axis=2)
    np.testing.assert_array_equal(quant_moe.dequantize_experts(packed, scales, 32),
                                  (codes - 8) * step)  # fmt: skip
    assert np.all(np.abs(quant_moe.dequantize_experts(packed, scales, 32) - w) <= step / 2 + 1e-7)
    assert quant_moe.packed_bytes(3, 8, 64, 32, 4) == packed.nbytes + scales.nbytes


@pytest.mark.parametrize("block", [16, 32, 64])
@pytest.mark.parametrize("normalize", [0, 1])
@pytest.mark.parametrize("top_k", [1, 2, E])
def test_onnxruntime_qmoe_matches_reference(block: int, normalize: int, top_k: int) -> None:
    """QMoE at accuracy level 0 computes the dequantize-then-MoE reference (float32)."""
    w = experts(block)
    m = model(w, top_k, normalize, block)
    lower_model(m, "onnxruntime", {**onnxruntime_options(), "nbits_accuracy_level": 0})
    qmoe, *scaling = m.graph.node
    attrs = {a.name: helper.get_attribute_value(a) for a in qmoe.attribute}
    assert (qmoe.domain, qmoe.op_type) == ("com.microsoft", "QMoE")
    assert list(qmoe.input) == ["x", "router_logits", "fc1", "fc1_scales", "", "fc2",
                                "fc2_scales", ""]  # fmt: skip
    assert attrs["block_size"] == block and attrs["weights_prepacked"] == 0
    assert (attrs["expert_weight_bits"], attrs["accuracy_level"], attrs["k"]) == (4, 0, top_k)
    assert [n.op_type for n in scaling] == ([] if normalize else
                                            ["Softmax", "TopK", "ReduceSum", "Mul"])  # fmt: skip
    for t in (1, 7, 65):
        x, logits = inputs(t, np.float32, t + block)
        ref = quant_moe.reference(x, logits, *(w[n] for n in NAMES), top_k=top_k,
                                  normalize_routing=normalize, block_size=block)  # fmt: skip
        np.testing.assert_allclose(run(m, x, logits), ref, rtol=0,
                                   atol=4e-6 * max(1.0, float(np.abs(ref).max())))  # fmt: skip


def test_qmoe_renormalises_whatever_its_attribute_says() -> None:
    """Why the lowering never writes normalize_routing_weights=0: ORT 1.32's CPU QMoE ignores
    it. If this starts failing, ORT honours the attribute and the Softmax/TopK tail can go."""
    w = experts(32)
    m = model(w, 2, 1, 32)
    lower_model(m, "onnxruntime", {**onnxruntime_options(), "nbits_accuracy_level": 0})
    next(a for a in m.graph.node[0].attribute if a.name == "normalize_routing_weights").i = 0
    x, logits = inputs(9, np.float32, 0)
    args = [*(w[n] for n in NAMES)]
    normalized = quant_moe.reference(x, logits, *args, top_k=2, normalize_routing=1,
                                     block_size=32)  # fmt: skip
    np.testing.assert_allclose(run(m, x, logits), normalized, rtol=0, atol=1e-4)


def test_onnxruntime_qmoe_float16_and_int8_level() -> None:
    """float16 activations and scales; accuracy level 4 (int8 activations) is close, not equal."""
    w = experts(32, np.float16)
    x, logits = inputs(11, np.float16, 3)
    ref = quant_moe.reference(x, logits, *(w[n] for n in NAMES), top_k=2, normalize_routing=0,
                              block_size=32).astype(np.float32)  # fmt: skip
    for level, rel in ((0, 2e-3), (4, 3e-2)):
        m = model(w, 2, 0, 32, TensorProto.FLOAT16)
        lower_model(m, "onnxruntime", {**onnxruntime_options(), "nbits_accuracy_level": level})
        got = run(m, x, logits).astype(np.float32)
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < rel, level


@pytest.mark.parametrize("block", [32, 64])
@pytest.mark.parametrize("normalize", [0, 1])
def test_tensorrt_lowering_structure_and_numerics(block: int, normalize: int) -> None:
    """Standard ONNX only: INT4 [E*N, K] weights dequantized 2-D (TensorRT's scale rank limit),
    reshaped, then MoE's dense ops; ONNX Runtime's CPU provider runs them as written."""
    w = experts(block, seed=block)
    m = model(w, 2, normalize, block)
    lower_model(m, "tensorrt", {})
    assert all(n.domain in ("", "ai.onnx") for n in m.graph.node)
    dqs = [n for n in m.graph.node if n.op_type == "DequantizeLinear"]
    inits = {t.name: t for t in m.graph.initializer}
    assert not set(NAMES) & set(inits)  # the uint8 codes and 3-D scales are gone
    for dq, (e, n, k) in zip(dqs, ((E, 2 * INTER, H), (E, H, INTER)), strict=True):
        # one block along K (fc2 at block 64) is two half blocks sharing its scale
        b = block if k > block else block // 2
        assert {a.name: helper.get_attribute_value(a) for a in dq.attribute} == {
            "axis": 1, "block_size": b}  # fmt: skip
        weight, scale = (inits[i] for i in dq.input)
        assert weight.data_type == TensorProto.INT4 and list(weight.dims) == [e * n, k]
        assert list(scale.dims) == [e * n, k // b]
    onnx.checker.check_model(m, full_check=True)
    codes = onnx.numpy_helper.to_array(inits[dqs[0].input[0]]).astype(np.int16)
    lo = (w["fc1"] & 0x0F).astype(np.int16) - 8
    np.testing.assert_array_equal(codes.reshape(E, 2 * INTER, H)[:, :, 0::2], lo)
    x, logits = inputs(13, np.float32, block)
    ref = quant_moe.reference(x, logits, *(w[n] for n in NAMES), top_k=2,
                              normalize_routing=normalize, block_size=block)  # fmt: skip
    np.testing.assert_allclose(run(m, x, logits), ref, rtol=0, atol=4e-6 * np.abs(ref).max())


def test_reference_is_moe_of_the_dequantized_experts() -> None:
    w = experts(32)
    x, logits = inputs(5, np.float32, 8)
    deq = [quant_moe.dequantize_experts(w[n], w[n + "_scales"], 32) for n in ("fc1", "fc2")]
    np.testing.assert_array_equal(
        quant_moe.reference(x, logits, *(w[n] for n in NAMES), top_k=3, normalize_routing=1,
                            block_size=32),
        moe.reference(x, logits, *deq, top_k=3, normalize_routing=1),
    )  # fmt: skip


def toy_decoder(inter: int) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x -> router MatMul -> edgeomni::MoE(x, logits, fc1, fc2) -> y, with a decoder's input."""
    from edgeomni.builder.quantize import DECODER_INPUT

    rng = np.random.default_rng(7)
    w = {"router": rng.standard_normal((H, E)).astype(np.float32),
         "fc1": (rng.standard_normal((E, 2 * inter, H)) / math.sqrt(H)).astype(np.float32),
         "fc2": (rng.standard_normal((E, H, inter)) / math.sqrt(inter)).astype(np.float32)}  # fmt: skip
    vi, f = helper.make_tensor_value_info, TensorProto.FLOAT
    nodes = [
        helper.make_node("MatMul", ["x", "router"], ["logits"]),
        helper.make_node("MoE", ["x", "logits", "fc1", "fc2"], ["y"], name="block",
                         domain=moe.DOMAIN, top_k=2, normalize_routing=0),
    ]  # fmt: skip
    graph = helper.make_graph(
        nodes, "toy", [vi("x", f, [None, H]), vi(DECODER_INPUT, f, [1])], [vi("y", f, [None, H])],
        [onnx.numpy_helper.from_array(v, k) for k, v in w.items()],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid(moe.DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets), w


def test_pass_makes_quant_moe_and_keeps_the_router_float(caplog) -> None:
    from edgeomni.builder.quantize import DECODER_INPUT, Quantization, quantize_model

    caplog.set_level("INFO", logger="edge-build")
    m, w = toy_decoder(INTER)
    report = quantize_model(m, Quantization("int4_rtn", 32))
    assert [n.op_type for n in m.graph.node] == ["MatMul", "QuantMoE"]
    assert (report["moe_blocks"], report["float_moe_blocks"], report["weights"]) == (1, 0, 0)
    assert report["float_weights"] == ["router"] and "router (MoE router)" in caplog.text
    packed = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    assert set(packed) == {"router", "fc1_q4", "fc1_q4_scales", "fc2_q4", "fc2_q4_scales"}
    assert report["weight_bytes"] == {
        "float": w["fc1"].nbytes + w["fc2"].nbytes,
        "int4": sum(v.nbytes for k, v in packed.items() if k != "router")}  # fmt: skip
    assert "keep float experts" not in caplog.text
    lower_model(m, "onnxruntime", {**onnxruntime_options(), "nbits_accuracy_level": 0})
    x = np.random.default_rng(2).standard_normal((9, H)).astype(np.float32)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(["y"], {"x": x, DECODER_INPUT: np.zeros(1, np.float32)})[0]
    expected = quant_moe.reference(
        x, x @ w["router"], *(packed[n] for n in ("fc1_q4", "fc1_q4_scales", "fc2_q4",
                                                  "fc2_q4_scales")),
        top_k=2, normalize_routing=0, block_size=32)  # fmt: skip
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)


def test_pass_leaves_experts_float_when_the_group_does_not_divide(caplog) -> None:
    from edgeomni.builder.quantize import Quantization, quantize_model

    m, _ = toy_decoder(32)  # I=32: groups of 64 divide H=128 but not I
    report = quantize_model(m, Quantization("int4_rtn", 64))
    assert [n.op_type for n in m.graph.node] == ["MatMul", "MoE"]
    assert (report["moe_blocks"], report["float_moe_blocks"]) == (0, 1)
    assert report["float_weights"] == ["fc1", "fc2", "router"]
    assert ("1 mixture-of-experts blocks keep float experts (block: MoE I=32 not a multiple of "
            "the group size 64)") in caplog.text  # fmt: skip
