"""edgeomni::CachedAttention: causal, windowed or bidirectional attention over an in-place KV cache.

Defined once here; every decoder the exporter writes calls it once per layer.

Inputs (positional):
  0 ``q``          float [B, S, Hq*D]   rotary already applied (edgeomni::Rotary, plugins.rotary)
  1 ``k``          float [B, S, Hkv*D]  rotary already applied
  2 ``v``          float [B, S, Hkv*D]
  3 ``past_key``   float [B, Hkv, C, D] the cache; the op writes the new keys into it in place
  4 ``past_value`` float [B, Hkv, C, D]
  5 ``past_lens``  int32 [B]            tokens already in each row's cache
  6 ``query_lens`` int32 [B]            valid new tokens per row; rows are right-padded to S
Outputs:
  0 ``out``           float [B, S, Hq*D] (positions past a row's query_len are undefined)
  1 ``present_key``   the same buffer as ``past_key`` when bound in place
  2 ``present_value`` the same buffer as ``past_value``
Attributes: ``num_heads``, ``kv_num_heads``, ``scale`` (0 means 1/sqrt(D)), ``window`` (0 means
none; otherwise each query sees its last ``window`` keys, itself included), ``causal`` (1, the
default: each query sees the keys up to its own position; 0: every valid query of a row sees all
of the row's ``past_lens + query_lens`` keys, past and new, as an encoder needs; ``window`` must
then be 0).

Token ``i`` of row ``b`` sits at position ``past_lens[b] + i``: prefill, decode and chunked prefill
are one call with different lengths, and rows of a batch have their own lengths.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgeomni.plugins.schema import FLOATS, declare

DOMAIN = "edgeomni"
# not "Attention": ONNX has a standard op of that name, and onnx.reference (which onnxscript's
# optimizer imports) refuses two schemas that share a name across domains
OP_TYPE = "CachedAttention"
VERSION = 1
INPUTS = ("q", "k", "v", "past_key", "past_value", "past_lens", "query_lens")
OUTPUTS = ("out", "present_key", "present_value")
# graph inputs a lowering may add, which the runtime then feeds (runtime.engine.OrtBinding._lengths)
LENGTH_INPUTS = ("gqa_seqlens_k", "gqa_total_length")


# ---------------------------------------------------------------------------------------------
# numpy reference
# ---------------------------------------------------------------------------------------------
def reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    past_key: np.ndarray,
    past_value: np.ndarray,
    past_lens: np.ndarray,
    query_lens: np.ndarray,
    *,
    num_heads: int,
    kv_num_heads: int,
    scale: float = 0.0,
    window: int = 0,
    causal: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The op's meaning, spelled out row by row; returns (out, present_key, present_value)."""
    if not causal and window:
        raise ValueError("a sliding window needs causal attention (causal=0 takes window=0)")
    b_size, s_len, _ = q.shape
    head_dim = past_key.shape[-1]
    capacity = past_key.shape[2]
    scale = scale or 1.0 / math.sqrt(head_dim)
    group = num_heads // kv_num_heads
    present_key = past_key.copy()
    present_value = past_value.copy()
    out = np.zeros_like(q)
    qh = q.reshape(b_size, s_len, num_heads, head_dim)
    kh = k.reshape(b_size, s_len, kv_num_heads, head_dim)
    vh = v.reshape(b_size, s_len, kv_num_heads, head_dim)
    for b in range(b_size):
        past, new = int(past_lens[b]), int(query_lens[b])
        if past + new > capacity:
            raise ValueError(f"row {b}: {past} + {new} tokens exceed the cache capacity {capacity}")
        present_key[b, :, past : past + new] = kh[b, :new].transpose(1, 0, 2)
        present_value[b, :, past : past + new] = vh[b, :new].transpose(1, 0, 2)
        for i in range(new):
            pos = past + i
            lo = max(0, pos + 1 - window) if window else 0
            hi = pos + 1 if causal else past + new
            for h in range(num_heads):
                keys = present_key[b, h // group, lo:hi].astype(np.float64)
                vals = present_value[b, h // group, lo:hi].astype(np.float64)
                scores = keys @ qh[b, i, h].astype(np.float64) * scale
                p = np.exp(scores - scores.max())
                p /= p.sum()
                out[b, i, h * head_dim : (h + 1) * head_dim] = p @ vals
    return out, present_key, present_value


# ---------------------------------------------------------------------------------------------
# ONNX schema (so onnx and onnxscript accept the op) and torch custom op (what the exporter sees)
# ---------------------------------------------------------------------------------------------
_registered: dict[str, Any] = {}


def register_onnx_schema() -> None:
    """Declare edgeomni::CachedAttention to onnx once per process."""
    declare(
        _registered, (OP_TYPE, DOMAIN, VERSION),
        [(n, "T") for n in INPUTS[:5]] + [(n, "I") for n in INPUTS[5:]],
        [(n, "T") for n in OUTPUTS],
        [("T", FLOATS, "activations"), ("I", ["tensor(int32)"], "lengths")],
        [("num_heads", None, "query heads"), ("kv_num_heads", None, "key/value heads"),
         ("scale", 0.0, "softmax scale; 0: 1/sqrt(head_dim)"),
         ("window", 0, "sliding window in keys; 0: none"),
         ("causal", 1, "1: causal; 0: bidirectional")],
        __doc__,
    )  # fmt: skip


def torch_op() -> Any:
    """The torch custom op ``edgeomni::attention``; eager calls run a torch version of the
    reference so an exported module can still be checked against torch."""
    if "torch_op" in _registered:
        return _registered["torch_op"]
    import torch

    schema = (
        "(Tensor q, Tensor k, Tensor v, Tensor past_key, Tensor past_value, Tensor past_lens, "
        "Tensor query_lens, int num_heads, int kv_num_heads, float scale, int window, "
        "int causal=1) "
        "-> (Tensor, Tensor, Tensor)"
    )

    @torch.library.custom_op("edgeomni::attention", mutates_args=(), schema=schema)
    def attention(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        past_key: torch.Tensor,
        past_value: torch.Tensor,
        past_lens: torch.Tensor,
        query_lens: torch.Tensor,
        num_heads: int,
        kv_num_heads: int,
        scale: float,
        window: int,
        causal: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, pk, pv = reference(
            q.detach().float().numpy(),
            k.detach().float().numpy(),
            v.detach().float().numpy(),
            past_key.detach().float().numpy(),
            past_value.detach().float().numpy(),
            past_lens.numpy(),
            query_lens.numpy(),
            num_heads=num_heads,
            kv_num_heads=kv_num_heads,
            scale=scale,
            window=window,
            causal=causal,
        )
        return (
            torch.from_numpy(out).to(q.dtype),
            torch.from_numpy(pk).to(q.dtype),
            torch.from_numpy(pv).to(q.dtype),
        )

    @attention.register_fake
    def _(q, k, v, past_key, past_value, *lengths_and_attributes, **attributes):  # noqa: ANN001
        return torch.empty_like(q), torch.empty_like(past_key), torch.empty_like(past_value)

    _registered["torch_op"] = attention
    return attention


def onnx_translation() -> dict[Any, Any]:
    """custom_translation_table entry for torch.onnx.export(dynamo=True)."""
    import onnxscript
    import torch

    register_onnx_schema()
    torch_op()
    opset = onnxscript.values.Opset(DOMAIN, VERSION)

    def translate(
        q,
        k,
        v,
        past_key,
        past_value,
        past_lens,
        query_lens,
        num_heads,
        kv_num_heads,
        scale,
        window,
        causal=1,
    ):  # noqa: ANN001
        return getattr(opset, OP_TYPE)(
            q,
            k,
            v,
            past_key,
            past_value,
            past_lens,
            query_lens,
            num_heads=num_heads,
            kv_num_heads=kv_num_heads,
            scale=scale,
            window=window,
            causal=causal,
            _outputs=3,
        )

    return {torch.ops.edgeomni.attention.default: translate}


# ---------------------------------------------------------------------------------------------
# Lowering: ONNX Runtime
# ---------------------------------------------------------------------------------------------
def lower_onnxruntime(node: Any, ctx: Any) -> list[Any]:
    """Rewrite into com.microsoft::GroupQueryAttention.

    past and present stay one buffer (the runtime binds the same OrtValue to both), so the cache
    is updated in place. GQA wants ``seqlens_k`` = total length - 1 and the batch's maximum total
    length; both are computed once per graph from past_lens and query_lens.

    Before ONNX Runtime 1.32 (no ``query_seqlens``; ctx.options["gqa_query_seqlens"] False) the
    lowered op serves the calls the runtime makes: prefill from an empty cache (rows right-padded)
    and one-token decode. An idle row (query length 0) then rewrites its own last cache slot,
    which is harmless only because idle rows are finished ones.
    """
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if not int(attrs.get("causal", 1)) or ctx.options.get("plain_attention"):
        return _lower_plain(node, ctx, attrs)
    q, k, v, pk, pv, past_lens, query_lens = node.input
    key = ("gqa_lens", past_lens, query_lens)
    if key not in ctx.cache and ctx.options.get("lengths_as_inputs"):
        # the host computes GQA's length inputs (seqlens_k = max(past + query - 1, 0), the
        # batch's total length); on the CUDA provider, lengths computed in the graph gave wrong
        # float16 prefill results, while the same values fed as inputs are exact (measured)
        ctx.add_input(LENGTH_INPUTS[0], "int32", ["batch"])
        ctx.add_input(LENGTH_INPUTS[1], "int32", [])
        ctx.cache[key] = LENGTH_INPUTS
    if key not in ctx.cache:
        total = ctx.fresh("attn_total_lens")
        seqlens_k = ctx.fresh("attn_seqlens_k")
        max_total = ctx.fresh("attn_max_total")
        one = ctx.constant("attn_one_i32", np.array(1, dtype=np.int32))
        zero = ctx.constant("attn_zero_i32", np.array(0, dtype=np.int32))
        last = ctx.fresh("attn_last_index")
        ctx.emit(helper.make_node("Add", [past_lens, query_lens], [total]))
        ctx.emit(helper.make_node("Sub", [total, one], [last]))
        # a row with nothing cached and nothing new (an idle row) would be -1, which GQA rejects;
        # with query_seqlens 0 it writes nothing either way
        ctx.emit(helper.make_node("Max", [last, zero], [seqlens_k]))
        ctx.emit(helper.make_node("ReduceMax", [total], [max_total], keepdims=0))
        ctx.cache[key] = (seqlens_k, max_total)
    seqlens_k, max_total = ctx.cache[key]
    gqa_inputs = [q, k, v, pk, pv, seqlens_k, max_total]
    if ctx.options.get("gqa_query_seqlens", True):  # ONNX Runtime 1.32 and later
        gqa_inputs += [""] * 9 + [query_lens]
    kwargs: dict[str, Any] = {
        "num_heads": int(attrs["num_heads"]),
        "kv_num_heads": int(attrs["kv_num_heads"]),
        "do_rotary": 0,
    }
    if attrs.get("scale"):
        kwargs["scale"] = float(attrs["scale"])
    if attrs.get("window"):
        kwargs["local_window_size"] = int(attrs["window"])
    return [
        helper.make_node(
            "GroupQueryAttention",
            gqa_inputs,
            list(node.output),
            name=node.name or None,
            domain="com.microsoft",
            **kwargs,
        )
    ]


def _lower_plain(node: Any, ctx: Any, attrs: dict[str, Any]) -> list[Any]:
    """The op as plain ONNX ops: for causal=0, which GroupQueryAttention cannot do in general,
    and, with the ``plain_attention`` option, for engines whose float type has no
    GroupQueryAttention kernel on the target provider (float32 on CUDA: it falls back to the CPU
    with copies around every node).

    ORT 1.32's GQA has ``causal=0`` but rejects it together with ``query_seqlens``, and without
    that input it is exact only when every past length is 0 or every row adds one token: a
    right-padded chunk after a past comes out wrong with no error (measured). So the cache update
    gathers each row's new keys to their positions and a Where keeps every other cache row (a
    buffer bound in place stays valid); attention is MatMul / Softmax over the whole cache with
    keys at or past ``past_lens + query_lens`` masked out (and, when causal, keys after the query's
    position or ``window`` or more before it). Query heads are grouped as [B, Hkv, group, S, D],
    so kv heads are never copied.
    """
    from onnx import TensorProto, helper

    causal, window = int(attrs.get("causal", 1)), int(attrs.get("window", 0))
    if window and not causal:
        raise ValueError(f"{node.name!r}: a sliding window needs causal=1")
    hkv = int(attrs["kv_num_heads"])
    group = int(attrs["num_heads"]) // hkv
    q, k, v, pk, pv, past_lens, query_lens = node.input
    out_name, present_key, present_value = node.output
    nodes: list[Any] = []

    def op(op_type: str, *inputs: str, out: str | None = None, **kw: Any) -> str:
        name = out or ctx.fresh("attn_nc_" + op_type.lower())
        nodes.append(helper.make_node(op_type, list(inputs), [name], **kw))
        return name

    def ints(*values: int) -> str:
        stem = "attn_nc_i64_" + "_".join(str(x).replace("-", "m") for x in values)
        return ctx.constant(stem, np.array(values, np.int64))

    def scalar(value: int) -> str:
        return ctx.constant(f"attn_nc_scalar_{value}", np.array(value, np.int64))

    # per row b and cache slot c: is c a valid key (< past + new), is it new, which token it is
    past = op("Cast", past_lens, to=TensorProto.INT64)
    total = op("Add", past, op("Cast", query_lens, to=TensorProto.INT64))
    capacity = op("Squeeze", op("Shape", pk, start=2, end=3))
    slots = op("Range", scalar(0), capacity, scalar(1))  # [C]
    rel = op("Sub", slots, op("Unsqueeze", past, ints(1)))  # [B, C]: slot - past_b
    valid_key = op("Less", slots, op("Unsqueeze", total, ints(1)))  # [B, C]
    is_new = op("And", valid_key, op("GreaterOrEqual", rel, scalar(0)))
    # the new token a slot takes (0 where it takes none: any index will do, the Where below
    # keeps the cache there); a Where, not a Clip to the call's width, so that no value derived
    # from a shape on the host feeds the device's computation (a CUDA graph cannot capture that)
    token = op("Unsqueeze", op("Where", is_new, rel, scalar(0)), ints(2))  # [B, C, 1]
    write = op("Unsqueeze", is_new, ints(1, 3))  # [B, 1, C, 1]

    def update(x: str, cache: str, result: str) -> str:
        per_head = op("Reshape", x, ints(0, 0, hkv, -1))  # [B, S, Hkv, D]
        moved = op("GatherND", per_head, token, batch_dims=1)  # [B, C, Hkv, D]
        moved = op("Transpose", moved, perm=[0, 2, 1, 3])
        return op("Where", write, moved, cache, out=result)

    keys = update(k, pk, present_key)
    values = update(v, pv, present_value)

    if attrs.get("scale"):
        bits = int(np.float32(attrs["scale"]).view(np.uint32))
        value = ctx.constant(f"attn_nc_scale_{bits:08x}", np.float32(attrs["scale"]))
        scale = op("CastLike", value, q)
    else:  # 1/sqrt(head_dim), head_dim read from the cache's shape
        head_dim = op("CastLike", op("Shape", pk, start=3, end=4), q)
        scale = op("Reciprocal", op("Sqrt", head_dim))
    q5 = op("Reshape", q, ints(0, 0, hkv, group, -1))  # [B, S, Hkv, g, D]
    q5 = op("Mul", op("Transpose", q5, perm=[0, 2, 3, 1, 4]), scale)  # [B, Hkv, g, S, D]
    k_t = op("Transpose", op("Unsqueeze", keys, ints(2)), perm=[0, 1, 2, 4, 3])  # [B,Hkv,1,D,C]
    scores = op("MatMul", q5, k_t)  # [B, Hkv, g, S, C]
    lowest = op("CastLike", ctx.constant("attn_nc_lowest", np.float32(-1e30)), q)
    if causal:  # query s of row b sits at past_b + s: it sees keys up to there, within the window
        steps = op("Range", scalar(0), op("Squeeze", op("Shape", q, start=1, end=2)), scalar(1))
        position = op("Unsqueeze", op("Add", op("Unsqueeze", past, ints(1)), steps), ints(2))
        seen = op("And", op("Unsqueeze", valid_key, ints(1)), op("LessOrEqual", slots, position))
        if window:
            seen = op("And", seen, op("Greater", slots, op("Sub", position, scalar(window))))
        mask = op("Unsqueeze", seen, ints(1, 2))  # [B, 1, 1, S, C]
    else:
        mask = op("Unsqueeze", valid_key, ints(1, 2, 3))  # [B, 1, 1, 1, C]
    masked = op("Where", mask, scores, lowest)
    probs = op("Softmax", masked, axis=-1)
    heads = op("MatMul", probs, op("Unsqueeze", values, ints(2)))  # [B, Hkv, g, S, D]
    heads = op("Transpose", heads, perm=[0, 3, 1, 2, 4])  # [B, S, Hkv, g, D]
    op("Reshape", heads, ints(0, 0, -1), out=out_name)
    return nodes


LOWERINGS = {"onnxruntime": lower_onnxruntime}


# ---------------------------------------------------------------------------------------------
# Lowering: TensorRT's native attention (TensorRT >= 10.15, TensorRT-RTX 1.7)
# ---------------------------------------------------------------------------------------------
TRT_OPSET = 24  # TensorScatter; Attention is 23


def lower_tensorrt(node: Any, ctx: Any) -> list[Any]:
    """Rewrite into ONNX's own ops as TensorRT's parser imports them natively: the KV update as
    ``TensorScatter`` (opset 24, axis -2: TensorRT's IKVCacheUpdateLayer, the cache updated in
    place when its input and output share a buffer) and attention as ``Attention`` (opset 23,
    4-D Q [B, Hq, S, D] over the whole cache [B, Hkv, C, D], GQA from the shapes) with a bool
    mask [B, 1, S, C] made in the graph from the per-row lengths: the parser takes neither
    ``past_key`` nor ``nonpad_kv_seqlen``, and TensorRT 10's causal flag anchors its diagonal
    at the top left, wrong for a query after a past (shared/notes/tensorrt.md).

    A cache made in the graph rather than bound by the runtime (the encoders' and vocoders'
    scratch) is updated with ``ScatterElements`` instead: TensorRT's KV update needs a cache
    input of static capacity, and such a cache has neither.

    TensorScatter writes all S positions of every row, so each row writes a window of S slots
    at ``w = min(past, C - S)``: its new tokens where they go and, elsewhere in the window, what
    the cache held there (a right-padded row, an idle one, a row near the end of the cache). So
    every slot but a row's new tokens keeps its value, as the op defines. A query that sees no
    key (an idle row's padding) is given slot 0, which holds a finite value, so that no NaN is
    made (its output is undefined by the op; a NaN would spread through a masked key's zero
    weight).
    """
    from onnx import TensorProto, helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    causal, window = int(attrs.get("causal", 1)), int(attrs.get("window", 0))
    if window and not causal:
        raise ValueError(f"{node.name!r}: a sliding window needs causal=1")
    hq, hkv = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
    q, k, v, pk, pv, past_lens, query_lens = node.input
    out_name, present_key, present_value = node.output
    ctx.require_opset("", TRT_OPSET)
    nodes: list[Any] = []

    def op(op_type: str, *inputs: str, out: str | None = None, into: list | None = None,
           **kw: Any) -> str:  # fmt: skip
        name = out or ctx.fresh("attn_trt_" + op_type.lower())
        (nodes if into is None else into).append(
            helper.make_node(op_type, list(inputs), [name], **kw)
        )
        return name

    def ints(*values: int) -> str:
        stem = "attn_trt_i64_" + "_".join(str(x).replace("-", "m") for x in values)
        return ctx.constant(stem, np.array(values, np.int64))

    # once per graph and kind of layer: every layer reads the same lengths and shapes
    shared = ("trt_lens", past_lens, query_lens, causal, window)
    if shared not in ctx.cache:
        pre: list[Any] = []
        past = op("Cast", past_lens, to=TensorProto.INT64, into=pre)
        new_len = op("Cast", query_lens, to=TensorProto.INT64, into=pre)
        total = op("Add", past, new_len, into=pre)
        width = op("Squeeze", op("Shape", q, start=1, end=2, into=pre), into=pre)  # S
        capacity = op("Squeeze", op("Shape", pk, start=2, end=3, into=pre), into=pre)  # C
        zero, one = ints(0), ints(1)  # [1]: axes
        s0 = ctx.constant("attn_trt_scalar_0", np.array(0, np.int64))
        s1 = ctx.constant("attn_trt_scalar_1", np.array(1, np.int64))
        last_start = op("Sub", capacity, width, into=pre)
        write = op("Max", op("Min", past, last_start, into=pre), s0, into=pre)  # [B]
        steps = op("Range", s0, width, s1, into=pre)  # [S]
        window_slot = op("Add", op("Unsqueeze", write, one, into=pre), steps, into=pre)  # [B, S]
        rel = op("Sub", window_slot, op("Unsqueeze", past, one, into=pre), into=pre)
        is_new = op("And", op("GreaterOrEqual", rel, s0, into=pre),
                    op("Less", rel, op("Unsqueeze", new_len, one, into=pre), into=pre),
                    into=pre)  # fmt: skip
        token = op("Where", is_new, rel, s0, into=pre)  # [B, S]
        slots = op("Range", s0, capacity, s1, into=pre)  # [C]
        valid = op("Less", slots, op("Unsqueeze", total, one, into=pre), into=pre)  # [B, C]
        if causal:  # query s of row b sits at past_b + s
            position = op("Unsqueeze", op("Add", op("Unsqueeze", past, one, into=pre), steps,
                                          into=pre), ints(2), into=pre)  # fmt: skip  [B, S, 1]
            seen = op("And", op("Unsqueeze", valid, one, into=pre),
                      op("LessOrEqual", slots, position, into=pre), into=pre)  # fmt: skip
            if window:
                near = op("Greater", slots, op("Sub", position, ints(window), into=pre), into=pre)
                seen = op("And", seen, near, into=pre)
        else:
            seen = op("Expand", op("Unsqueeze", valid, one, into=pre),
                      op("Concat", op("Shape", q, end=1, into=pre),
                         op("Unsqueeze", width, zero, into=pre),
                         op("Unsqueeze", capacity, zero, into=pre), axis=0, into=pre),
                      into=pre)  # fmt: skip  [B, S, C]
        seen_any = op("ReduceMax", op("Cast", seen, to=TensorProto.INT32, into=pre),
                      ints(-1), keepdims=1, into=pre)  # fmt: skip
        blind = op("Equal", seen_any, ctx.constant("attn_trt_zero_i32", np.array(0, np.int32)),
                   into=pre)  # fmt: skip
        first = op("Equal", slots, s0, into=pre)
        seen = op("Or", seen, op("And", blind, first, into=pre), into=pre)
        mask = op("Unsqueeze", seen, one, into=pre)  # [B, 1, S, C]
        for n in pre:
            ctx.emit(n)
        ctx.cache[shared] = (write, is_new, token, window_slot, mask)
    write, is_new, token, window_slot, mask = ctx.cache[shared]

    def update(x: str, cache: str, result: str) -> str:
        heads = op("Transpose", op("Reshape", x, ints(0, 0, hkv, -1)), perm=[0, 2, 1, 3])
        shape = op("Shape", heads)  # [B, Hkv, S, D]
        take = op("Expand", op("Unsqueeze", token, ints(1, 3)), shape)
        keep = op("Expand", op("Unsqueeze", window_slot, ints(1, 3)), shape)
        fresh = op("GatherElements", heads, take, axis=2)
        held = op("GatherElements", cache, keep, axis=2)
        rows = op("Where", op("Unsqueeze", is_new, ints(1, 3)), fresh, held)  # [B, Hkv, S, D]
        if cache in ctx.graph_inputs:
            return op("TensorScatter", cache, rows, write, axis=-2, out=result)
        # a cache made in the graph (an encoder's or vocoder's scratch, no buffer the runtime
        # keeps): nothing to update in place, and TensorRT's KV update takes only a cache of
        # static capacity; scattering the same window with a plain op gives the same tensor
        return op("ScatterElements", cache, keep, rows, axis=2, out=result)

    keys = update(k, pk, present_key)
    values = update(v, pv, present_value)
    query = op("Transpose", op("Reshape", q, ints(0, 0, hq, -1)), perm=[0, 2, 1, 3])
    kwargs: dict[str, Any] = {"is_causal": 0}
    if attrs.get("scale"):
        kwargs["scale"] = float(attrs["scale"])
    heads = op("Attention", query, keys, values, mask, **kwargs)  # [B, Hq, S, D]
    op("Reshape", op("Transpose", heads, perm=[0, 2, 1, 3]), ints(0, 0, -1), out=out_name)
    return nodes


LOWERINGS["tensorrt"] = lower_tensorrt
