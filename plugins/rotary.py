"""edgeomni::Rotary: rotary position embedding (rotate-half form) with per-token cos and sin.

Defined once here; every decoder the exporter writes calls it for q and for k in each layer.

Inputs (positional):
  0 ``x``    float [B, S, H*D]  queries or keys, heads side by side
  1 ``cos``  float [B, S, D]    each token's cos, halves equal (transformers' ``cat(freqs, freqs)``)
  2 ``sin``  float [B, S, D]
Output:
  0 ``y``    float [B, S, H*D]  x*cos + rotate_half(x)*sin per head, rotate_half(x) = [-x2, x1]
Attributes: ``num_heads`` (H), ``head_dim`` (D).

The caller computes cos and sin (1-D RoPE, or Qwen3-Omni's interleaved 3-axis MRoPE: any
positions), so the op needs no position ids and no table of its own.

Lowerings (TensorRT): ONNX's RotaryEmbedding (opset 23) where the parser reads it, plain ops
otherwise. Lowerings (ONNX Runtime):
- plain ops (the default): Slice, Neg, Concat, Mul, Add, the same arithmetic the torch formula
  exports to, so a CPU build's numbers do not change;
- ``fused_rotary``: one com.microsoft::RotaryEmbedding node. Its cos/sin cache is the tokens' own
  cos/sin rows ([B*S, D/2]) and the position of token (b, s) is b*S + s, so any per-token rotation
  fits. On the CUDA provider that is one kernel where plain ops take six (measured on the H200:
  rotary was 12 of a decode layer's ~32 kernels).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeomni.plugins.attention import DOMAIN
from edgeomni.plugins.schema import FLOATS, declare

# not "RotaryEmbedding": ONNX (opset 23) and com.microsoft both have an op of that name
OP_TYPE = "Rotary"
VERSION = 1
INPUTS = ("x", "cos", "sin")
OUTPUTS = ("y",)


def reference(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, num_heads: int, head_dim: int
) -> np.ndarray:
    """The op's meaning in numpy."""
    b, s, _ = x.shape
    xh = x.reshape(b, s, num_heads, head_dim)
    half = head_dim // 2
    rotated = np.concatenate([-xh[..., half:], xh[..., :half]], axis=-1)
    y = xh * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return y.reshape(b, s, num_heads * head_dim).astype(x.dtype)


# ---------------------------------------------------------------------------------------------
# ONNX schema and torch custom op
# ---------------------------------------------------------------------------------------------
_registered: dict[str, Any] = {}


def register_onnx_schema() -> None:
    """Declare edgeomni::Rotary to onnx once per process."""
    declare(
        _registered, (OP_TYPE, DOMAIN, VERSION), [(n, "T") for n in INPUTS],
        [(n, "T") for n in OUTPUTS], [("T", FLOATS, "activations")],
        [("num_heads", None, "heads in x"), ("head_dim", None, "rotated size per head")],
        __doc__,
    )  # fmt: skip


def torch_op() -> Any:
    """The torch custom op ``edgeomni::rotary``; eager calls compute the formula in torch."""
    if "torch_op" in _registered:
        return _registered["torch_op"]
    import torch

    schema = "(Tensor x, Tensor cos, Tensor sin, int num_heads, int head_dim) -> Tensor"

    @torch.library.custom_op("edgeomni::rotary", mutates_args=(), schema=schema)
    def rotary(
        x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int, head_dim: int
    ) -> torch.Tensor:
        b, s, _ = x.shape
        xh = x.reshape(b, s, num_heads, head_dim)
        half = head_dim // 2
        rotated = torch.cat((-xh[..., half:], xh[..., :half]), dim=-1)
        y = xh * cos[:, :, None, :] + rotated * sin[:, :, None, :]
        return y.reshape(b, s, num_heads * head_dim)

    @rotary.register_fake
    def _(x, cos, sin, num_heads, head_dim):  # noqa: ANN001
        return torch.empty_like(x)

    _registered["torch_op"] = rotary
    return rotary


def onnx_translation() -> dict[Any, Any]:
    """custom_translation_table entry for torch.onnx.export(dynamo=True)."""
    import onnxscript
    import torch

    register_onnx_schema()
    torch_op()
    opset = onnxscript.values.Opset(DOMAIN, VERSION)

    def translate(x, cos, sin, num_heads, head_dim):  # noqa: ANN001
        return getattr(opset, OP_TYPE)(x, cos, sin, num_heads=num_heads, head_dim=head_dim)

    return {torch.ops.edgeomni.rotary.default: translate}


# ---------------------------------------------------------------------------------------------
# Lowering: ONNX Runtime
# ---------------------------------------------------------------------------------------------
def _shape(node: Any) -> tuple[int, int]:
    """The node's heads and (even) head dim."""
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    heads, dim = int(attrs["num_heads"]), int(attrs["head_dim"])
    if dim % 2:
        raise ValueError(f"{node.name!r}: rotary head_dim {dim} must be even")
    return heads, dim


def lower_onnxruntime(node: Any, ctx: Any) -> list[Any]:
    """Plain ops, or com.microsoft::RotaryEmbedding with the ``fused_rotary`` option."""
    heads, dim = _shape(node)
    if ctx.options.get("fused_rotary"):
        return _lower_fused(node, ctx, heads, dim)
    return _lower_plain(node, ctx, heads, dim)


