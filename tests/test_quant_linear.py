"""edgeomni::QuantMatMul: the blocked-int4 layout, RTN, and each lowering against numpy."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeomni.plugins import lower_model, quant_linear
from edgeomni.plugins.lowering import onnxruntime_options

K, N = 256, 96


def weight(k: int = K, n: int = N, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)).astype(np.float32) * 0.05
    w[:, 3] *= 40  # an outlier column: its blocks get their own, larger scales
    w[:32, 5] = 0.0  # an all-zero block
    return w


def test_pack_unpack_round_trip() -> None:
    codes = np.random.default_rng(1).integers(0, 16, (7, 64), dtype=np.uint8)
    packed = quant_linear.pack_codes(codes)
    assert packed.shape == (7, 32)
    assert packed[0, 0] == codes[0, 0] | (codes[0, 1] << 4)  # lower K index in the low nibble
    np.testing.assert_array_equal(quant_linear.unpack_codes(packed, 64), codes)


@pytest.mark.parametrize("bs", quant_linear.BLOCK_SIZES)
def test_rtn_error_is_at_most_half_a_step(bs: int) -> None:
    w = weight()
    packed, scales = quant_linear.quantize_symmetric(w, bs)
    assert packed.shape == (N, K // bs, bs // 2) and packed.dtype == np.uint8
    assert scales.shape == (N, K // bs)
    deq = quant_linear.dequantize(packed, scales, None, k=K, block_size=bs)
    step = np.repeat(scales.T, bs, axis=0)  # [K, N], each weight's own block scale
    assert np.all(np.abs(deq - w) <= step / 2 + 1e-7)
    codes = quant_linear.unpack_codes(packed.reshape(N, -1), K)
    assert codes.min() >= 1 and codes.max() <= 15  # symmetric: -7..7 around 8
    # each block's largest magnitude is exactly representable
    blocks = np.abs(w).T.reshape(N, K // bs, bs)
    np.testing.assert_allclose(scales * 7, blocks.max(axis=2), rtol=1e-6)
    assert np.all(deq[:32, 5] == 0) if bs <= 32 else True


def test_rtn_float16_scales_are_what_the_codes_were_rounded_with() -> None:
    w = weight()
    packed, scales = quant_linear.quantize_symmetric(w, 32, np.float16)
    assert scales.dtype == np.float16
    deq = quant_linear.dequantize(packed, scales, None, k=K, block_size=32)
    step = np.repeat(scales.astype(np.float32).T, 32, axis=0)
    # a scale rounded down to float16 can push the largest magnitude past 7 steps, where it is
    # clipped: at most 7 * 2**-11 of a step more; the float16 weight adds its own rounding
    bound = step * (0.5 + 7 * 2.0**-11) + np.abs(w) * 2.0**-11 + 1e-7
    assert np.all(np.abs(deq.astype(np.float32) - w) <= bound)


def _graph(
    packed: np.ndarray,
    scales: np.ndarray,
    zeros: np.ndarray | None,
    bs: int,
    dtype: int,
    k: int = K,
) -> onnx.ModelProto:
    """x [B, S, K] -> QuantMatMul -> y [B, S, N], the weights as initializers."""
    inits = [numpy_helper.from_array(packed, "w_q"), numpy_helper.from_array(scales, "w_s")]
    if zeros is not None:
        inits.append(numpy_helper.from_array(zeros, "w_z"))
    node = quant_linear.make_node(
        "x", "w_q", "w_s", "w_z" if zeros is not None else None, "y", k=k, n=N, block_size=bs
    )
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("x", dtype, ["b", "s", k])],
        [helper.make_tensor_value_info("y", dtype, ["b", "s", N])],
        inits,
    )
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid(quant_linear.DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets)


def _run(model: onnx.ModelProto, x: np.ndarray, optimize: bool = True) -> np.ndarray:
    so = ort.SessionOptions()
    if not optimize:  # as written: ORT would fuse DequantizeLinear + MatMul into MatMulNBits
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _zero_points(rng: np.random.Generator, bs: int) -> np.ndarray:
    return quant_linear.pack_codes(rng.integers(0, 16, (N, K // bs), dtype=np.uint8))


@pytest.mark.parametrize("bs", quant_linear.BLOCK_SIZES)
@pytest.mark.parametrize("asymmetric", [False, True])
def test_onnxruntime_lowering_matches_numpy(bs: int, asymmetric: bool) -> None:
    """MatMulNBits at accuracy level 0 computes the reference's product (float32)."""
    rng = np.random.default_rng(bs)
    packed, scales = quant_linear.quantize_symmetric(weight(), bs)
    zeros = _zero_points(rng, bs) if asymmetric else None
    x = rng.standard_normal((2, 5, K)).astype(np.float32)
    expected = quant_linear.reference(x, packed, scales, zeros, K=K, N=N, block_size=bs)
    model = lower_model(_graph(packed, scales, zeros, bs, TensorProto.FLOAT), "onnxruntime",
                        {**onnxruntime_options(), "nbits_accuracy_level": 0})  # fmt: skip
    assert [n.op_type for n in model.graph.node] == ["MatMulNBits"]
    np.testing.assert_allclose(_run(model, x), expected, rtol=1e-4, atol=1e-4)


