"""The Gated DeltaNet token mixer's two stateful ops (Qwen3.5's linear-attention layers).

Both carry a per-row state between calls, the way CachedAttention carries its KV cache, and both
take ``query_lens``: rows are right-padded to S, and a pad token never enters a state, so one call
serves prefill, decode and idle rows (query_lens 0: the state comes back bit-identical).

edgeomni::CausalConvState
  0 ``x``          float [B, S, C]     channels last (what the projection gives)
  1 ``weight``     float [C, K]        depthwise kernel (the checkpoint's conv1d.weight [C, 1, K])
  2 ``past_state`` float [B, C, K-1]   the K-1 inputs before this call's first token
  3 ``query_lens`` int32 [B]
  Outputs: ``y`` [B, S, C] = act(depthwise causal conv over concat(past_state, x) in time);
  ``present_state`` [B, C, K-1] = columns [q, q+K-1) of concat(past_state, x^T), q = query_lens[b]:
  the K-1 inputs ending at the row's last valid token.
  Attributes: ``kernel_size`` (K; the backends need it statically), ``activation`` ("silu" or
  "none"). transformers' causal_conv1d_update / causal_conv1d_fn with the cached state.

edgeomni::GatedDeltaRule
  0 ``q`` [B, S, Hk*dk]  1 ``k`` [B, S, Hk*dk]  2 ``v`` [B, S, Hv*dv]
  3 ``g`` [B, S, Hv]     log-space decay (-exp(A_log) * softplus(a + dt_bias))
  4 ``beta`` [B, S, Hv]  update rate (already a sigmoid)
  5 ``past_state`` float32 [B, Hv, dv, dk]  V-major, as ONNX Runtime's GatedDeltaNet
  6 ``query_lens`` int32 [B]
  Outputs: ``o`` [B, S, Hv*dv], ``present_state`` float32 [B, Hv, dv, dk]. Per value head, over
  t < query_lens[b] only:  S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,
  o_t = scale * S_t^T q_t  (S as [dk, dv]; stored transposed). Pad outputs are finite, undefined.
  Attributes: ``num_k_heads``, ``num_v_heads`` (a multiple: each q/k head serves Hv/Hk
  consecutive value heads, transformers' repeat_interleave), ``qk_l2norm`` (1: q and k are
  L2-normalised per head first, x * rsqrt(sum(x^2) + 1e-6), transformers' l2norm), ``scale``
  (0: 1/sqrt(dk)).

Lowerings (ONNX Runtime). Kernels in 1.32: the CPU provider has GatedDeltaNet,
CausalConvWithState and LinearAttention (get_all_opkernel_def); GatedDeltaNet's schema names CPU,
CUDA and WebGPU kernels, and CausalConvWithState's has CUDA-only attributes, so it has a CUDA
kernel too. Only the CPU provider and float32 are tested here.
- CausalConvState: com.microsoft::CausalConvWithState (channels_last=1) for ``y``; its own
  present_state is the state after the last of all S positions, padding included, so the
  per-row state is a GatherND over concat(past, x) instead (plain ops).
- GatedDeltaRule: com.microsoft::GatedDeltaNet in its rank-4 [B, S, H, D] spelling with decay and
  beta set to 0 at pad positions (exp(0) = 1, beta 0: an exact identity update). Its own
  ``qk_l2_norm=1`` does not use transformers' eps (measured: outputs off by 2e-2 for vectors of
  norm ~1e-3), so q and k are normalised by plain ops before it and the attribute stays 0.
Both are safe bound in place (the runtime binds past and present state to one buffer): the
past state is read by one node (a Transpose, or GatedDeltaNet itself, which reads the whole
state before writing), and every write of the present depends on it.
Lowerings (TensorRT): plain ONNX only, run by ONNX Runtime in the tests: the conv as K shifted
multiply-adds in the channels-last layout, the recurrence as a Loop over S of MatMuls on a
float32 state.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgeomni.plugins.attention import DOMAIN
from edgeomni.plugins.schema import FLOATS, declare

CONV_OP_TYPE = "CausalConvState"
RULE_OP_TYPE = "GatedDeltaRule"
VERSION = 1
CONV_INPUTS = ("x", "weight", "past_state", "query_lens")
CONV_OUTPUTS = ("y", "present_state")
RULE_INPUTS = ("q", "k", "v", "g", "beta", "past_state", "query_lens")
RULE_OUTPUTS = ("o", "present_state")
L2_EPS = 1e-6  # transformers' l2norm (the FLA library's)


# ---------------------------------------------------------------------------------------------
# numpy references
# ---------------------------------------------------------------------------------------------
def conv_reference(
    x: np.ndarray,
    weight: np.ndarray,
    past_state: np.ndarray,
    query_lens: np.ndarray,
    *,
    kernel_size: int,
    activation: str = "silu",
) -> tuple[np.ndarray, np.ndarray]:
    """CausalConvState in numpy (float64 inside): (y, present_state)."""
    b, s, _ = x.shape
    if weight.shape[1] != kernel_size or past_state.shape[2] != kernel_size - 1:
        raise ValueError(f"weight {weight.shape} / state {past_state.shape} vs K={kernel_size}")
    seq = np.concatenate([past_state, x.transpose(0, 2, 1).astype(past_state.dtype)], axis=2)
    wide = seq.astype(np.float64)
    y = sum(wide[:, :, j : j + s] * weight[None, :, j, None] for j in range(kernel_size))
    if activation == "silu":
        y = y / (1.0 + np.exp(-y))
    elif activation != "none":
        raise ValueError(f"activation {activation!r}: silu or none")
    present = past_state.copy()
    for row in range(b):
        q = int(query_lens[row])
        if not 0 <= q <= s:
            raise ValueError(f"row {row}: query_lens {q} outside 0..{s}")
        present[row] = seq[row, :, q : q + kernel_size - 1]
    return y.transpose(0, 2, 1).astype(x.dtype), present


def l2norm(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + L2_EPS)


def rule_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    past_state: np.ndarray,
    query_lens: np.ndarray,
    *,
    num_k_heads: int,
    num_v_heads: int,
    qk_l2norm: int = 1,
    scale: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """GatedDeltaRule in numpy, token by token in float64: (o, present_state)."""
    b, s, _ = q.shape
    dk, dv = q.shape[-1] // num_k_heads, v.shape[-1] // num_v_heads
    if num_v_heads % num_k_heads:
        raise ValueError(f"num_v_heads {num_v_heads} is not a multiple of {num_k_heads}")
    scale = scale or 1.0 / math.sqrt(dk)
    group = num_v_heads // num_k_heads
    qh = q.reshape(b, s, num_k_heads, dk).astype(np.float64)
    kh = k.reshape(b, s, num_k_heads, dk).astype(np.float64)
    if qk_l2norm:
        qh, kh = l2norm(qh), l2norm(kh)
    qh, kh = np.repeat(qh, group, axis=2), np.repeat(kh, group, axis=2)  # [B, S, Hv, dk]
    vh = v.reshape(b, s, num_v_heads, dv).astype(np.float64)
    decay, rate = np.exp(g.astype(np.float64)), beta.astype(np.float64)
    state = past_state.astype(np.float64)  # [B, Hv, dv, dk]
    out = np.zeros((b, s, num_v_heads, dv))
    for row in range(b):
        st = state[row]
        for t in range(int(query_lens[row])):
            st = st * decay[row, t, :, None, None]
            retrieved = np.einsum("hvk,hk->hv", st, kh[row, t])
            delta = rate[row, t, :, None] * (vh[row, t] - retrieved)
            st = st + delta[:, :, None] * kh[row, t, :, None, :]
            out[row, t] = scale * np.einsum("hvk,hk->hv", st, qh[row, t])
        state[row] = st
    return out.reshape(b, s, -1).astype(q.dtype), state.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# ONNX schemas and torch custom ops
# ---------------------------------------------------------------------------------------------
_conv: dict[str, Any] = {}
_rule: dict[str, Any] = {}


def register_onnx_schema() -> None:
    """Declare both ops to onnx once per process."""
    declare(
        _conv, (CONV_OP_TYPE, DOMAIN, VERSION),
        [(n, "T") for n in CONV_INPUTS[:3]] + [("query_lens", "I")],
        [(n, "T") for n in CONV_OUTPUTS],
        [("T", FLOATS, "activations"), ("I", ["tensor(int32)"], "lengths")],
        [("kernel_size", None, "K"), ("activation", "silu", "silu or none")],
        __doc__,
    )  # fmt: skip
    declare(
        _rule, (RULE_OP_TYPE, DOMAIN, VERSION),
        [(n, "T") for n in RULE_INPUTS[:3]] + [("g", "G"), ("beta", "G"), ("past_state", "S"),
                                               ("query_lens", "I")],
        [("o", "T"), ("present_state", "S")],
        [("T", FLOATS, "activations"), ("G", FLOATS, "decay and rate"),
         ("S", ["tensor(float)"], "state"), ("I", ["tensor(int32)"], "lengths")],
        [("num_k_heads", None, "q/k heads"), ("num_v_heads", None, "value heads"),
         ("qk_l2norm", 1, "1: L2-normalise q and k per head"),
         ("scale", 0.0, "output scale; 0: 1/sqrt(dk)")],
        __doc__,
    )  # fmt: skip


def conv_torch_op() -> Any:
    """``edgeomni::causal_conv_state``; eager calls compute the op in torch (float32)."""
    if "torch_op" in _conv:
        return _conv["torch_op"]
    import torch

    schema = (
        "(Tensor x, Tensor weight, Tensor past_state, Tensor query_lens, int kernel_size, "
        "str activation) -> (Tensor, Tensor)"
    )

    @torch.library.custom_op("edgeomni::causal_conv_state", mutates_args=(), schema=schema)
    def causal_conv_state(
        x: torch.Tensor,
        weight: torch.Tensor,
        past_state: torch.Tensor,
        query_lens: torch.Tensor,
        kernel_size: int,
        activation: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, c = x.shape
        seq = torch.cat([past_state, x.transpose(1, 2).to(past_state.dtype)], dim=2)
        y = torch.nn.functional.conv1d(seq.float(), weight.float().unsqueeze(1), groups=c)
        if activation == "silu":
            y = torch.nn.functional.silu(y)
        steps = torch.arange(kernel_size - 1, device=x.device)
        index = (query_lens.long()[:, None, None] + steps).expand(b, c, kernel_size - 1)
        present = torch.gather(seq, 2, index)
        return y.transpose(1, 2).to(x.dtype).contiguous(), present

    @causal_conv_state.register_fake
    def _(x, weight, past_state, query_lens, kernel_size, activation):  # noqa: ANN001
        return torch.empty_like(x), torch.empty_like(past_state)

    _conv["torch_op"] = causal_conv_state
    return causal_conv_state


def rule_torch_op() -> Any:
    """``edgeomni::gated_delta_rule``; eager calls run the recurrence token by token in float32
    (the state of a row is kept as it is at its pad tokens: torch.where, not a multiply)."""
    if "torch_op" in _rule:
        return _rule["torch_op"]
    import torch

    schema = (
        "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor past_state, "
        "Tensor query_lens, int num_k_heads, int num_v_heads, int qk_l2norm, float scale) "
        "-> (Tensor, Tensor)"
    )

    @torch.library.custom_op("edgeomni::gated_delta_rule", mutates_args=(), schema=schema)
    def gated_delta_rule(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        past_state: torch.Tensor,
        query_lens: torch.Tensor,
        num_k_heads: int,
        num_v_heads: int,
        qk_l2norm: int,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, _ = q.shape
        dk, dv = q.shape[-1] // num_k_heads, v.shape[-1] // num_v_heads
        scale = scale or 1.0 / math.sqrt(dk)
        qh = q.float().reshape(b, s, num_k_heads, dk)
        kh = k.float().reshape(b, s, num_k_heads, dk)
        if qk_l2norm:
            qh = qh * torch.rsqrt((qh * qh).sum(-1, keepdim=True) + L2_EPS)
            kh = kh * torch.rsqrt((kh * kh).sum(-1, keepdim=True) + L2_EPS)
        group = num_v_heads // num_k_heads
        qh, kh = qh.repeat_interleave(group, dim=2), kh.repeat_interleave(group, dim=2)
        vh = v.float().reshape(b, s, num_v_heads, dv)
        decay, rate = g.float().exp(), beta.float()
        valid = torch.arange(s, device=q.device)[None, :] < query_lens.long()[:, None]
        state = past_state.float()
        outs = []
        for t in range(s):
            k_t = kh[:, t, :, None, :]  # [B, Hv, 1, dk]
            new = state * decay[:, t, :, None, None]
            delta = (vh[:, t] - (new * k_t).sum(-1)) * rate[:, t, :, None]
            new = new + delta[..., None] * k_t
            outs.append(scale * (new * qh[:, t, :, None, :]).sum(-1))
            state = torch.where(valid[:, t, None, None, None], new, state)
        o = torch.stack(outs, dim=1).reshape(b, s, num_v_heads * dv).to(q.dtype)
        return o, state.to(past_state.dtype).clone()

    @gated_delta_rule.register_fake
    def _(q, k, v, g, beta, past_state, *lengths_and_attributes):  # noqa: ANN001
        b, s, _ = q.shape
        return q.new_empty(b, s, v.shape[-1]), torch.empty_like(past_state)

    _rule["torch_op"] = gated_delta_rule
    return gated_delta_rule


def onnx_translation() -> dict[Any, Any]:
    """custom_translation_table entries for torch.onnx.export(dynamo=True)."""
    import onnxscript
    import torch

    register_onnx_schema()
    conv_torch_op()
    rule_torch_op()
    opset = onnxscript.values.Opset(DOMAIN, VERSION)

    def conv(x, weight, past_state, query_lens, kernel_size, activation):  # noqa: ANN001
        return getattr(opset, CONV_OP_TYPE)(
            x, weight, past_state, query_lens, kernel_size=kernel_size, activation=activation,
            _outputs=2,
        )  # fmt: skip

    def rule(q, k, v, g, beta, past_state, query_lens, num_k_heads, num_v_heads, qk_l2norm,
             scale):  # noqa: ANN001  # fmt: skip
        return getattr(opset, RULE_OP_TYPE)(
            q, k, v, g, beta, past_state, query_lens, num_k_heads=num_k_heads,
            num_v_heads=num_v_heads, qk_l2norm=qk_l2norm, scale=scale, _outputs=2,
        )  # fmt: skip

    return {
        torch.ops.edgeomni.causal_conv_state.default: conv,
        torch.ops.edgeomni.gated_delta_rule.default: rule,
    }


# ---------------------------------------------------------------------------------------------
# Lowering helpers
# ---------------------------------------------------------------------------------------------
class _Builder:
    """Appends plain nodes with fresh names; constants are shared across the graph."""

    def __init__(self, ctx: Any, stem: str) -> None:
        self.ctx, self.stem, self.nodes = ctx, stem, []

    def op(self, op_type: str, *inputs: str, out: str | None = None, outs: int = 1,
           domain: str | None = None, **kw: Any) -> Any:  # fmt: skip
        from onnx import helper

        names = [out] if out else [self.ctx.fresh(f"{self.stem}_{op_type.lower()}")]
        names += [self.ctx.fresh(f"{self.stem}_{op_type.lower()}") for _ in range(outs - 1)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, domain=domain, **kw))
        return names[0] if outs == 1 else names

    def ints(self, *values: int) -> str:
        stem = "gdn_i64_" + "_".join(str(v).replace("-", "m") for v in values)
        return self.ctx.constant(stem, np.array(values, np.int64))

    def scalar(self, value: int) -> str:
        return self.ctx.constant(f"gdn_scalar_{value}", np.array(value, np.int64))

    def like(self, value: float, x: str) -> str:
        """A float scalar in x's type."""
        bits = int(np.float32(value).view(np.uint32))
        return self.op("CastLike", self.ctx.constant(f"gdn_f32_{bits:08x}", np.float32(value)), x)


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    out = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if isinstance(out.get("activation"), bytes):
        out["activation"] = out["activation"].decode()
    return out


