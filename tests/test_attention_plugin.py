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


def attention_model(window: int, causal: int = 1, options: dict | None = None,
                    backend: str = "onnxruntime") -> bytes:  # fmt: skip
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
    lower_model(model, backend, options)
    assert all(n.domain != attention.DOMAIN for n in model.graph.node)
    if backend == "tensorrt":
        return model.SerializeToString()
    # causal=0 is lowered to plain ops (GQA rejects causal=0 with query_seqlens), and so is every
    # node under the plain_attention option
    fused = any(n.op_type == "GroupQueryAttention" for n in model.graph.node)
    assert fused == (bool(causal) and not (options or {}).get("plain_attention"))
    return model.SerializeToString()


@pytest.mark.parametrize(
    ("window", "causal", "plain"), [(0, 1, 0), (4, 1, 0), (0, 0, 0), (0, 1, 1), (4, 1, 1)]
)
def test_lowering_matches_reference_in_place(window: int, causal: int, plain: int) -> None:
    model = attention_model(window, causal, {"plain_attention": True} if plain else None)
    run_schedule(model, SCHEDULE, window, causal)


def run_in_place(sess: ort.InferenceSession, inputs: tuple, key: ort.OrtValue,
                 value: ort.OrtValue) -> np.ndarray:  # fmt: skip
    """One call with the caches bound as both past and present (updated in place): the output."""
    io = sess.io_binding()
    for name, arr in zip(("q", "k", "v", "past_lens", "query_lens"), inputs, strict=True):
        io.bind_cpu_input(name, arr)
    io.bind_ortvalue_input("past_key", key)
    io.bind_ortvalue_input("past_value", value)
    io.bind_output("out")
    io.bind_ortvalue_output("present_key", key)
    io.bind_ortvalue_output("present_value", value)
    sess.run_with_iobinding(io)
    return io.get_outputs()[0].numpy()


def run_schedule(model: bytes, schedule: list, window: int, causal: int, capacity: int = C,
                 past: np.ndarray | None = None) -> None:  # fmt: skip
    """Run the lowered model call after call on the same cache buffers (bound as input and
    output, in place) and check each call against the reference: the valid outputs, and the
    caches changed exactly at the new tokens' slots."""
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    key_cache = rng.standard_normal((B, HKV, capacity, D), dtype=np.float32)
    value_cache = rng.standard_normal((B, HKV, capacity, D), dtype=np.float32)
    ref_k, ref_v = key_cache.copy(), value_cache.copy()
    key_ov = ort.OrtValue.ortvalue_from_numpy(key_cache)
    value_ov = ort.OrtValue.ortvalue_from_numpy(value_cache)
    past = np.zeros(B, np.int32) if past is None else past
    for s_len, lens in schedule:
        query_lens = np.array(lens, np.int32)
        q = rng.standard_normal((B, s_len, HQ * D), dtype=np.float32)
        k = rng.standard_normal((B, s_len, HKV * D), dtype=np.float32)
        v = rng.standard_normal((B, s_len, HKV * D), dtype=np.float32)
        before = key_cache.copy()
        ref_out, ref_k, ref_v = attention.reference(
            q, k, v, ref_k, ref_v, past, query_lens,
            num_heads=HQ, kv_num_heads=HKV, window=window, causal=causal,
        )  # fmt: skip
        out = run_in_place(sess, (q, k, v, past, query_lens), key_ov, value_ov)
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

    with pytest.raises(ValueError, match="onnxruntime, tensorrt"):
        lower_model(ModelProto(), "tvm")


# -- TensorRT's native lowering, run through ONNX Runtime's own opset-23/24 ops ----------------
@pytest.mark.parametrize(("window", "causal"), [(0, 1), (4, 1), (0, 0)])
def test_tensorrt_lowering_matches_reference_in_place(window: int, causal: int) -> None:
    """The same schedule (ragged prefill, decode, chunks after a past, idle rows) through the
    TensorRT lowering: TensorScatter and Attention as ONNX Runtime's CPU provider computes
    them equal the op's reference, the caches updated in place at the new tokens only."""
    model = attention_model(window, causal, backend="tensorrt")
    run_schedule(model, SCHEDULE, window, causal)


def test_tensorrt_lowering_near_the_end_of_the_cache() -> None:
    """Rows whose window of S slots would pass the cache's end (a right-padded row after a
    long past, an idle full row) write at C - S, keeping what the cache held there."""
    model = attention_model(0, 1, backend="tensorrt")
    cap = 8  # S = 3: row 0 (past 6) writes 2 tokens at 6, 7; row 2 (past 7) is idle
    run_schedule(model, [(3, [2, 3, 0]), (1, [0, 1, 1])], 0, 1, capacity=cap,
                 past=np.array([6, 0, 7], np.int32))  # fmt: skip


