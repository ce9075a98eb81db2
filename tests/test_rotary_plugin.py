"""edgeomni::Rotary: its ONNX Runtime and TensorRT lowerings equal the numpy reference (the
TensorRT ones run by ONNX Runtime's kernels of the same ops), and the plain one the torch op."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from edgeomni.plugins import lower_model, rotary

B, S, D = 3, 5, 16
HEADS = {"xq": 4, "xk": 2}  # two nodes sharing cos/sin, as q and k do in a decoder layer
TYPES = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16}


def rotary_model(dtype: type, options: dict | None, backend: str = "onnxruntime") -> bytes:
    rotary.register_onnx_schema()
    vi = helper.make_tensor_value_info
    t = TYPES[dtype]
    inputs = [vi(n, t, [None, None, h * D]) for n, h in HEADS.items()]
    inputs += [vi("cos", t, [None, None, D]), vi("sin", t, [None, None, D])]
    outputs = [vi("y" + n[1], t, [None, None, h * D]) for n, h in HEADS.items()]
    nodes = [
        helper.make_node(
            rotary.OP_TYPE, [n, "cos", "sin"], ["y" + n[1]], domain=rotary.DOMAIN,
            num_heads=h, head_dim=D,
        )
        for n, h in HEADS.items()
    ]  # fmt: skip
    model = helper.make_model(
        helper.make_graph(nodes, "rotary", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(rotary.DOMAIN, 1)],
    )
    lower_model(model, backend, options)
    ops = [n.op_type for n in model.graph.node]
    fused = bool((options or {}).get("fused_rotary")) or backend == "tensorrt"
    assert ops.count("RotaryEmbedding") == (2 if fused else 0)
    if backend == "onnxruntime":  # the position ids and cos/sin tables: once for both nodes
        assert ops.count("CumSum") == (1 if fused else 0)
    else:  # the halves of cos and sin: once for both nodes
        assert ops.count("Slice") == (2 if fused else 4)
    assert all(n.domain != rotary.DOMAIN for n in model.graph.node)
    return model.SerializeToString()


def feeds(dtype: type, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # per-token angles that are not a function of one position: as MRoPE's are
    angles = rng.uniform(0, 50, (B, S, D // 2))
    emb = np.concatenate([angles, angles], axis=-1)
    out = {n: rng.standard_normal((B, S, h * D)).astype(dtype) for n, h in HEADS.items()}
    out["cos"], out["sin"] = np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)
    return out


LOWERINGS = {  # (backend, options): ONNX Runtime's plain and com.microsoft ones, TensorRT's
    "ort-plain": ("onnxruntime", None), "ort-fused": ("onnxruntime", {"fused_rotary": True}),
    "trt-native": ("tensorrt", None),  # ONNX RotaryEmbedding-23, ORT's kernel
}  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("lowering", list(LOWERINGS))
def test_lowering_matches_reference(dtype: type, lowering: str) -> None:
    backend, options = LOWERINGS[lowering]
    model = rotary_model(dtype, options, backend)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = feeds(dtype)
    got = sess.run(None, x)
    for (name, heads), y in zip(HEADS.items(), got, strict=True):
        ref = rotary.reference(
            x[name].astype(np.float64), x["cos"].astype(np.float64), x["sin"].astype(np.float64),
            num_heads=heads, head_dim=D,
        )  # fmt: skip
        assert y.dtype == dtype and y.shape == x[name].shape
        tol = 2e-3 if dtype == np.float16 else 1e-6
        np.testing.assert_allclose(y.astype(np.float64), ref, atol=tol, rtol=0)


def test_plain_lowering_is_the_torch_formula_bit_for_bit() -> None:
    """A CPU build's rotary is the arithmetic transformers does, so float32 parity is exact."""
    sess = ort.InferenceSession(rotary_model(np.float32, None), providers=["CPUExecutionProvider"])
    x = feeds(np.float32, seed=1)
    got = sess.run(None, x)
    cos, sin = torch.from_numpy(x["cos"]), torch.from_numpy(x["sin"])
    for (name, heads), y in zip(HEADS.items(), got, strict=True):
        eager = rotary.torch_op()(torch.from_numpy(x[name]), cos, sin, heads, D)
        # transformers' own apply_rotary_pos_emb on [B, H, S, D]
        xh = torch.from_numpy(x[name]).view(B, S, heads, D).transpose(1, 2)
        rot = torch.cat((-xh[..., D // 2 :], xh[..., : D // 2]), dim=-1)
        hf = (xh * cos[:, None] + rot * sin[:, None]).transpose(1, 2).reshape(B, S, -1)
        np.testing.assert_array_equal(y, hf.numpy())
        np.testing.assert_array_equal(eager.numpy(), hf.numpy())


def test_odd_head_dim_is_refused() -> None:
    rotary.register_onnx_schema()
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    node = helper.make_node(
        rotary.OP_TYPE, ["x", "c", "s"], ["y"], domain=rotary.DOMAIN, num_heads=1, head_dim=7
    )
    graph = helper.make_graph([node], "g", [vi(n, f, None) for n in "xcs"], [vi("y", f, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(ValueError, match="head_dim 7 must be even"):
        lower_model(model, "onnxruntime", None)