def _valid(ctx: Any, like: str, query_lens: str) -> str:
    """bool [B, S, 1]: position s of row b is a valid token (s < query_lens[b]); once per graph."""
    key = ("gdn_valid", query_lens)
    if key not in ctx.cache:
        b = _Builder(ctx, "gdn_valid")
        width = b.op("Squeeze", b.op("Shape", like, start=1, end=2), b.ints(0))
        steps = b.op("Range", b.scalar(0), width, b.scalar(1))  # [S]
        lens = b.op("Unsqueeze", b.op("Cast", query_lens, to=7), b.ints(1))  # [B, 1] int64
        ctx.cache[key] = b.op("Unsqueeze", b.op("Less", steps, lens), b.ints(2))
        for n in b.nodes:
            ctx.emit(n)
    return ctx.cache[key]


def _conv_present(b: _Builder, seq: str, query_lens: str, kernel_size: int, out: str) -> None:
    """present_state [B, C, K-1] = rows [q, q+K-1) of seq [B, K-1+S, C] per row, transposed."""
    start = b.op("Unsqueeze", b.op("Cast", query_lens, to=7), b.ints(1))  # [B, 1]
    rows = b.op("Add", start, b.ints(*range(kernel_size - 1)))  # [B, K-1]
    taken = b.op("GatherND", seq, b.op("Unsqueeze", rows, b.ints(2)), batch_dims=1)
    b.op("Transpose", taken, perm=[0, 2, 1], out=out)


