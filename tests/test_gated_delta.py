"""edgeomni::CausalConvState and edgeomni::GatedDeltaRule: the numpy references equal
transformers' Qwen3.5 functions, the torch ops equal the references, and both backends' lowerings
(the TensorRT ones run by ONNX Runtime's kernels of the same plain ops) equal the references over
ragged, idle and multi-call schedules, pad tokens never touching a state."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from edgeomni.plugins import gated_delta as gd
from edgeomni.plugins import lower_model

B, C, K = 3, 12, 4
HK, HV, DK, DV = 2, 4, 8, 6
F = TensorProto.FLOAT
I32 = TensorProto.INT32
# (S, query_lens): a ragged prefill longer than ONNX Runtime's 64-token chunk, with an idle row;
# a short one; decode; decode with a row sitting out; a chunk after a past
SCHEDULE = [(70, [70, 33, 0]), (6, [6, 3, 0]), (1, [1, 1, 1]), (1, [1, 0, 1]), (3, [3, 2, 1])]


def rng_inputs(seed: int, s: int, b: int = B) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((b, s, HV)).astype(np.float32)
    return {
        "x": rng.standard_normal((b, s, C)).astype(np.float32),
        "q": rng.standard_normal((b, s, HK * DK)).astype(np.float32),
        "k": rng.standard_normal((b, s, HK * DK)).astype(np.float32),
        "v": rng.standard_normal((b, s, HV * DV)).astype(np.float32),
        "g": (-np.exp(rng.uniform(-1, 1, HV)) * np.log1p(np.exp(a))).astype(np.float32),
        "beta": (1 / (1 + np.exp(-rng.standard_normal((b, s, HV))))).astype(np.float32),
    }


RULE_KW = {"num_k_heads": HK, "num_v_heads": HV}


# ---------------------------------------------------------------------------------------------
# references against transformers
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunked", [False, True])
def test_rule_reference_is_transformers(chunked: bool) -> None:
    s = 20
    x = rng_inputs(0, s)
    state = np.random.default_rng(1).standard_normal((B, HV, DV, DK)).astype(np.float32)
    o, present = gd.rule_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], state,
                                   np.full(B, s, np.int32), **RULE_KW)  # fmt: skip
    t = {n: torch.from_numpy(x[n]) for n in ("q", "k", "v", "g", "beta")}
    args = (t["q"].view(B, s, HK, DK), t["k"].view(B, s, HK, DK), t["v"].view(B, s, HV, DV),
            t["g"], t["beta"])  # fmt: skip
    # transformers' state is K-major [B, Hv, dk, dv]
    kw = {"initial_state": torch.from_numpy(state).transpose(2, 3).contiguous(),
          "output_final_state": True, "use_qk_l2norm_in_kernel": True}  # fmt: skip
    if chunked:  # chunks of 8: three chunks, the last one padded
        ho, hs = hf.torch_chunk_gated_delta_rule(*args, chunk_size=8, **kw)
    else:
        ho, hs = hf.torch_recurrent_gated_delta_rule(*args, **kw)
    np.testing.assert_allclose(o, ho.reshape(B, s, -1).numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(present, hs.transpose(2, 3).numpy(), atol=1e-5, rtol=1e-5)


def test_conv_reference_is_transformers() -> None:
    s = 5
    rng = np.random.default_rng(2)
    x = rng.standard_normal((B, s, C)).astype(np.float32)
    w = rng.standard_normal((C, K)).astype(np.float32)
    past = rng.standard_normal((B, C, K - 1)).astype(np.float32)
    full = np.full(B, s, np.int32)
    y, present = gd.conv_reference(x, w, past, full, kernel_size=K)
    # with a cached state: transformers' update path (the state updated in place)
    state = torch.from_numpy(past.copy())
    hy = hf.causal_conv1d_update(torch.from_numpy(x).transpose(1, 2), state, torch.from_numpy(w),
                                 activation="silu")  # fmt: skip
    np.testing.assert_allclose(y, hy.transpose(1, 2).numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(present, state.numpy())
    # from an empty cache (prefill): transformers' zero-padded conv
    y0, _ = gd.conv_reference(x, w, np.zeros_like(past), full, kernel_size=K)
    hy0 = hf.causal_conv1d_fn(torch.from_numpy(x).transpose(1, 2), torch.from_numpy(w),
                              activation="silu")  # fmt: skip
    np.testing.assert_allclose(y0, hy0.transpose(1, 2).numpy(), atol=1e-5, rtol=1e-5)


def test_torch_ops_are_the_references() -> None:
    s, lens = 5, np.array([5, 2, 0], np.int32)
    x = rng_inputs(3, s)
    rng = np.random.default_rng(4)
    w = rng.standard_normal((C, K)).astype(np.float32)
    conv_past = rng.standard_normal((B, C, K - 1)).astype(np.float32)
    rule_past = rng.standard_normal((B, HV, DV, DK)).astype(np.float32)
    y, cp = gd.conv_torch_op()(*map(torch.from_numpy, (x["x"], w, conv_past, lens)), K, "silu")
    ry, rcp = gd.conv_reference(x["x"], w, conv_past, lens, kernel_size=K)
    np.testing.assert_allclose(y.numpy(), ry, atol=1e-5)
    np.testing.assert_array_equal(cp.numpy(), rcp)
    t = [torch.from_numpy(a) for a in (x["q"], x["k"], x["v"], x["g"], x["beta"], rule_past, lens)]
    o, rp = gd.rule_torch_op()(*t, HK, HV, 1, 0.0)
    ro, rrp = gd.rule_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], rule_past, lens,
                                **RULE_KW)  # fmt: skip
    for row, n in enumerate(lens):
        np.testing.assert_allclose(o.numpy()[row, :n], ro[row, :n], atol=1e-5)
    np.testing.assert_allclose(rp.numpy(), rrp, atol=1e-5)
    np.testing.assert_array_equal(rp.numpy()[2], rule_past[2])  # the idle row: bit for bit


# ---------------------------------------------------------------------------------------------
# lowerings under ONNX Runtime
# ---------------------------------------------------------------------------------------------
def conv_session(backend: str) -> ort.InferenceSession:
    gd.register_onnx_schema()
    vi = helper.make_tensor_value_info
    inputs = [vi("x", F, [None, None, C]), vi("weight", F, [C, K]),
              vi("past_state", F, [None, C, K - 1]), vi("query_lens", I32, [None])]  # fmt: skip
    outputs = [vi("y", F, [None, None, C]), vi("present_state", F, [None, C, K - 1])]
    node = helper.make_node(gd.CONV_OP_TYPE, [i.name for i in inputs], ["y", "present_state"],
                            domain=gd.DOMAIN, kernel_size=K, activation="silu")  # fmt: skip
    return session(node, inputs, outputs, backend)


def rule_session(backend: str, qk_l2norm: int = 1, scale: float = 0.0) -> ort.InferenceSession:
    gd.register_onnx_schema()
    vi = helper.make_tensor_value_info
    inputs = [vi("q", F, [None, None, HK * DK]), vi("k", F, [None, None, HK * DK]),
              vi("v", F, [None, None, HV * DV]), vi("g", F, [None, None, HV]),
              vi("beta", F, [None, None, HV]), vi("past_state", F, [None, HV, DV, DK]),
              vi("query_lens", I32, [None])]  # fmt: skip
    outputs = [vi("o", F, [None, None, HV * DV]), vi("present_state", F, [None, HV, DV, DK])]
    node = helper.make_node(gd.RULE_OP_TYPE, [i.name for i in inputs], ["o", "present_state"],
                            domain=gd.DOMAIN, num_k_heads=HK, num_v_heads=HV,
                            qk_l2norm=qk_l2norm, scale=scale)  # fmt: skip
    return session(node, inputs, outputs, backend)


def session(node: object, inputs: list, outputs: list, backend: str) -> ort.InferenceSession:
    model = helper.make_model(
        helper.make_graph([node], "gdn", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(gd.DOMAIN, 1)],
    )
    old = backend == OLD_ORT  # an onnxruntime before 1.32: no DeltaNet contrib ops
    lower_model(model, "onnxruntime" if old else backend, {"gated_delta_net": False} if old else {})
    ops = {n.op_type for n in model.graph.node}
    assert all(n.domain != gd.DOMAIN for n in model.graph.node)
    contrib = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    if backend in ("tensorrt", OLD_ORT):
        assert not contrib
    else:
        assert contrib & {"CausalConvWithState", "GatedDeltaNet"}
    assert ops
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


OLD_ORT = "onnxruntime<1.32"
BACKENDS = ["onnxruntime", "tensorrt", OLD_ORT]


def garble(a: np.ndarray, lens: np.ndarray, value: float) -> np.ndarray:
    """a with every pad position (s >= lens[b]) set to ``value``."""
    out = a.copy()
    for row, n in enumerate(lens):
        out[row, n:] = value
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_lowering_schedule(backend: str) -> None:
    sess = conv_session(backend)
    w = np.random.default_rng(5).standard_normal((C, K)).astype(np.float32)
    past = np.random.default_rng(6).standard_normal((B, C, K - 1)).astype(np.float32)
    ref_past = past.copy()
    for call, (s, lens_) in enumerate(SCHEDULE):
        lens = np.array(lens_, np.int32)
        x = rng_inputs(10 + call, s)["x"]
        y, present = sess.run(None, {"x": x, "weight": w, "past_state": past, "query_lens": lens})
        ry, rp = gd.conv_reference(x, w, ref_past, lens, kernel_size=K)
        for row, n in enumerate(lens):
            np.testing.assert_allclose(y[row, :n], ry[row, :n], atol=1e-5)
            if n == 0:
                np.testing.assert_array_equal(present[row], past[row])
        np.testing.assert_array_equal(present, rp)  # a gather: exact
        # pad tokens never enter the state
        y2, present2 = sess.run(None, {"x": garble(x, lens, 1e3), "weight": w,
                                       "past_state": past, "query_lens": lens})  # fmt: skip
        np.testing.assert_array_equal(present2, present)
        past, ref_past = present, rp


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("qk_l2norm", "scale"), [(1, 0.0), (0, 0.25)])
def test_rule_lowering_schedule(backend: str, qk_l2norm: int, scale: float) -> None:
    sess = rule_session(backend, qk_l2norm, scale)
    past = np.random.default_rng(7).standard_normal((B, HV, DV, DK)).astype(np.float32)
    ref_past = past.copy()
    names = ("q", "k", "v", "g", "beta")
    for call, (s, lens_) in enumerate(SCHEDULE):
        lens = np.array(lens_, np.int32)
        x = rng_inputs(20 + call, s)
        if not qk_l2norm:  # unnormalised keys make the delta rule diverge: give unit ones
            x["q"], x["k"] = (gd.l2norm(x[n].reshape(B, s, HK, DK)).reshape(B, s, -1)
                              for n in ("q", "k"))  # fmt: skip
        feeds = {n: x[n] for n in names} | {"past_state": past, "query_lens": lens}
        o, present = sess.run(None, feeds)
        ro, rp = gd.rule_reference(*(x[n] for n in names), ref_past, lens, **RULE_KW,
                                   qk_l2norm=qk_l2norm, scale=scale)  # fmt: skip
        assert np.isfinite(o).all()
        for row, n in enumerate(lens):
            np.testing.assert_allclose(o[row, :n], ro[row, :n], atol=2e-5, rtol=1e-5)
            if n == 0:
                np.testing.assert_array_equal(present[row], past[row])
        np.testing.assert_allclose(present, rp, atol=2e-5, rtol=1e-5)
        # pad tokens (any finite values) leave the state bit-identical
        other = {n: garble(x[n], lens, 0.5) for n in names}
        _, present2 = sess.run(None, other | {"past_state": past, "query_lens": lens})
        np.testing.assert_array_equal(present2, present)
        past, ref_past = present, rp


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_carry_equals_one_call(backend: str) -> None:
    """A 5-token prefill then three 1-token steps give the outputs and states of one 8-token
    call (rows of one batch, each with its own length)."""
    conv, rule = conv_session(backend), rule_session(backend)
    total, prefill, b = 8, 5, 2
    x = rng_inputs(30, total, b)
    w = np.random.default_rng(8).standard_normal((C, K)).astype(np.float32)
    names = ("q", "k", "v", "g", "beta")

    def run(lo: int, hi: int, cp: np.ndarray, rp: np.ndarray) -> tuple:
        lens = np.full(b, hi - lo, np.int32)
        y, cp = conv.run(None, {"x": x["x"][:, lo:hi], "weight": w, "past_state": cp,
                                "query_lens": lens})  # fmt: skip
        o, rp = rule.run(None, {n: x[n][:, lo:hi] for n in names}
                         | {"past_state": rp, "query_lens": lens})  # fmt: skip
        return y, o, cp, rp

    zeros_c = np.zeros((b, C, K - 1), np.float32)
    zeros_r = np.zeros((b, HV, DV, DK), np.float32)
    y_all, o_all, cp_all, rp_all = run(0, total, zeros_c, zeros_r)
    y, o, cp, rp = run(0, prefill, zeros_c, zeros_r)
    ys, os_ = [y], [o]
    for t in range(prefill, total):
        y, o, cp, rp = run(t, t + 1, cp, rp)
        ys.append(y)
        os_.append(o)
    np.testing.assert_allclose(np.concatenate(ys, 1), y_all, atol=1e-6)
    np.testing.assert_allclose(np.concatenate(os_, 1), o_all, atol=1e-5)
    np.testing.assert_array_equal(cp, cp_all)
    np.testing.assert_allclose(rp, rp_all, atol=1e-5)
