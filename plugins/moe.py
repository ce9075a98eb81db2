"""edgeomni::MoE: a routed SwiGLU mixture-of-experts layer (Qwen3-MoE style), defined once.

The exporter writes one node per sparse MoE block; each backend rewrites it into its own fused
kernel, so no exported graph gathers expert weights per token (that route's memory grows with
prompt length x experts).

Inputs (positional):
  0 ``x``             float [T, H]      tokens; callers flatten batch and sequence
  1 ``router_logits`` float [T, E]      raw router logits (the op applies the softmax)
  2 ``fc1``           float [E, 2I, H]  gate and up rows INTERLEAVED: g0, u0, g1, u1, ...
  3 ``fc2``           float [E, H, I]   down projections
Output:
  0 ``y``             float [T, H]      sum over the chosen experts e of w_e * fc2_e(silu(g) * u)
Attributes: ``top_k`` (experts per token), ``normalize_routing`` (1: the k chosen softmax weights
are renormalised to sum to 1, as the Qwen3-Omni thinker does; 0: they are used as they are, as the
talker does).

Routing is softmax over all E experts, then top-k of those probabilities.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeomni.plugins.schema import FLOATS, declare

DOMAIN = "edgeomni"
OP_TYPE = "MoE"
VERSION = 1
INPUTS = ("x", "router_logits", "fc1", "fc2")
OUTPUTS = ("y",)


# ---------------------------------------------------------------------------------------------
# numpy reference
# ---------------------------------------------------------------------------------------------
def routing(
    router_logits: np.ndarray, *, top_k: int, normalize_routing: int
) -> tuple[np.ndarray, np.ndarray]:
    """(expert ids [T, k], weights [T, k]) in float64: softmax over all experts, then top-k."""
    logits = router_logits.astype(np.float64)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(probs, ids, axis=-1)
    if normalize_routing:
        weights /= weights.sum(axis=-1, keepdims=True)
    return ids, weights


def reference(
    x: np.ndarray,
    router_logits: np.ndarray,
    fc1: np.ndarray,
    fc2: np.ndarray,
    *,
    top_k: int,
    normalize_routing: int,
) -> np.ndarray:
    """The op's meaning, expert by expert in float64; returns y [T, H] in x's dtype."""
    ids, weights = routing(router_logits, top_k=top_k, normalize_routing=normalize_routing)
    xd = x.astype(np.float64)
    y = np.zeros_like(xd)
    for e in range(fc1.shape[0]):
        tok, slot = np.nonzero(ids == e)
        if tok.size == 0:
            continue
        h = xd[tok] @ fc1[e].astype(np.float64).T  # [n, 2I], columns g0, u0, g1, u1, ...
        gate, up = h[:, 0::2], h[:, 1::2]
        act = gate / (1.0 + np.exp(-gate)) * up
        np.add.at(y, tok, (act @ fc2[e].astype(np.float64).T) * weights[tok, slot, None])
    return y.astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# ONNX schema (so onnx and onnxscript accept the op) and torch custom op (what the exporter sees)
# ---------------------------------------------------------------------------------------------
_registered: dict[str, Any] = {}


def register_onnx_schema() -> None:
    """Declare edgeomni::MoE to onnx once per process."""
    declare(
        _registered, (OP_TYPE, DOMAIN, VERSION), [(n, "T") for n in INPUTS],
        [(n, "T") for n in OUTPUTS], [("T", FLOATS, "activations, weights")],
        [("top_k", None, "experts per token"),
         ("normalize_routing", None,
          "1: renormalise the top-k weights to sum to 1; 0: keep the softmax values")],
        __doc__,
    )  # fmt: skip


def torch_op() -> Any:
    """The torch custom op ``edgeomni::moe``. Eager calls compute the op in torch expert by expert
    on the routed tokens only, so memory stays O(T*k + T*I), never T x E x weights."""
    if "torch_op" in _registered:
        return _registered["torch_op"]
    import torch

    schema = (
        "(Tensor x, Tensor router_logits, Tensor fc1, Tensor fc2, int top_k, "
        "int normalize_routing) -> Tensor"
    )

    @torch.library.custom_op("edgeomni::moe", mutates_args=(), schema=schema)
    def moe(
        x: torch.Tensor,
        router_logits: torch.Tensor,
        fc1: torch.Tensor,
        fc2: torch.Tensor,
        top_k: int,
        normalize_routing: int,
    ) -> torch.Tensor:
        probs = torch.softmax(router_logits.float(), dim=-1)
        weights, ids = torch.topk(probs, top_k, dim=-1)
        if normalize_routing:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        linear = torch.nn.functional.linear
        y = torch.zeros_like(x)
        for e in torch.unique(ids).tolist():
            tok, slot = torch.where(ids == e)
            h = linear(x.index_select(0, tok), fc1[e])  # columns g0, u0, g1, u1, ...
            act = torch.nn.functional.silu(h[:, 0::2]) * h[:, 1::2]
            y.index_add_(0, tok, linear(act, fc2[e]) * weights[tok, slot, None])
        return y

    @moe.register_fake
    def _(x, router_logits, fc1, fc2, top_k, normalize_routing):  # noqa: ANN001
        return torch.empty_like(x)

    _registered["torch_op"] = moe
    return moe


def onnx_translation() -> dict[Any, Any]:
    """custom_translation_table entry for torch.onnx.export(dynamo=True); merge it with the
    other plugins' tables (``{**attention.onnx_translation(), **moe.onnx_translation()}``)."""
    import onnxscript
    import torch

    register_onnx_schema()
    torch_op()
    opset = onnxscript.values.Opset(DOMAIN, VERSION)

    def translate(x, router_logits, fc1, fc2, top_k, normalize_routing):  # noqa: ANN001
        return opset.MoE(
            x, router_logits, fc1, fc2, top_k=top_k, normalize_routing=normalize_routing
        )

    return {torch.ops.edgeomni.moe.default: translate}