# ---------------------------------------------------------------------------------------------
# CausalConvState lowerings
# ---------------------------------------------------------------------------------------------
def lower_conv_onnxruntime(node: Any, ctx: Any) -> list[Any]:
    """com.microsoft::CausalConvWithState for y (channels last, its state [B, K-1, C]); the
    per-row present_state gathered from concat(past, x), which the contrib op cannot give. An
    ONNX Runtime before 1.32 (``gated_delta_net`` False) gets the plain lowering."""
    if not ctx.options.get("gated_delta_net", True):
        return lower_conv_tensorrt(node, ctx)
    attrs = _attrs(node)
    x, weight, past, query_lens = node.input
    k = int(attrs["kernel_size"])
    b = _Builder(ctx, "gdn_conv")
    past_last = b.op("Transpose", past, perm=[0, 2, 1])  # [B, K-1, C]
    kernel = b.op("Unsqueeze", weight, b.ints(1))  # [C, 1, K]
    b.op("CausalConvWithState", x, kernel, "", past_last, out=node.output[0], outs=2,
         domain="com.microsoft", channels_last=1,
         activation=attrs.get("activation", "silu"))  # fmt: skip
    seq = b.op("Concat", past_last, x, axis=1)  # [B, K-1+S, C]
    _conv_present(b, seq, query_lens, k, node.output[1])
    return b.nodes