def _ints(ctx: Any, *values: int) -> str:
    stem = "rotary_i64_" + "_".join(str(v).replace("-", "m") for v in values)
    return ctx.constant(stem, np.array(values, np.int64))


def _lower_plain(node: Any, ctx: Any, heads: int, dim: int) -> list[Any]:
    from onnx import helper

    x, cos, sin = node.input
    nodes: list[Any] = []

    def op(op_type: str, *inputs: str, out: str | None = None, **kw: Any) -> str:
        name = out or ctx.fresh("rotary_" + op_type.lower())
        nodes.append(helper.make_node(op_type, list(inputs), [name], **kw))
        return name

    key = ("rotary_per_head", cos, sin)
    if key not in ctx.cache:  # cos, sin [B, S, 1, D]: once per graph, shared by every layer
        axis = _ints(ctx, 2)
        ctx.cache[key] = tuple(ctx.fresh("rotary_" + n) for n in ("cos4", "sin4"))
        for src, dst in zip((cos, sin), ctx.cache[key], strict=True):
            ctx.emit(helper.make_node("Unsqueeze", [src, axis], [dst]))
    cos4, sin4 = ctx.cache[key]
    half = dim // 2
    xh = op("Reshape", x, _ints(ctx, 0, 0, heads, dim))
    last = _ints(ctx, 3)
    x1 = op("Slice", xh, _ints(ctx, 0), _ints(ctx, half), last)
    x2 = op("Slice", xh, _ints(ctx, half), _ints(ctx, dim), last)
    rotated = op("Concat", op("Neg", x2), x1, axis=3)
    y = op("Add", op("Mul", xh, cos4), op("Mul", rotated, sin4))
    op("Reshape", y, _ints(ctx, 0, 0, heads * dim), out=node.output[0])
    return nodes


def _lower_fused(node: Any, ctx: Any, heads: int, dim: int) -> list[Any]:
    """Every value is made on the device (ConstantOfShape, CumSum): a captured CUDA graph then
    holds no copy from a host buffer computed at capture time."""
    from onnx import TensorProto, helper

    x, cos, sin = node.input
    key = ("rotary_tables", cos, sin)
    if key not in ctx.cache:
        half = dim // 2

        def emit(op_type: str, *inputs: str, **kw: Any) -> str:
            name = ctx.fresh("rotary_" + op_type.lower())
            ctx.emit(helper.make_node(op_type, list(inputs), [name], **kw))
            return name

        tables = []
        for src in (cos, sin):  # [B, S, D] -> first halves, one row per token [B*S, D/2]
            first = emit("Slice", src, _ints(ctx, 0), _ints(ctx, half), _ints(ctx, 2))
            tables.append(emit("Reshape", first, _ints(ctx, -1, half)))
        rows = emit("Shape", cos, end=2)  # [B, S]
        count = emit("ReduceProd", rows, keepdims=1)  # [1]: B*S
        ones = emit(
            "ConstantOfShape", count, value=helper.make_tensor("one", TensorProto.INT64, [1], [1])
        )
        after = emit("CumSum", ones, ctx.constant("rotary_axis0", np.array(0, np.int64)))
        index = emit("Sub", after, ctx.constant("rotary_one_i64", np.array(1, np.int64)))
        positions = emit("Reshape", index, rows)  # token (b, s) reads row b*S + s
        ctx.cache[key] = (positions, *tables)
    positions, cos_rows, sin_rows = ctx.cache[key]
    return [
        helper.make_node(
            "RotaryEmbedding",
            [x, positions, cos_rows, sin_rows],
            list(node.output),
            name=node.name or None,
            domain="com.microsoft",
            num_heads=heads,
            rotary_embedding_dim=dim,
        )
    ]


def lower_tensorrt(node: Any, ctx: Any) -> list[Any]:
    """ONNX's own RotaryEmbedding (opset 23): the parsers that read opset-23 Attention read it
    too (TensorRT >= 10.15, TensorRT-RTX 1.7, which make it one layer)."""
    return _lower_onnx(node, ctx, *_shape(node))


def _lower_onnx(node: Any, ctx: Any, heads: int, dim: int) -> list[Any]:
    """RotaryEmbedding-23 without position ids: its caches are then each token's own cos and sin
    [B, S, D/2] (the first halves of the op's, whose halves are equal), so any per-token
    rotation fits, as in the op."""
    from onnx import helper

    x, cos, sin = node.input
    key = ("rotary_halves", cos, sin)
    if key not in ctx.cache:  # once per graph, shared by every layer
        half, last = _ints(ctx, dim // 2), _ints(ctx, 2)
        ctx.cache[key] = tuple(ctx.fresh("rotary_" + n) for n in ("cos_half", "sin_half"))
        for src, dst in zip((cos, sin), ctx.cache[key], strict=True):
            ctx.emit(helper.make_node("Slice", [src, _ints(ctx, 0), half, last], [dst]))
    ctx.require_opset("", 23)
    cos_half, sin_half = ctx.cache[key]
    return [
        helper.make_node(
            "RotaryEmbedding", [x, cos_half, sin_half], list(node.output),
            name=node.name or None, num_heads=heads, interleaved=0,
        )
    ]  # fmt: skip


LOWERINGS = {"onnxruntime": lower_onnxruntime, "tensorrt": lower_tensorrt}