# ---------------------------------------------------------------------------------------------
# Lowering: ONNX Runtime
# ---------------------------------------------------------------------------------------------
def lower_onnxruntime(node: Any, ctx: Any) -> list[Any]:
    """Rewrite into com.microsoft::MoE(x, router_logits, fc1, "", fc2).

    On CPU (ORT 1.32) interleaved SwiGLU (``swiglu_fusion=1``) is the only accepted fc1 layout,
    which is why the op's fc1 is interleaved.
    """
    if len(node.input) != len(INPUTS):
        raise ValueError(f"{DOMAIN}::{OP_TYPE} node {node.name!r} has {len(node.input)} inputs")
    x, router_logits, fc1, fc2 = node.input
    return lower_contrib(node, ctx, "MoE", [x, router_logits, fc1, "", fc2])


def lower_contrib(node: Any, ctx: Any, op_type: str, inputs: list[str], **extra: Any) -> list[Any]:
    """One com.microsoft MoE-family node (MoE, or QMoE for plugins/quant_moe.py) computing
    ``node``'s routing: SwiGLU with interleaved gate/up rows, softmax top-``top_k`` of input 1.

    alpha 1 and beta 0 make the activation silu(g) * u; they are the defaults but are written
    out so a changed default cannot bite. ``extra``: the op's own attributes.
    """
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    router_logits = node.input[1]
    k = int(attrs["top_k"])
    moe_out = node.output[0] if attrs["normalize_routing"] else ctx.fresh("moe_normalized")
    nodes = [
        helper.make_node(
            op_type,
            inputs,
            [moe_out],
            name=node.name or None,
            domain="com.microsoft",
            k=k,
            activation_type="swiglu",
            swiglu_fusion=1,
            activation_alpha=1.0,
            activation_beta=0.0,
            normalize_routing_weights=1,
            **extra,
        )
    ]
    if attrs["normalize_routing"]:
        return nodes
    # Unnormalised weights (norm_topk_prob false: transformers' talker default) are the
    # normalised ones times the chosen experts' softmax mass S, so the op always normalises and
    # its output is scaled by S: with normalize_routing_weights=0 the CUDA provider's MoE gave a
    # tiny talker's logits off by half their range while the CPU provider's matched, and the CPU
    # provider's QMoE ignores the 0 (it renormalises anyway: tests/test_quant_moe.py).
    probs, top, mass = (ctx.fresh(f"moe_{n}") for n in ("probs", "top", "mass"))
    k_name = ctx.constant(f"moe_k{k}", np.array([k], np.int64))
    axis = ctx.constant("moe_axis_last", np.array([-1], np.int64))
    return nodes + [
        helper.make_node("Softmax", [router_logits], [probs], axis=-1),
        helper.make_node("TopK", [probs, k_name], [top, ctx.fresh("moe_top_ids")], axis=-1),
        helper.make_node("ReduceSum", [top, axis], [mass], keepdims=1),
        helper.make_node("Mul", [moe_out, mass], list(node.output)),
    ]


