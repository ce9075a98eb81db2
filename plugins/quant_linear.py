"""edgeomni::QuantMatMul: x @ W with W stored as blocked int4 (weight-only quantization).

Defined once here: the builder's quantization pass (builder/quantize.py) writes it in place of a
float MatMul, the readers of pre-quantized checkpoints write the same layout, and each backend
gets its own lowering.

Inputs (positional):
  0 ``x``            float [..., K]              activations (float32 or float16)
  1 ``packed``       uint8 [N, K/bs, bs/2]       4-bit codes q in 0..15, two per byte, the lower
                                                 K index in the low nibble (MatMulNBits' layout)
  2 ``scales``       float [N, K/bs]             one scale per output column and block of K
  3 ``zero_points``  uint8 [N, ceil(K/bs / 2)]   optional, two 4-bit zero points per byte as in
                                                 MatMulNBits; absent means 8 (symmetric)
Output:
  0 ``y``            float [..., N]              x @ W, W[k, n] = (q[n, k] - z[n, k/bs]) *
                                                 scales[n, k/bs]
Attributes: ``K``, ``N``, ``block_size`` (bs: 16, 32, 64 or 128), ``bits`` (4).

Lowerings:
- ONNX Runtime (CPU and CUDA): com.microsoft::MatMulNBits, which takes this layout as it is.
  Its ``accuracy_level`` (the option ``nbits_accuracy_level``) is what the CPU kernel computes
  in: 4 quantizes each block of x to int8 and runs int8 dot products (the fast path, ~4x fp32 at
  Qwen3-0.6B's sizes), 0/1 dequantizes to float; the builder records the level it chose.
- TensorRT and TensorRT-RTX: ONNX's DequantizeLinear (opset 21) of a signed INT4 [K, N] tensor
  with [K/bs, N] scales, blocked on axis 0, then MatMul: the pattern both build as INT4
  weight-only GEMM. Only symmetric weights lower this way: TensorRT takes no int4 zero points.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeomni.plugins.attention import DOMAIN

OP_TYPE = "QuantMatMul"
VERSION = 1
INPUTS = ("x", "packed", "scales", "zero_points")
OUTPUTS = ("y",)
BLOCK_SIZES = (16, 32, 64, 128)
SYMMETRIC_ZERO = 8  # the code of 0.0 when no zero points are given (MatMulNBits' default)
# codes of a symmetric weight: -7..7 around the zero code, so +-max both land on the grid
SYMMETRIC_MAX = 7


# ---------------------------------------------------------------------------------------------
# numpy reference: the layout, quantizing and dequantizing
# ---------------------------------------------------------------------------------------------
def pack_codes(codes: np.ndarray) -> np.ndarray:
    """[N, K] codes in 0..15 -> [N, K/2] bytes, the lower K index in the low nibble."""
    codes = codes.astype(np.uint8)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def unpack_codes(packed: np.ndarray, k: int) -> np.ndarray:
    """[N, ...] bytes -> [N, k] codes (the inverse of pack_codes; trailing padding dropped)."""
    flat = packed.reshape(packed.shape[0], -1)
    codes = np.empty((flat.shape[0], flat.shape[1] * 2), np.uint8)
    codes[:, 0::2] = flat & 0x0F
    codes[:, 1::2] = flat >> 4
    return codes[:, :k]


def dequantize(
    packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    *,
    k: int,
    block_size: int,
) -> np.ndarray:
    """The op's weight W [K, N] in the scales' dtype (computed in float32, then cast)."""
    n = packed.shape[0]
    blocks = k // block_size
    codes = unpack_codes(packed, k).astype(np.float32).reshape(n, blocks, block_size)
    if zero_points is None:
        zeros = np.full((n, blocks), SYMMETRIC_ZERO, np.float32)
    else:
        zeros = unpack_codes(zero_points, blocks).astype(np.float32)
    s = scales.reshape(n, blocks).astype(np.float32)
    w = (codes - zeros[:, :, None]) * s[:, :, None]
    return w.reshape(n, k).T.astype(scales.dtype)


def reference(
    x: np.ndarray,
    packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None = None,
    *,
    K: int,  # noqa: N803 - the op's attribute names
    N: int,  # noqa: N803
    block_size: int,
    bits: int = 4,
) -> np.ndarray:
    """The op's meaning in numpy: x @ dequantize(...), accumulated in float32."""
    if bits != 4:
        raise ValueError(f"{OP_TYPE}: only 4-bit weights are defined, got bits={bits}")
    w = dequantize(packed, scales, zero_points, k=K, block_size=block_size)
    if w.shape != (K, N):
        raise ValueError(f"{OP_TYPE}: weight is {w.shape}, attributes say {(K, N)}")
    return (x.astype(np.float32) @ w.astype(np.float32)).astype(x.dtype)