def lower_conv_tensorrt(node: Any, ctx: Any) -> list[Any]:
    """Plain ops, channels last: y = sum_j seq[:, j:j+S] * w[:, j] over the K taps of
    seq = concat(past^T, x) [B, K-1+S, C], then SiLU as x * Sigmoid(x)."""
    attrs = _attrs(node)
    x, weight, past, query_lens = node.input
    k = int(attrs["kernel_size"])
    b = _Builder(ctx, "gdn_conv_trt")
    seq = b.op("Concat", b.op("Transpose", past, perm=[0, 2, 1]), x, axis=1)
    taps = b.op("Transpose", weight, perm=[1, 0])  # [K, C]
    y = None
    for j in range(k):
        end = j - (k - 1) if j < k - 1 else 2**62
        window = b.op("Slice", seq, b.ints(j), b.ints(end), b.ints(1))  # [B, S, C]
        term = b.op("Mul", window, b.op("Slice", taps, b.ints(j), b.ints(j + 1), b.ints(0)))
        y = term if y is None else b.op("Add", y, term)
    activation = attrs.get("activation", "silu")
    if activation == "silu":
        b.op("Mul", y, b.op("Sigmoid", y), out=node.output[0])
    else:
        b.op("Identity", y, out=node.output[0])
    _conv_present(b, seq, query_lens, k, node.output[1])
    return b.nodes


