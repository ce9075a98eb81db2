"""edgeomni::CachedAttention: the ONNX Runtime lowering equals the numpy reference, in place."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from edgeomni.plugins import attention, lower_model

B, HQ, HKV, D, C = 3, 4, 2, 16, 32

# (query length S, per-row query_lens): ragged prefill from empty, decode, chunked prefill with
# an idle row, decode with a finished row, and a full chunk.
SCHEDULE = [
    (5, [5, 3, 0]),
    (1, [1, 1, 1]),
    (1, [1, 1, 1]),
    (3, [3, 2, 0]),
    (1, [1, 0, 1]),
    (4, [4, 4, 4]),
]


def attention_model(window: int, causal: int = 1, options: dict | None = None) -> bytes:
    attention.register_onnx_schema()
    f = TensorProto.FLOAT
    vi = helper.make_tensor_value_info
    inputs = [
        vi("q", f, [None, None, HQ * D]),
        vi("k", f, [None, None, HKV * D]),
        vi("v", f, [None, None, HKV * D]),
        vi("past_key", f, [None, HKV, None, D]),
        vi("past_value", f, [None, HKV, None, D]),
        vi("past_lens", TensorProto.INT32, [None]),
        vi("query_lens", TensorProto.INT32, [None]),
    ]
    outputs = [
        vi("out", f, [None, None, HQ * D]),
        vi("present_key", f, [None, HKV, None, D]),
        vi("present_value", f, [None, HKV, None, D]),
    ]
    node = helper.make_node(
        attention.OP_TYPE,
        [i.name for i in inputs],
        [o.name for o in outputs],
        domain=attention.DOMAIN,
        num_heads=HQ,
        kv_num_heads=HKV,
        window=window,
        causal=causal,
    )
    model = helper.make_model(
        helper.make_graph([node], "attn", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(attention.DOMAIN, 1)],
    )
    lower_model(model, "onnxruntime", options)
    # causal=0 is lowered to plain ops (GQA rejects causal=0 with query_seqlens), and so is every
    # node under the plain_attention option
    fused = any(n.op_type == "GroupQueryAttention" for n in model.graph.node)
    assert fused == (bool(causal) and not (options or {}).get("plain_attention"))
    assert all(n.domain != attention.DOMAIN for n in model.graph.node)
    return model.SerializeToString()


@pytest.mark.parametrize(
    ("window", "causal", "plain"), [(0, 1, 0), (4, 1, 0), (0, 0, 0), (0, 1, 1), (4, 1, 1)]
)
def test_lowering_matches_reference_in_place(window: int, causal: int, plain: int) -> None:
    model = attention_model(window, causal, {"plain_attention": True} if plain else None)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    key_cache = np.zeros((B, HKV, C, D), np.float32)
    value_cache = np.zeros_like(key_cache)
    ref_k, ref_v = key_cache.copy(), value_cache.copy()
    key_ov = ort.OrtValue.ortvalue_from_numpy(key_cache)
    value_ov = ort.OrtValue.ortvalue_from_numpy(value_cache)
    past = np.zeros(B, np.int32)
    for s_len, lens in SCHEDULE:
        query_lens = np.array(lens, np.int32)
        q = rng.standard_normal((B, s_len, HQ * D), dtype=np.float32)
        k = rng.standard_normal((B, s_len, HKV * D), dtype=np.float32)
        v = rng.standard_normal((B, s_len, HKV * D), dtype=np.float32)
        before = key_cache.copy()
        ref_out, ref_k, ref_v = attention.reference(
            q, k, v, ref_k, ref_v, past, query_lens,
            num_heads=HQ, kv_num_heads=HKV, window=window, causal=causal,
        )  # fmt: skip
        io = sess.io_binding()
        for name, arr in (
            ("q", q),
            ("k", k),
            ("v", v),
            ("past_lens", past),
            ("query_lens", query_lens),
        ):
            io.bind_cpu_input(name, arr)
        io.bind_ortvalue_input("past_key", key_ov)
        io.bind_ortvalue_input("past_value", value_ov)
        io.bind_output("out")
        io.bind_ortvalue_output("present_key", key_ov)
        io.bind_ortvalue_output("present_value", value_ov)
        sess.run_with_iobinding(io)
        out = io.get_outputs()[0].numpy()
        for b in range(B):
            n = query_lens[b]
            np.testing.assert_allclose(out[b, :n], ref_out[b, :n], atol=2e-6)
        # the caller's own buffers hold the update: written in place, and only at the new rows
        np.testing.assert_array_equal(key_cache, ref_k)
        np.testing.assert_array_equal(value_cache, ref_v)
        changed = np.argwhere((key_cache != before).any(axis=(1, 3)))
        for b, pos in changed:
            assert past[b] <= pos < past[b] + query_lens[b]
        past = past + query_lens


def test_bidirectional_sees_later_keys() -> None:
    """causal=0 differs from causal=1 exactly where a query has later keys in its row."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 3, HQ * D), dtype=np.float32)
    kv = rng.standard_normal((1, 3, HKV * D), dtype=np.float32)
    cache = np.zeros((1, HKV, 4, D), np.float32)
    lens = np.array([0], np.int32), np.array([3], np.int32)
    kw = {"num_heads": HQ, "kv_num_heads": HKV}
    both = [attention.reference(q, kv, kv, cache, cache, *lens, causal=c, **kw)[0] for c in (0, 1)]
    np.testing.assert_array_equal(both[0][0, 2], both[1][0, 2])  # the last query sees all anyway
    assert np.abs(both[0][0, :2] - both[1][0, :2]).min() > 0
    with pytest.raises(ValueError, match="window"):
        attention.reference(q, kv, kv, cache, cache, *lens, causal=0, window=2, **kw)