def quantize_symmetric(
    w: np.ndarray, block_size: int, scale_dtype: Any = np.float32
) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest symmetric int4 of W [K, N]: (packed [N, K/bs, bs/2], scales [N, K/bs]).

    Each block's scale is its largest magnitude / 7, stored in ``scale_dtype`` (the model's
    float type); the codes are rounded with the stored scale, so dequantize() is exact about
    what the engine computes. An all-zero block gets scale 0 and code 8 (exactly 0.0)."""
    k, n = w.shape
    if k % block_size:
        raise ValueError(f"K={k} is not a multiple of the block size {block_size}")
    blocks = w.astype(np.float32).T.reshape(n, k // block_size, block_size)
    amax = np.abs(blocks).max(axis=2)
    scales = (amax / SYMMETRIC_MAX).astype(scale_dtype)
    s = scales.astype(np.float32)
    safe = np.where(s == 0, 1.0, s)[:, :, None]
    q = np.clip(np.rint(blocks / safe), -SYMMETRIC_MAX, SYMMETRIC_MAX) + SYMMETRIC_ZERO
    packed = pack_codes(q.reshape(n, k).astype(np.uint8))
    return packed.reshape(n, k // block_size, block_size // 2), scales


def packed_bytes(k: int, n: int, block_size: int, scale_bytes: int, zero_points: bool) -> int:
    """Bytes one quantized [K, N] weight occupies in an engine: codes, scales, zero points."""
    blocks = k // block_size
    return n * k // 2 + n * blocks * scale_bytes + (n * ((blocks + 1) // 2) if zero_points else 0)


# ---------------------------------------------------------------------------------------------
# The node (written into exported graphs by the pass, never traced from torch: no schema)
# ---------------------------------------------------------------------------------------------
def make_node(
    x: str, packed: str, scales: str, zero_points: str | None, y: str, *,
    k: int, n: int, block_size: int, name: str | None = None,
) -> Any:  # fmt: skip
    """A QuantMatMul node (the quantization pass and the checkpoint readers write these)."""
    from onnx import helper

    inputs = [x, packed, scales] + ([zero_points] if zero_points else [])
    return helper.make_node(
        OP_TYPE, inputs, [y], name=name, domain=DOMAIN, K=k, N=n, block_size=block_size, bits=4
    )


def _attrs(node: Any) -> dict[str, int]:
    from onnx import helper

    attrs = {a.name: int(helper.get_attribute_value(a)) for a in node.attribute}
    if attrs.get("bits", 4) != 4:
        raise ValueError(f"{OP_TYPE} node {node.name!r}: only bits=4 has a lowering")
    return attrs


# ---------------------------------------------------------------------------------------------
# Lowerings
# ---------------------------------------------------------------------------------------------
def lower_onnxruntime(node: Any, ctx: Any) -> list[Any]:
    """One com.microsoft::MatMulNBits: the same inputs, the accuracy level from the options."""
    from onnx import helper

    attrs = _attrs(node)
    level = int(ctx.options.get("nbits_accuracy_level", 0))
    return [
        helper.make_node(
            "MatMulNBits",
            list(node.input),
            list(node.output),
            name=node.name or None,
            domain="com.microsoft",
            K=attrs["K"],
            N=attrs["N"],
            bits=4,
            block_size=attrs["block_size"],
            accuracy_level=level,
        )
    ]


def tensorrt_blocks(scales: np.ndarray, k: int, bs: int) -> tuple[np.ndarray, int]:
    """Row scales [rows, K/bs] and the block size as TensorRT takes them: a single block along
    K becomes two half blocks sharing its scale (the same weight), since TensorRT-RTX 1.7
    refuses a blocked DequantizeLinear whose scale has one block ("ScaleMode is illegal")."""
    if k != bs:
        return scales, bs
    return np.repeat(scales, 2, axis=1), bs // 2


def lower_tensorrt(node: Any, ctx: Any) -> list[Any]:
    """DequantizeLinear(INT4 [K, N], scales [K/bs, N], axis 0, block_size bs) -> MatMul.

    The codes are re-laid as signed int4 (code - 8) in [K, N] order, two per byte with the
    lower flat index in the low nibble (ONNX's INT4 packing)."""
    from onnx import TensorProto, helper, numpy_helper

    attrs = _attrs(node)
    k, n, bs = attrs["K"], attrs["N"], attrs["block_size"]
    if len(node.input) > 3 and node.input[3]:
        raise ValueError(
            f"{OP_TYPE} node {node.name!r} has zero points (asymmetric int4): TensorRT takes "
            "only symmetric int4 weights; build this checkpoint for onnxruntime, or with "
            "--quantization int4_rtn from a float checkpoint"
        )
    packed, scales = ctx.tensor(node.input[1]), ctx.tensor(node.input[2])
    scales, bs = tensorrt_blocks(scales.reshape(n, k // bs), k, bs)
    signed = unpack_codes(packed, k).astype(np.int16) - SYMMETRIC_ZERO  # [N, K] in -8..7
    nibbles = (signed.T.reshape(-1) & 0x0F).astype(np.uint8)  # [K, N] flat
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    raw = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8).tobytes()
    weight = ctx.fresh(node.input[1] + "_int4")
    ctx.initializers.append(helper.make_tensor(weight, TensorProto.INT4, [k, n], raw, raw=True))
    scale_kn = ctx.fresh(node.input[2] + "_kn")
    ctx.initializers.append(numpy_helper.from_array(np.ascontiguousarray(scales.T), scale_kn))
    ctx.require_opset("", 21)
    dq = ctx.fresh("quant_weight")
    return [
        helper.make_node(
            "DequantizeLinear",
            [weight, scale_kn],
            [dq],
            axis=0,
            block_size=bs,
            name=(node.name or dq) + "_dq",
        ),  # fmt: skip
        helper.make_node("MatMul", [node.input[0], dq], list(node.output), name=node.name or None),
    ]


LOWERINGS = {"onnxruntime": lower_onnxruntime, "tensorrt": lower_tensorrt}