# ---------------------------------------------------------------------------------------------
# GatedDeltaRule lowerings
# ---------------------------------------------------------------------------------------------
def _rule_inputs(node: Any, ctx: Any, b: _Builder) -> tuple[str, str, str, str, str, dict]:
    """q, k [B, S, Hk, dk] (L2-normalised if asked), v [B, S, Hv, dv], and g, beta zeroed at pad
    positions (an identity update: decay exp(0) = 1, rate 0)."""
    attrs = _attrs(node)
    q, k, v, g, beta, _, query_lens = node.input
    hk, hv = int(attrs["num_k_heads"]), int(attrs["num_v_heads"])
    if hv % hk:
        raise ValueError(f"{node.name!r}: num_v_heads {hv} is not a multiple of {hk}")
    valid = _valid(ctx, q, query_lens)
    g_m = b.op("Where", valid, g, b.like(0.0, g))
    beta_m = b.op("Where", valid, beta, b.like(0.0, beta))
    heads = []
    for x in (q, k):
        xh = b.op("Reshape", x, b.ints(0, 0, hk, -1))
        if int(attrs.get("qk_l2norm", 1)):
            squares = b.op("ReduceSum", b.op("Mul", xh, xh), b.ints(-1), keepdims=1)
            xh = b.op("Div", xh, b.op("Sqrt", b.op("Add", squares, b.like(L2_EPS, xh))))
        heads.append(xh)
    v4 = b.op("Reshape", v, b.ints(0, 0, hv, -1))
    return heads[0], heads[1], v4, g_m, beta_m, attrs


