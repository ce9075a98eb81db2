"""edgeomni::QuantMoE: edgeomni::MoE with blocked symmetric int4 expert weights.

The builder's quantization pass (builder/quantize.py) writes it in place of an edgeomni::MoE
whose experts it packs; routing and activation are MoE's (plugins/moe.py): softmax over all
experts, top ``top_k``, renormalised when ``normalize_routing``, SwiGLU with gate and up rows
interleaved in fc1.

Inputs (positional):
  0 ``x``            float [T, H]
  1 ``router_logits`` float [T, E]
  2 ``fc1``          uint8 [E, 2I, H/2]    4-bit codes q in 0..15, two per byte, the lower H
                                           index in the low nibble (each row as MatMulNBits
                                           packs a column of W)
  3 ``fc1_scales``   float [E, 2I, H/bs]   one scale per row and block of bs inputs
  4 ``fc2``          uint8 [E, H, I/2]
  5 ``fc2_scales``   float [E, H, I/bs]
Output: ``y`` float [T, H], MoE's with fc[e, n, k] = (q[e, n, k] - 8) * scales[e, n, k / bs].
Attributes: ``top_k``, ``normalize_routing`` (as MoE), ``block_size`` (bs: 16, 32, 64, 128,
dividing both H and I), ``bits`` (4).

ONNX Runtime 1.32's com.microsoft::QMoE contract, as its schema states and as the CPU provider
was checked to compute (tests/test_quant_moe.py compares it with this file's reference):
- inputs: input, router_probs (raw logits: the kernel applies the softmax), fc1_experts_weights,
  fc1_scales, fc1_experts_bias, fc2_experts_weights, fc2_scales, fc2_experts_bias, then fc3
  (weights, scales, bias; absent when SwiGLU is fused), fc1/fc2/fc3_zero_points, router_weights
  and fp4/fp8-only inputs;
- ``weights_prepacked=0`` selects the raw layout above, [E, N, K/2] per projection (N outputs,
  K inputs; the same bytes as MatMulNBits' [N, K/bs, bs/2]); the default -1 means the provider's
  prepacked layout, which the CPU provider computes differently from raw bytes, so 0 is written;
- ``block_size`` gives block-wise scales [E, N, K/bs] (a power of two >= 16 dividing H and I);
  without it the scales are per output channel, [E, N];
- without zero points the code of 0.0 is 2^(bits-1) = 8: symmetric int4, QuantMatMul's codes;
- ``accuracy_level`` as MatMulNBits': 0 computes in float, 4 quantizes activations to int8;
- ``normalize_routing_weights=0`` is ignored by the CPU provider (it renormalises the top-k
  weights anyway), so the lowering keeps MoE's trick: always normalise, then scale by the
  chosen experts' softmax mass (moe.lower_contrib);
- float32 and float16 run on CPU; bfloat16 is registered but refuses the raw layout ("CPU
  bfloat16 QMoE requires a shared layout").

Lowerings:
- ONNX Runtime: QMoE with this layout as it is (a rename), ``accuracy_level`` from the
  ``nbits_accuracy_level`` option (the level MatMulNBits gets).
- TensorRT: MoE's dense plain-op lowering fed by DequantizeLinear (opset 21) of each projection
  as a signed INT4 [E*N, K] tensor with [E*N, K/bs] scales blocked on its last axis, reshaped
  to [E, N, K]. 2-D because TensorRT's IDequantizeLayer documents scales of rank <= 2 (while
  asking block scales to have the input's rank): a 3-D blocked DequantizeLinear is not something
  it promises to take. The weights stay int4 in the engine's file either way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeomni.plugins import moe, quant_linear
from edgeomni.plugins.attention import DOMAIN

OP_TYPE = "QuantMoE"
VERSION = 1
INPUTS = ("x", "router_logits", "fc1", "fc1_scales", "fc2", "fc2_scales")
OUTPUTS = ("y",)


# ---------------------------------------------------------------------------------------------
# numpy reference: quantizing experts, dequantizing them, the op's meaning
# ---------------------------------------------------------------------------------------------
def quantize_experts(
    w: np.ndarray, block_size: int, scale_dtype: Any = np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest symmetric int4 of expert weights [E, N, K] (each row's K inputs in
    blocks of ``block_size``): (packed uint8 [E, N, K/2], scales [E, N, K/bs]).

    Expert by expert, so a 30B model's block is never widened to float32 all at once."""
    e, n, k = w.shape
    packed = np.empty((e, n, k // 2), np.uint8)
    scales = np.empty((e, n, k // block_size), scale_dtype)
    for i in range(e):
        p, s = quant_linear.quantize_symmetric(w[i].T, block_size, scale_dtype)
        packed[i], scales[i] = p.reshape(n, k // 2), s
    return packed, scales


def dequantize_experts(packed: np.ndarray, scales: np.ndarray, block_size: int) -> np.ndarray:
    """[E, N, K] in the scales' dtype: what an engine's experts compute with."""
    e, n, half = packed.shape
    k = 2 * half
    w = quant_linear.dequantize(
        packed.reshape(e * n, half), scales.reshape(e * n, -1), None, k=k, block_size=block_size
    )
    return np.ascontiguousarray(w.T).reshape(e, n, k)


def packed_bytes(e: int, n: int, k: int, block_size: int, scale_bytes: int) -> int:
    """Bytes of one projection's experts [E, N, K] as the op stores them."""
    return e * quant_linear.packed_bytes(k, n, block_size, scale_bytes, False)


def reference(
    x: np.ndarray,
    router_logits: np.ndarray,
    fc1: np.ndarray,
    fc1_scales: np.ndarray,
    fc2: np.ndarray,
    fc2_scales: np.ndarray,
    *,
    top_k: int,
    normalize_routing: int,
    block_size: int,
    bits: int = 4,
) -> np.ndarray:
    """Dequantize, then moe.reference."""
    if bits != 4:
        raise ValueError(f"{OP_TYPE}: only 4-bit experts are defined, got bits={bits}")
    w1 = dequantize_experts(fc1, fc1_scales, block_size)
    w2 = dequantize_experts(fc2, fc2_scales, block_size)
    return moe.reference(x, router_logits, w1, w2, top_k=top_k, normalize_routing=normalize_routing)


# ---------------------------------------------------------------------------------------------
# The node (written by the pass, never traced from torch: no schema)
# ---------------------------------------------------------------------------------------------
def make_node(
    inputs: list[str], y: str, *, top_k: int, normalize_routing: int, block_size: int,
    name: str | None = None,
) -> Any:  # fmt: skip
    """A QuantMoE node over INPUTS' six names (the quantization pass writes these)."""
    from onnx import helper

    return helper.make_node(
        OP_TYPE, inputs, [y], name=name, domain=DOMAIN, top_k=top_k,
        normalize_routing=normalize_routing, block_size=block_size, bits=4,
    )  # fmt: skip


def _attrs(node: Any) -> dict[str, int]:
    from onnx import helper

    attrs = {a.name: int(helper.get_attribute_value(a)) for a in node.attribute}
    if attrs.get("bits", 4) != 4:
        raise ValueError(f"{OP_TYPE} node {node.name!r}: only bits=4 has a lowering")
    if len(node.input) != len(INPUTS):
        raise ValueError(f"{OP_TYPE} node {node.name!r} has {len(node.input)} inputs")
    return attrs


# ---------------------------------------------------------------------------------------------
# Lowerings
# ---------------------------------------------------------------------------------------------
def lower_onnxruntime(node: Any, ctx: Any) -> list[Any]:
    """com.microsoft::QMoE over the same tensors, no biases; unnormalised routing as MoE's."""
    attrs = _attrs(node)
    x, logits, fc1, s1, fc2, s2 = node.input
    return moe.lower_contrib(
        node, ctx, "QMoE", [x, logits, fc1, s1, "", fc2, s2, ""],
        expert_weight_bits=4, block_size=attrs["block_size"], weights_prepacked=0,
        accuracy_level=int(ctx.options.get("nbits_accuracy_level", 0)),
    )  # fmt: skip


def lower_tensorrt(node: Any, ctx: Any) -> list[Any]:
    """Each projection dequantized from INT4 (DequantizeLinear, 2-D, blocked on its last axis,
    then Reshape to [E, N, K]), then MoE's dense lowering over the float experts."""
    from onnx import TensorProto, helper, numpy_helper

    attrs = _attrs(node)
    bs = attrs["block_size"]
    ctx.require_opset("", 21)
    nodes: list[Any] = []
    floats = []
    for packed_name, scales_name in (node.input[2:4], node.input[4:6]):
        packed, scales = ctx.tensor(packed_name), ctx.tensor(scales_name)
        e, n, half = packed.shape
        # ONNX INT4 packs the flat [E*N, K] tensor two per byte, the lower index in the low
        # nibble: the op's bytes already are in that order, and a signed code q - 8 is q ^ 8.
        raw = (packed ^ np.uint8(0x88)).tobytes()
        weight = ctx.fresh(packed_name + "_int4")
        ctx.initializers.append(
            helper.make_tensor(weight, TensorProto.INT4, [e * n, 2 * half], raw, raw=True)
        )
        scale_2d = ctx.fresh(scales_name + "_2d")
        scales, block = quant_linear.tensorrt_blocks(scales.reshape(e * n, -1), 2 * half, bs)
        ctx.initializers.append(numpy_helper.from_array(scales, scale_2d))
        flat, dense = ctx.fresh("quant_moe_flat"), ctx.fresh("quant_moe_weight")
        shape = ctx.constant(f"quant_moe_shape_{e}_{n}_{2 * half}",
                             np.array([e, n, 2 * half], np.int64))  # fmt: skip
        nodes += [
            helper.make_node(
                "DequantizeLinear", [weight, scale_2d], [flat], axis=1, block_size=block, name=flat
            ),  # fmt: skip
            helper.make_node("Reshape", [flat, shape], [dense], name=dense),
        ]
        floats.append(dense)
    proxy = helper.make_node(
        moe.OP_TYPE, [node.input[0], node.input[1], *floats], list(node.output),
        name=node.name or None, domain=DOMAIN, top_k=attrs["top_k"],
        normalize_routing=attrs["normalize_routing"],
    )  # fmt: skip
    return nodes + moe.lower_tensorrt(proxy, ctx)


LOWERINGS = {"onnxruntime": lower_onnxruntime, "tensorrt": lower_tensorrt}