def test_onnxruntime_int8_accuracy_level_is_close() -> None:
    """Level 4 (the CPU default) rounds activations to int8 per block: close, not equal."""
    rng = np.random.default_rng(3)
    packed, scales = quant_linear.quantize_symmetric(weight(), 32)
    x = rng.standard_normal((2, 5, K)).astype(np.float32)
    expected = quant_linear.reference(x, packed, scales, K=K, N=N, block_size=32)
    model = lower_model(_graph(packed, scales, None, 32, TensorProto.FLOAT), "onnxruntime",
                        {**onnxruntime_options(), "nbits_accuracy_level": 4})  # fmt: skip
    assert {a.name: a.i for a in model.graph.node[0].attribute}["accuracy_level"] == 4
    got = _run(model, x)
    rel = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert 0 < rel < 2e-2


def test_onnxruntime_lowering_float16() -> None:
    rng = np.random.default_rng(4)
    packed, scales = quant_linear.quantize_symmetric(weight(), 32, np.float16)
    x = rng.standard_normal((1, 3, K)).astype(np.float16)
    expected = quant_linear.reference(x, packed, scales, K=K, N=N, block_size=32)
    model = lower_model(_graph(packed, scales, None, 32, TensorProto.FLOAT16), "onnxruntime",
                        {**onnxruntime_options(), "nbits_accuracy_level": 0})  # fmt: skip
    got = _run(model, x).astype(np.float32)
    np.testing.assert_allclose(got, expected.astype(np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("bs", quant_linear.BLOCK_SIZES)
def test_tensorrt_lowering_structure_and_numerics(bs: int) -> None:
    """The TensorRT lowering is standard ONNX: DequantizeLinear of a signed INT4 [K, N] weight
    with [K/bs, N] scales blocked on axis 0, then MatMul; ONNX Runtime's CPU provider runs the
    same ops, so its numbers are checked here against the reference."""
    rng = np.random.default_rng(bs + 1)
    packed, scales = quant_linear.quantize_symmetric(weight(), bs)
    model = lower_model(_graph(packed, scales, None, bs, TensorProto.FLOAT), "tensorrt", {})
    dq, mm = model.graph.node
    assert (dq.op_type, mm.op_type) == ("DequantizeLinear", "MatMul")
    attrs = {a.name: helper.get_attribute_value(a) for a in dq.attribute}
    assert attrs == {"axis": 0, "block_size": bs}
    assert len(dq.input) == 2  # no zero point: TensorRT's int4 is symmetric
    inits = {t.name: t for t in model.graph.initializer}
    assert set(inits) == {dq.input[0], dq.input[1]}  # the packed uint8 weight is gone
    w = inits[dq.input[0]]
    assert w.data_type == TensorProto.INT4 and list(w.dims) == [K, N]
    assert list(inits[dq.input[1]].dims) == [K // bs, N]
    assert mm.input[1] == dq.output[0]
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 21
    onnx.checker.check_model(model, full_check=True)
    codes = numpy_helper.to_array(w).astype(np.int16)  # signed, [K, N]
    expected_codes = quant_linear.unpack_codes(packed.reshape(N, -1), K).T.astype(np.int16) - 8
    np.testing.assert_array_equal(codes, expected_codes)
    x = rng.standard_normal((2, 4, K)).astype(np.float32)
    expected = quant_linear.reference(x, packed, scales, K=K, N=N, block_size=bs)
    np.testing.assert_allclose(_run(model, x, optimize=False), expected, rtol=1e-4, atol=1e-4)


def test_tensorrt_lowering_of_a_single_block_is_two_half_blocks() -> None:
    """K == block size: TensorRT-RTX 1.7 refuses a blocked DequantizeLinear whose scale is
    [1, N] ("ScaleMode is illegal"), so the lowering uses half blocks, each with the block's
    scale: the same weight."""
    w = np.random.default_rng(3).standard_normal((32, N)).astype(np.float32)
    packed, scales = quant_linear.quantize_symmetric(w, 32)
    model = lower_model(_graph(packed, scales, None, 32, TensorProto.FLOAT, k=32), "tensorrt", {})
    dq = model.graph.node[0]
    assert {a.name: helper.get_attribute_value(a) for a in dq.attribute} == {
        "axis": 0, "block_size": 16}  # fmt: skip
    x = np.random.default_rng(4).standard_normal((1, 2, 32)).astype(np.float32)
    expected = quant_linear.reference(x, packed, scales, K=32, N=N, block_size=32)
    np.testing.assert_allclose(_run(model, x, optimize=False), expected, rtol=1e-5, atol=1e-5)


def test_tensorrt_lowering_refuses_zero_points() -> None:
    packed, scales = quant_linear.quantize_symmetric(weight(), 32)
    zeros = _zero_points(np.random.default_rng(0), 32)
    with pytest.raises(ValueError, match="zero points.*only symmetric"):
        lower_model(_graph(packed, scales, zeros, 32, TensorProto.FLOAT), "tensorrt", {})


def test_packed_bytes_counts_what_the_tensors_hold() -> None:
    packed, scales = quant_linear.quantize_symmetric(weight(), 64, np.float16)
    zeros = quant_linear.pack_codes(np.zeros((N, K // 64), np.uint8))
    assert quant_linear.packed_bytes(K, N, 64, 2, False) == packed.nbytes + scales.nbytes
    assert quant_linear.packed_bytes(K, N, 64, 2, True) == (
        packed.nbytes + scales.nbytes + zeros.nbytes
    )