def lower_rule_onnxruntime(node: Any, ctx: Any) -> list[Any]:
    """com.microsoft::GatedDeltaNet (rank-4 spelling, gate and beta activations none); before
    ONNX Runtime 1.32 (``gated_delta_net`` False), the plain lowering."""
    if not ctx.options.get("gated_delta_net", True):
        return lower_rule_tensorrt(node, ctx)
    b = _Builder(ctx, "gdn_rule")
    q4, k4, v4, g_m, beta_m, attrs = _rule_inputs(node, ctx, b)
    extra = {"scale": float(attrs["scale"])} if attrs.get("scale") else {}
    o4 = b.op("GatedDeltaNet", q4, k4, v4, "", g_m, beta_m, node.input[5], outs=2,
              domain="com.microsoft", qk_l2_norm=0, update_rule="gated_delta", **extra)  # fmt: skip
    b.nodes[-1].output[1] = node.output[1]
    b.op("Reshape", o4[0], b.ints(0, 0, -1), out=node.output[0])
    return b.nodes


def lower_rule_tensorrt(node: Any, ctx: Any) -> list[Any]:
    """Plain ops: a Loop over S carrying the float32 state [B, Hv, dv, dk]; each step is two
    batched MatMuls (retrieve S k, read S q) and a rank-1 update, as in the reference."""
    from onnx import TensorProto, helper

    b = _Builder(ctx, "gdn_rule_trt")
    q4, k4, v4, g_m, beta_m, attrs = _rule_inputs(node, ctx, b)
    hk, hv = int(attrs["num_k_heads"]), int(attrs["num_v_heads"])
    group = hv // hk
    f32 = TensorProto.FLOAT

    def per_value_head(x: str) -> str:  # [B, S, Hk, dk] -> float [B, S, Hv, dk]
        x = b.op("Cast", x, to=f32)
        if group == 1:
            return x
        wide = b.op("Expand", b.op("Unsqueeze", x, b.ints(3)), b.ints(1, 1, 1, group, 1))
        return b.op("Reshape", wide, b.ints(0, 0, hv, -1))

    qv, kv = per_value_head(q4), per_value_head(k4)
    if attrs.get("scale"):
        bits = int(np.float32(attrs["scale"]).view(np.uint32))
        scale = ctx.constant(f"gdn_scale_{bits:08x}", np.float32(attrs["scale"]))
    else:  # 1/sqrt(dk), dk read from q's shape
        dk = b.op("Cast", b.op("Shape", qv, start=3, end=4), to=f32)
        scale = b.op("Reciprocal", b.op("Sqrt", dk))
    qv = b.op("Mul", qv, scale)
    vf = b.op("Cast", v4, to=f32)
    decay = b.op("Exp", b.op("Cast", g_m, to=f32))  # [B, S, Hv]
    rate = b.op("Cast", beta_m, to=f32)
    trips = b.op("Squeeze", b.op("Shape", q4, start=1, end=2), b.ints(0))

    # the body: step t of every row and head
    body = _Builder(ctx, "gdn_step")
    t, cond_in, state = (ctx.fresh(f"gdn_step_{n}") for n in ("t", "cond", "state"))

    def at(x: str) -> str:  # x[:, t]
        return body.op("Gather", x, t, axis=1)

    q_t, k_t, v_t = at(qv), at(kv), at(vf)  # [B, Hv, dk], [B, Hv, dk], [B, Hv, dv]
    a_t = body.op("Unsqueeze", at(decay), body.ints(2, 3))  # [B, Hv, 1, 1]
    b_t = body.op("Unsqueeze", at(rate), body.ints(2, 3))
    col = body.ints(3)
    decayed = body.op("Mul", state, a_t)  # [B, Hv, dv, dk]
    retrieved = body.op("MatMul", decayed, body.op("Unsqueeze", k_t, col))  # [B, Hv, dv, 1]
    delta = body.op("Mul", body.op("Sub", body.op("Unsqueeze", v_t, col), retrieved), b_t)
    row_k = body.op("Unsqueeze", k_t, body.ints(2))  # [B, Hv, 1, dk]
    new_state = body.op("Add", decayed, body.op("MatMul", delta, row_k))
    read = body.op("MatMul", new_state, body.op("Unsqueeze", q_t, col))  # [B, Hv, dv, 1]
    o_t = body.op("Reshape", read, body.ints(0, -1))  # [B, Hv*dv]
    cond_out = body.op("Identity", cond_in)
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        body.nodes, ctx.fresh("gdn_loop_body"),
        [vi(t, TensorProto.INT64, []), vi(cond_in, TensorProto.BOOL, []), vi(state, f32, None)],
        [vi(cond_out, TensorProto.BOOL, []), vi(new_state, f32, None), vi(o_t, f32, None)],
    )  # fmt: skip
    # an explicit condition (always true): TensorRT's parser registers the body's condition
    # input only when the Loop is given one (measured: TensorRT-RTX 1.7 refused the body's
    # Identity of it otherwise, "Node input was not registered")
    always = ctx.constant("gdn_true", np.array(True))
    _, stacked = b.op("Loop", trips, always, node.input[5], outs=2, body=graph)  # [S, B, Hv*dv]
    b.nodes[-1].output[0] = node.output[1]
    o = b.op("Transpose", stacked, perm=[1, 0, 2])
    b.op("CastLike", o, node.input[0], out=node.output[0])
    return b.nodes


CONV_LOWERINGS = {"onnxruntime": lower_conv_onnxruntime, "tensorrt": lower_conv_tensorrt}
RULE_LOWERINGS = {"onnxruntime": lower_rule_onnxruntime, "tensorrt": lower_rule_tensorrt}
