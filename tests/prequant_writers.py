"""Pre-quantized checkpoints made from a float one, each as its publisher writes it, together
with the float checkpoint of the same weights dequantized (the reference its engine must match).

AWQ, GPTQ and FP8 are written here by their published packing rules (AutoAWQ's
WQLinear_GEMM.from_linear, AutoGPTQ's QuantLinear.pack, the block-scaled FP8 of Qwen's and
DeepSeek's -FP8 releases): their libraries need CUDA builds that do not install on this CPU.
compressed-tensors' pack-quantized checkpoints are written by compressed-tensors itself, and
their reference weights are its own decompression.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)

# one linear [N, K] -> (stored tensors by suffix, the dequantized [N, K] float32 reference)
Writer = Callable[[torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]]


def pack8(values: np.ndarray, axis: int) -> np.ndarray:
    """Eight 4-bit values per int32 along ``axis``, the first in the low nibble."""
    v = np.moveaxis(values.astype(np.uint32), axis, -1)
    v = v.reshape(*v.shape[:-1], -1, 8)
    words = np.zeros(v.shape[:-1], np.uint32)
    for j in range(8):
        words |= v[..., j] << np.uint32(4 * j)
    return np.moveaxis(words.view(np.int32), -1, axis)


def _asymmetric(w: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """AWQ's zero-point rounding: codes [N, K], fp16 scales and zero points [N, K/g]."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = g.min(-1), g.max(-1)
    scales = np.maximum(hi - lo, 1e-5) / 15
    zeros = np.clip(np.rint(-lo / scales), 0, 15)
    scales = scales.astype(np.float16)
    q = np.clip(np.rint(g / scales.astype(np.float32)[..., None]) + zeros[..., None], 0, 15)
    return q.reshape(n, k).astype(np.uint8), scales, zeros.astype(np.uint8)


def _deq(q: np.ndarray, scales: np.ndarray, zeros: np.ndarray, group: int) -> torch.Tensor:
    n, k = q.shape
    w = q.reshape(n, k // group, group).astype(np.float32) - zeros[..., None].astype(np.float32)
    return torch.from_numpy((w * scales.astype(np.float32)[..., None]).reshape(n, k))


def awq(group: int) -> tuple[Writer, dict[str, Any]]:
    def write(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        q, scales, zeros = _asymmetric(weight.float().numpy(), group)
        order = list(AWQ_ORDER)

        def interleave(a: np.ndarray) -> np.ndarray:  # [rows, N]: nibble i of each 8 = AWQ_ORDER[i]
            return a.reshape(a.shape[0], -1, 8)[:, :, order].reshape(a.shape)

        stored = {
            "qweight": pack8(interleave(q.T), 1),
            "qzeros": pack8(interleave(zeros.T), 1),
            "scales": np.ascontiguousarray(scales.T),
        }
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in stored.items()}, _deq(
            q, scales, zeros, group
        )

    config = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
              "version": "gemm", "modules_to_not_convert": None}  # fmt: skip
    return write, config


def gptq(group: int, v1: bool = True, g_idx: np.ndarray | None = None) -> tuple[Writer, dict]:
    """Symmetric GPTQ (zero point 8, scale = amax / 7.5 as GPTQ's sym quantizer has it)."""

    def write(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        w = weight.float().numpy()
        n, k = w.shape
        size = k if group == -1 else group
        g = w.reshape(n, k // size, size)
        scales = (np.maximum(np.abs(g).max(-1), 1e-5) / 7.5).astype(np.float16)
        q = np.clip(np.rint(g / scales.astype(np.float32)[..., None]) + 8, 0, 15)
        q = q.reshape(n, k).astype(np.uint8)
        zeros = np.full(scales.shape, 8, np.uint8)
        stored = {
            "qweight": pack8(q.T, 0),  # [K/8, N]
            "qzeros": pack8((zeros - (1 if v1 else 0)).T, 1),  # [K/g, N/8]
            "scales": np.ascontiguousarray(scales.T),
            "g_idx": (np.arange(k) // size if g_idx is None else g_idx).astype(np.int32),
        }
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in stored.items()}, _deq(
            q, scales, zeros, size
        )

    config = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False,
              "sym": True, "checkpoint_format": "gptq" if v1 else "gptq_v2"}  # fmt: skip
    return write, config


def compressed_tensors(group: int, symmetric: bool) -> tuple[Writer, dict[str, Any]]:
    """compressed-tensors' own quantizer, packer and decompressor."""
    from compressed_tensors.compressors.pack_quantized import PackedQuantizationCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="group",
                            group_size=group)  # fmt: skip
    scheme = QuantizationScheme(targets=["Linear"], weights=args)

    def write(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        w = weight.float()
        n, k = w.shape
        g = w.reshape(n, k // group, group)
        scale, zero_point = calculate_qparams(g.amin(-1), g.amax(-1), args)
        state = {"weight": w, "weight_scale": scale, "weight_zero_point": zero_point}
        stored = PackedQuantizationCompressor.compress(state, scheme)
        reference = PackedQuantizationCompressor.decompress(stored, scheme)["weight"]
        return dict(stored), reference.float()

    config = QuantizationConfig(config_groups={"group_0": scheme}, format="pack-quantized",
                                quantization_status="compressed", ignore=["lm_head"])  # fmt: skip
    return write, config.model_dump(mode="json", exclude_none=True)


def fp8(block: tuple[int, int] = (128, 128)) -> tuple[Writer, dict[str, Any]]:
    """Block-scaled e4m3: each block divided by its largest magnitude / 448."""

    def write(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        w = weight.float()
        n, k = w.shape
        bn, bk = block
        rows, cols = -(-n // bn), -(-k // bk)
        scale = torch.empty(rows, cols)
        for i in range(rows):
            for j in range(cols):
                amax = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk].abs().max()
                scale[i, j] = torch.clamp(amax, min=1e-12) / 448.0
        full = scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
        q = (w / full).to(torch.float8_e4m3fn)
        return {"weight": q, "weight_scale_inv": scale}, q.float() * full

    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
              "weight_block_size": list(block)}  # fmt: skip
    return write, config


def write_pair(src: Path, pre: Path, deq: Path, writer: tuple[Writer, dict[str, Any]]) -> None:
    """``pre``: ``src`` with every decoder linear stored by the writer and its
    quantization_config; ``deq``: ``src`` with those linears replaced by the dequantized
    reference (the float checkpoint of the same weights)."""
    from safetensors.torch import load_file, save_file

    write, qconfig = writer
    shutil.copytree(src, pre)
    shutil.copytree(src, deq)
    for f in src.glob("*.safetensors"):
        tensors = load_file(f)
        stored, reference = {}, {}
        for name, t in tensors.items():
            stem, _, leaf = name.rpartition(".")
            if leaf == "weight" and stem.rpartition(".")[2] in LINEARS:
                parts, ref = write(t)
                stored.update({f"{stem}.{suffix}": v for suffix, v in parts.items()})
                reference[name] = ref.to(t.dtype).contiguous()
            else:
                stored[name] = reference[name] = t
        save_file(stored, pre / f.name, metadata={"format": "pt"})
        save_file(reference, deq / f.name, metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    (pre / "config.json").write_text(json.dumps({**config, "quantization_config": qconfig}))