def test_tensorrt_lowering_is_what_its_parser_takes() -> None:
    """Only ONNX's own ops (no com.microsoft, no edgeomni), opset 24; each cache output is the
    output of its TensorScatter (axis -2), the form TensorRT maps to its in-place KV update;
    Attention's Q, K, V and mask are 4-D, the mask a bool, no past_key or nonpad_kv_seqlen."""
    import onnx

    model = onnx.load_from_string(attention_model(0, 1, backend="tensorrt"))
    onnx.checker.check_model(model, full_check=True)
    assert {o.domain: o.version for o in model.opset_import}.get("", 0) >= 24
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    scatters = [n for n in model.graph.node if n.op_type == "TensorScatter"]
    assert sorted(n.output[0] for n in scatters) == ["present_key", "present_value"]
    assert all(onnx.helper.get_attribute_value(a) == -2 for n in scatters for a in n.attribute
               if a.name == "axis")  # fmt: skip
    (attn,) = [n for n in model.graph.node if n.op_type == "Attention"]
    assert len(attn.input) == 4 and attn.input[1:3] == ["present_key", "present_value"]
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    types = {v.name: v.type.tensor_type for v in (
        *inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}  # fmt: skip
    assert types[attn.input[3]].elem_type == onnx.TensorProto.BOOL
    for name in attn.input:
        assert len(types[name].shape.dim) == 4, name


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
        out = run_in_place(sess, (q, k, v, past, ql), ok, ov)
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


@pytest.mark.parametrize(("window", "causal"), [(0, 0), (3, 1)])
def test_tensorrt_lowering_of_a_scratch_cache(window: int, causal: int) -> None:
    """An encoder's or vocoder's cache is made in the graph (zeros of the call's length), not
    bound by the runtime: lowered for TensorRT it is updated by ScatterElements (TensorRT's KV
    update takes only a bound cache of static capacity), and the output equals the reference."""
    import onnx

    attention.register_onnx_schema()
    f, i32 = TensorProto.FLOAT, TensorProto.INT32
    vi = helper.make_tensor_value_info
    inputs = [vi("q", f, [None, None, HQ * D]), vi("k", f, [None, None, HKV * D]),
              vi("v", f, [None, None, HKV * D]), vi("query_lens", i32, [None])]  # fmt: skip
    consts = {"zero": np.array([0.0], np.float32), "heads": np.array([HKV], np.int64),
              "d": np.array([D], np.int64)}  # fmt: skip
    nodes = [
        helper.make_node("Shape", ["k"], ["b"], end=1),
        helper.make_node("Shape", ["k"], ["s"], start=1, end=2),
        helper.make_node("Concat", ["b", "heads", "s", "d"], ["shape"], axis=0),
        helper.make_node("Expand", ["zero", "shape"], ["scratch"]),
        helper.make_node("Sub", ["query_lens", "query_lens"], ["past_lens"]),
        helper.make_node(attention.OP_TYPE, ["q", "k", "v", "scratch", "scratch", "past_lens",
                                             "query_lens"], ["out", "pk", "pv"],
                         domain=attention.DOMAIN, num_heads=HQ, kv_num_heads=HKV,
                         window=window, causal=causal),  # fmt: skip
    ]
    inits = [onnx.numpy_helper.from_array(v, n) for n, v in consts.items()]
    graph = helper.make_graph(nodes, "scratch", inputs, [vi("out", f, [None, None, HQ * D])],
                              initializer=inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid(attention.DOMAIN, 1)])  # fmt: skip
    lower_model(model, "tensorrt")
    ops = [n.op_type for n in model.graph.node]
    assert "TensorScatter" not in ops and ops.count("ScatterElements") == 2
    rng = np.random.default_rng(3)
    s = 6
    q = rng.standard_normal((B, s, HQ * D), dtype=np.float32)
    k = rng.standard_normal((B, s, HKV * D), dtype=np.float32)
    v = rng.standard_normal((B, s, HKV * D), dtype=np.float32)
    lens = np.array([6, 2, 4], np.int32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (out,) = sess.run(None, {"q": q, "k": k, "v": v, "query_lens": lens})
    zeros = np.zeros((B, HKV, s, D), np.float32)
    ref, _, _ = attention.reference(q, k, v, zeros, zeros, np.zeros(B, np.int32), lens,
                                    num_heads=HQ, kv_num_heads=HKV, window=window, causal=causal)  # fmt: skip
    for b in range(B):
        np.testing.assert_allclose(out[b, : lens[b]], ref[b, : lens[b]], atol=2e-6)