def test_reference_rejects_overflow() -> None:
    q = np.zeros((1, 2, HQ * D), np.float32)
    kv = np.zeros((1, 2, HKV * D), np.float32)
    cache = np.zeros((1, HKV, 4, D), np.float32)
    with pytest.raises(ValueError, match="capacity"):
        attention.reference(
            q, kv, kv, cache, cache, np.array([3], np.int32), np.array([2], np.int32),
            num_heads=HQ, kv_num_heads=HKV,
        )  # fmt: skip


def test_unknown_backend_is_refused() -> None:
    from onnx import ModelProto

    with pytest.raises(ValueError, match="tensorrt"):
        lower_model(ModelProto(), "tensorrt")


def test_lowering_for_onnxruntime_before_1_32() -> None:
    """Without query_seqlens (ORT 1.31): prefill from empty, right-padded, then decode."""
    from edgeomni.plugins.lowering import onnxruntime_options

    options = onnxruntime_options("1.31.1")
    assert options["gqa_query_seqlens"] is False
    model = attention_model(0, options=options)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert len(sess.get_inputs()) == 7
    rng = np.random.default_rng(1)
    cache_k = np.zeros((B, HKV, C, D), np.float32)
    cache_v = np.zeros_like(cache_k)
    ref_k, ref_v = cache_k.copy(), cache_v.copy()
    ok, ov = ort.OrtValue.ortvalue_from_numpy(cache_k), ort.OrtValue.ortvalue_from_numpy(cache_v)
    past = np.zeros(B, np.int32)
    for s_len, lens in [(5, [5, 3, 1]), (1, [1, 1, 1]), (1, [1, 1, 1])]:
        ql = np.array(lens, np.int32)
        q = rng.standard_normal((B, s_len, HQ * D), dtype=np.float32)
        k = rng.standard_normal((B, s_len, HKV * D), dtype=np.float32)
        v = rng.standard_normal((B, s_len, HKV * D), dtype=np.float32)
        ref, ref_k, ref_v = attention.reference(
            q, k, v, ref_k, ref_v, past, ql, num_heads=HQ, kv_num_heads=HKV
        )
        io = sess.io_binding()
        for name, arr in (("q", q), ("k", k), ("v", v), ("past_lens", past), ("query_lens", ql)):
            io.bind_cpu_input(name, arr)
        io.bind_ortvalue_input("past_key", ok)
        io.bind_ortvalue_input("past_value", ov)
        io.bind_output("out")
        io.bind_ortvalue_output("present_key", ok)
        io.bind_ortvalue_output("present_value", ov)
        sess.run_with_iobinding(io)
        out = io.get_outputs()[0].numpy()
        for b in range(B):
            np.testing.assert_allclose(out[b, : ql[b]], ref[b, : ql[b]], atol=2e-6)
            # padding rows land in the cache too, past the row's length, where nothing reads
            valid = past[b] + ql[b]
            np.testing.assert_array_equal(cache_k[b, :, :valid], ref_k[b, :, :valid])
        past = past + ql


def test_lengths_as_inputs() -> None:
    """The CUDA build feeds GQA's length inputs from the host; same results as in-graph ones."""
    from edgeomni.plugins.lowering import onnxruntime_options

    options = {**onnxruntime_options(), "lengths_as_inputs": True}
    sess = ort.InferenceSession(
        attention_model(0, options=options), providers=["CPUExecutionProvider"]
    )
    names = {i.name for i in sess.get_inputs()}
    assert set(attention.LENGTH_INPUTS) <= names
    rng = np.random.default_rng(2)
    past, ql = np.zeros(B, np.int32), np.array([5, 3, 1], np.int32)
    q = rng.standard_normal((B, 5, HQ * D), dtype=np.float32)
    k = rng.standard_normal((B, 5, HKV * D), dtype=np.float32)
    v = rng.standard_normal((B, 5, HKV * D), dtype=np.float32)
    cache = np.zeros((B, HKV, C, D), np.float32)
    total = past + ql
    feeds = {"q": q, "k": k, "v": v, "past_key": cache, "past_value": cache.copy(),
             "past_lens": past, "query_lens": ql,
             "gqa_seqlens_k": np.maximum(total - 1, 0).astype(np.int32),
             "gqa_total_length": np.array(total.max(), np.int32)}  # fmt: skip
    out = sess.run(["out"], feeds)[0]
    ref, _, _ = attention.reference(q, k, v, cache, cache, past, ql, num_heads=HQ, kv_num_heads=HKV)
    for b in range(B):
        np.testing.assert_allclose(out[b, : ql[b]], ref[b, : ql[b]], atol=2e-6)