def lower_tensorrt(node: Any, ctx: Any) -> list[Any]:
    """Plain ONNX ops that TensorRT 10's parser takes: every expert computed for every token
    (batched MatMuls over the expert axis) and summed with a dense [T, E] weight matrix that is
    zero outside each token's top-k. Exact, and E/k times the routed work: right for small
    models and as a reference; a real MoE model needs TensorRT 11's TRT_MoE or a plugin (not
    written yet)."""
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if len(node.input) != len(INPUTS):
        raise ValueError(f"{DOMAIN}::{OP_TYPE} node {node.name!r} has {len(node.input)} inputs")
    x, router_logits, fc1, fc2 = node.input
    k = int(attrs["top_k"])
    nodes: list[Any] = []

    def op(op_type: str, *inputs: str, out: str | None = None, **kw: Any) -> str:
        name = out or ctx.fresh("moe_trt_" + op_type.lower())
        nodes.append(helper.make_node(op_type, list(inputs), [name], **kw))
        return name

    def ints(*values: int) -> str:
        stem = "moe_trt_i64_" + "_".join(str(v).replace("-", "m") for v in values)
        return ctx.constant(stem, np.array(values, np.int64))

    # every expert on every token: [E, T, 2I], gate and up interleaved along the last axis
    hidden = op("MatMul", op("Unsqueeze", x, ints(0)), op("Transpose", fc1, perm=[0, 2, 1]))
    big = ctx.constant("moe_trt_i64_big", np.array([2**62], np.int64))
    gate = op("Slice", hidden, ints(0), big, ints(-1), ints(2))
    up = op("Slice", hidden, ints(1), big, ints(-1), ints(2))
    act = op("Mul", op("Mul", gate, op("Sigmoid", gate)), up)  # [E, T, I]
    experts = op("MatMul", act, op("Transpose", fc2, perm=[0, 2, 1]))  # [E, T, H]
    # routing: softmax over all experts, top-k, (re)normalised, scattered into [T, E]
    probs = op("Softmax", router_logits, axis=-1)
    top = op("TopK", probs, ints(k), axis=-1)
    ids = ctx.fresh("moe_trt_ids")
    nodes[-1].output.append(ids)
    if attrs["normalize_routing"]:
        top = op("Div", top, op("ReduceSum", top, ints(-1), keepdims=1))
    zeros = op("Mul", probs, op("CastLike", ctx.constant("moe_trt_zero", np.float32(0)), probs))
    weights = op("ScatterElements", zeros, ids, top, axis=1)  # [T, E]
    scaled = op("Mul", experts, op("Unsqueeze", op("Transpose", weights, perm=[1, 0]), ints(2)))
    op("ReduceSum", scaled, ints(0), keepdims=0, out=node.output[0])
    return nodes


LOWERINGS = {"onnxruntime": lower_onnxruntime, "tensorrt": lower_tensorrt}
