"""Pre-quantized checkpoints read as they are published: AWQ (GEMM), GPTQ, compressed-tensors'
pack-quantized int4, and FP8 with block scales.

The checkpoint's ``quantization_config`` decides; a format not handled is one CheckpointError.
Every family reads weights by name through Checkpoint.tensor, so the readers sit behind it: a
quantized linear's ``<stem>.weight`` is served as its dequantized float value, computed as the
format defines it, and for the int4 formats its stored codes, scales and zero points are kept
(Prequantized.linears) so the builder writes them into the engine unchanged (builder/prequant.py)
instead of rounding anew. FP8 weights are read to float: no backend here runs FP8 weights.

Int4 layouts, each as its publisher packs it (W[k, n] = (q - z) * s, g the group size along K):
- AWQ GEMM (AutoAWQ): ``qweight`` int32 [K, N/8], ``qzeros`` int32 [K/g, N/8], ``scales``
  [K/g, N]; eight columns per int32 in the order 0, 2, 4, 6, 1, 3, 5, 7 (nibble i holds column
  AWQ_ORDER[i]); zero points 0..15 as stored.
- GPTQ (AutoGPTQ / GPTQModel): ``qweight`` int32 [K/8, N], eight rows of K per int32, low
  nibble first; ``qzeros`` int32 [K/g, N/8], eight columns per int32; ``scales`` [K/g, N];
  ``g_idx`` [K]. The "gptq" (v1) format stores each zero point minus one, "gptq_v2" as it is.
- compressed-tensors pack-quantized: ``weight_packed`` int32 [N, K/8], signed q + 8, eight of K
  per int32, low nibble first; ``weight_scale`` [N, K/g]; ``weight_shape``; asymmetric weights
  add ``weight_zero_point`` int32 [N/8, K/g], packed along N the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeomni.export.common.checkpoint import CheckpointError

INT4_FORMATS = ("awq", "gptq", "compressed-tensors")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# the published formats not read (yet): each named, so the refusal says what the file is
NOT_READ = {
    "bitsandbytes": "bitsandbytes",
    "hqq": "HQQ",
    "eetq": "EETQ",
    "aqlm": "AQLM",
    "exl2": "EXL2",
    "gguf": "GGUF",
    "mxfp4": "MXFP4",
    "modelopt": "ModelOpt",
    "torchao": "torchao",
}


@dataclass(frozen=True)
class QuantizedLinear:
    """One checkpoint linear's int4 weight as stored, in our terms ([N, K] like nn.Linear)."""

    codes: np.ndarray  # uint8 [N, K], 0..15
    scales: np.ndarray  # float [N, K/g], the checkpoint's dtype (float16 or float32)
    zeros: np.ndarray  # uint8 [N, K/g], 0..15 (8 throughout for a symmetric weight)
    group: int

    def dequantized(self) -> np.ndarray:
        """W [N, K] in float32: (q - z) * s per group, as the format defines it."""
        n, k = self.codes.shape
        q = self.codes.astype(np.float32).reshape(n, k // self.group, self.group)
        z = self.zeros.astype(np.float32)[:, :, None]
        s = self.scales.astype(np.float32)[:, :, None]
        return ((q - z) * s).reshape(n, k)


@dataclass(frozen=True)
class Scheme:
    """What ``quantization_config`` says, checked."""

    method: str  # awq | gptq | compressed-tensors | fp8
    bits: int = 4
    gptq_v1_zeros: bool = False  # GPTQ's "gptq" format: zero points stored minus one
    fp8_block: tuple[int, int] | None = None

    @property
    def int4(self) -> bool:
        return self.method in INT4_FORMATS

    def describe(self) -> str:
        if self.method == "fp8":
            return f"fp8 (e4m3, block {self.fp8_block[0]}x{self.fp8_block[1]})"  # type: ignore[index]
        return f"{self.method} int{self.bits}"


def scheme(config: dict[str, Any]) -> Scheme | None:
    """The checkpoint's quantization, or None for a float checkpoint; CheckpointError with one
    line for a format or variant not read."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    where = "config.json quantization_config"
    if not isinstance(qc, dict):
        raise CheckpointError(f"{where}: expected an object")
    method = str(qc.get("quant_method", "")).lower()
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise CheckpointError(
                f"{where}: AWQ version {version!r} is not read (only the GEMM packing)"
            )
        if qc.get("zero_point", True) is not True:
            raise CheckpointError(f"{where}: AWQ without zero points is not read")
        _bits(qc.get("w_bit", qc.get("bits", 4)), where)
        return Scheme("awq")
    if method == "gptq":
        _bits(qc.get("bits"), where)
        fmt = str(qc.get("checkpoint_format", "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise CheckpointError(f"{where}: GPTQ checkpoint_format {fmt!r} is not read "
                                  "(gptq and gptq_v2 are)")  # fmt: skip
        return Scheme("gptq", gptq_v1_zeros=fmt == "gptq")
    if method == "compressed-tensors":
        fmt = str(qc.get("format", "")).lower()
        if fmt != "pack-quantized":
            raise CheckpointError(f"{where}: compressed-tensors format {fmt!r} is not read "
                                  "(pack-quantized int4 is)")  # fmt: skip
        for name, group in (qc.get("config_groups") or {}).items():
            weights = (group or {}).get("weights") or {}
            if weights.get("type", "int") != "int" or weights.get("num_bits") != 4:
                raise CheckpointError(
                    f"{where}.config_groups.{name}.weights: only 4-bit int weights are read, "
                    f"not {weights.get('num_bits')}-bit {weights.get('type')}"
                )
            if weights.get("actorder") not in (None, False, "static", "weight"):
                raise CheckpointError(f"{where}.config_groups.{name}.weights: actorder "
                                      f"{weights.get('actorder')!r} is not read")  # fmt: skip
        return Scheme("compressed-tensors")
    if method == "fp8":
        block = qc.get("weight_block_size")
        if (not isinstance(block, list) or len(block) != 2
                or not all(isinstance(b, int) and b > 0 for b in block)):  # fmt: skip
            raise CheckpointError(f"{where}: FP8 without weight_block_size [rows, cols] is not "
                                  "read (block-scaled FP8 is)")  # fmt: skip
        return Scheme("fp8", bits=8, fp8_block=(block[0], block[1]))
    known = NOT_READ.get(method)
    raise CheckpointError(
        f"{where}: quant_method {method!r}"
        + (f" ({known})" if known else "")
        + " is not read; edgeomni reads awq, gptq, compressed-tensors pack-quantized and fp8 "
        "checkpoints, or a float checkpoint with edge-build --quantization"
    )


def stored_layout(config: dict[str, Any]) -> tuple[int, bool] | None:
    """(group size, -1 for a whole row; whether zero points are stored) of an int4
    checkpoint's linears, from its quantization_config alone (edge-build --estimate); None for
    a float or FP8 checkpoint."""
    found = scheme(config)
    if found is None or not found.int4:
        return None
    qc = config["quantization_config"]
    where = "quantization_config."
    if found.method == "awq":
        key = "group_size" if "group_size" in qc else "q_group_size"
        return _group_size(qc, key, where), True
    if found.method == "gptq":
        return _group_size(qc, "group_size", where), not qc.get("sym", True)
    name, group_ = next(iter((qc.get("config_groups") or {}).items()), ("", {}))
    weights = (group_ or {}).get("weights") or {}
    if weights.get("strategy") == "channel" or weights.get("group_size") is None:
        return -1, not weights.get("symmetric", True)
    group = _group_size(weights, "group_size", f"{where}config_groups.{name}.weights.")
    return group, not weights.get("symmetric", True)


def _group_size(sec: dict[str, Any], key: str, where: str) -> int:
    """A group size: an integer >= 1, or -1 for a whole row (128 where the key is absent)."""
    value = sec.get(key, 128)
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
        raise CheckpointError(f"config.json: {where}{key} must be an integer >= 1 (or -1 for "
                              f"a whole row), got {value!r}")  # fmt: skip
    return value


# what a declared format's linears are stored as: suffix -> the safetensors dtypes it may have
# (the marker first; the others must sit beside each marker)
FLOATS = ("F16", "BF16", "F32")
STORED_AS: dict[str, dict[str, tuple[str, ...]]] = {
    "awq": {"qweight": ("I32",), "qzeros": ("I32",), "scales": FLOATS},
    "gptq": {"qweight": ("I32",), "qzeros": ("I32",), "scales": FLOATS},
    "compressed-tensors": {"weight_packed": ("I32",), "weight_scale": FLOATS,
                           "weight_shape": ("I32", "I64")},
    "fp8": {"weight_scale_inv": FLOATS, "weight": ("F8_E4M3",)},
}  # fmt: skip


def check_stored(found: Scheme, dtypes: dict[str, str]) -> None:
    """The checkpoint's tensors (name -> safetensors dtype) hold what its quantization_config
    declares: at least one linear stored in the format, each with its companions of the
    format's dtypes. Else a CheckpointError naming the config key and a tensor that disagrees:
    a float checkpoint with a stale quantization_config would build float while the estimate
    and the log said int4."""
    where = "config.json: quantization_config.quant_method"
    layout = STORED_AS[found.method]
    marker = next(iter(layout))
    stems = [n[: -len(marker)] for n in dtypes if n.endswith("." + marker)]
    listed = ", ".join(f"<linear>.{k} {'/'.join(v)}" for k, v in layout.items())
    if not stems:
        floats = [n for n, d in dtypes.items() if n.endswith("proj.weight") and d in FLOATS]
        example = f"; {floats[0]} is {dtypes[floats[0]]}" if floats else ""
        raise CheckpointError(
            f"{where} {found.method!r} declares {found.describe()} weights, but no tensor is "
            f"stored so (its linears are {listed}){example}: a float checkpoint builds without "
            "quantization_config"
        )
    for stem in stems:
        for suffix, allowed in layout.items():
            name = stem + suffix
            if name not in dtypes:
                raise CheckpointError(f"{where} {found.method!r}: {stem}{marker} has no "
                                      f"{name} beside it ({listed})")  # fmt: skip
            if dtypes[name] not in allowed:
                raise CheckpointError(f"{where} {found.method!r}: {name} is {dtypes[name]}, "
                                      f"not {' or '.join(allowed)} ({listed})")  # fmt: skip


def stored_dtypes(weight_files: dict[str, Any]) -> dict[str, str]:
    """Tensor name -> its safetensors dtype ("I32", "F16", ...), from the shards' headers."""
    from safetensors import safe_open

    out: dict[str, str] = {}
    by_shard: dict[Any, list[str]] = {}
    for name, shard in weight_files.items():
        by_shard.setdefault(shard, []).append(name)
    for shard, names in by_shard.items():
        with safe_open(str(shard), framework="pt") as f:
            out.update((n, f.get_slice(n).get_dtype()) for n in names)
    return out


def _bits(value: Any, where: str) -> None:
    if value != 4:
        raise CheckpointError(f"{where}: {value}-bit weights are not read (4-bit are)")


# ---------------------------------------------------------------------------------------------
# Readers: the stored tensors of one linear -> QuantizedLinear (or a float weight for FP8)
# ---------------------------------------------------------------------------------------------
MARKERS = {"awq": "qweight", "gptq": "qweight", "compressed-tensors": "weight_packed",
           "fp8": "weight_scale_inv"}  # fmt: skip


def nibbles(packed: np.ndarray, axis: int) -> np.ndarray:
    """int32 words -> their eight 4-bit values, low nibble first, unpacked along ``axis``."""
    words = packed.astype(np.int64) & 0xFFFFFFFF
    shifts = np.arange(0, 32, 4, dtype=np.int64)
    values = ((words[..., None] >> shifts) & 0xF).astype(np.uint8)  # [..., 8]
    if axis == 1:
        return values.reshape(packed.shape[0], -1)
    return np.moveaxis(values, -1, 1).reshape(-1, packed.shape[1])


def _group(k: int, blocks: int, where: str) -> int:
    if blocks <= 0 or k % blocks:
        raise CheckpointError(f"{where}: K={k} is not a whole number of {blocks} groups")
    return k // blocks


def read_awq(get: Any, stem: str) -> QuantizedLinear:
    qweight = _np(get(stem + "qweight"))
    qzeros = _np(get(stem + "qzeros"))
    scales = _np(get(stem + "scales"))
    reverse = np.argsort(AWQ_ORDER)  # column j of each eight is nibble reverse[j]
    codes = nibbles(qweight, 1)  # [K, N] in packed order
    k, n = codes.shape
    codes = codes.reshape(k, n // 8, 8)[:, :, reverse].reshape(k, n)
    zeros = nibbles(qzeros, 1)
    zeros = zeros.reshape(zeros.shape[0], -1, 8)[:, :, reverse].reshape(zeros.shape[0], -1)
    _shape(scales, (zeros.shape[0], n), stem + "scales")
    return QuantizedLinear(codes.T.copy(), scales.T.copy(), zeros[:, :n].T.copy(),
                           _group(k, scales.shape[0], stem + "scales"))  # fmt: skip


def read_gptq(get: Any, stem: str, v1_zeros: bool, has: Any) -> QuantizedLinear:
    codes = nibbles(_np(get(stem + "qweight")), 0)  # [K, N]
    k, n = codes.shape
    scales = _np(get(stem + "scales"))
    zeros = nibbles(_np(get(stem + "qzeros")), 1)[:, :n].astype(np.int16)
    _shape(scales, (zeros.shape[0], n), stem + "scales")
    group = _group(k, scales.shape[0], stem + "scales")
    if has(stem + "g_idx"):
        _contiguous_groups(_np(get(stem + "g_idx")), k, group, stem + "g_idx")
    if v1_zeros:
        zeros = zeros + 1
        if zeros.max() > 15:
            raise CheckpointError(f"{stem}qzeros: a zero point of 16 (GPTQ v1 stores zero "
                                  "minus one; 0 wrapped) has no 4-bit form")  # fmt: skip
    return QuantizedLinear(codes.T.copy(), scales.T.copy(), zeros.astype(np.uint8).T.copy(), group)


def _contiguous_groups(g_idx: np.ndarray, k: int, group: int, name: str) -> None:
    """Refuse act-order weights: groups that are not contiguous runs of K."""
    if not np.array_equal(g_idx.astype(np.int64).reshape(-1), np.arange(k) // group):
        raise CheckpointError(
            f"{name}: act-order (desc_act) weights, whose groups are not contiguous runs of "
            "K, are not read; quantize without act-order"
        )


def read_compressed(get: Any, stem: str, has: Any) -> QuantizedLinear:
    n, k = (int(v) for v in _np(get(stem + "weight_shape")))
    codes = nibbles(_np(get(stem + "weight_packed")), 1)[:, :k]  # signed q + 8
    scales = _np(get(stem + "weight_scale"))
    if scales.ndim == 1:
        scales = scales[:, None]
    _shape(codes, (n, k), stem + "weight_packed")
    group = _group(k, scales.shape[1], stem + "weight_scale")
    if has(stem + "weight_g_idx"):
        _contiguous_groups(_np(get(stem + "weight_g_idx")), k, group, stem + "weight_g_idx")
    if has(stem + "weight_zero_point"):
        zeros = nibbles(_np(get(stem + "weight_zero_point")), 0)[:n]
    else:
        zeros = np.full(scales.shape, 8, np.uint8)
    _shape(zeros, scales.shape, stem + "weight_zero_point")
    return QuantizedLinear(codes, scales, zeros, group)


def dequantize_fp8(weight: Any, scale_inv: Any, block: tuple[int, int]) -> Any:
    """An FP8 [N, K] weight times its [ceil(N/bn), ceil(K/bk)] block scales, in float32."""
    import torch

    w = weight.to(torch.float32)
    s = scale_inv.to(torch.float32)
    s = s.repeat_interleave(block[0], 0)[: w.shape[0]].repeat_interleave(block[1], 1)
    return w * s[:, : w.shape[1]]


def _np(t: Any) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:
        t = t.to(torch.float32)
    return t.numpy()


def _shape(a: np.ndarray, want: tuple[int, ...], name: str) -> None:
    if tuple(a.shape) != tuple(want):
        raise CheckpointError(f"{name}: shape {tuple(a.shape)}, expected {tuple(want)}")


@dataclass
class Prequantized:
    """The readers behind a checkpoint with a quantization_config: which ``<stem>.weight`` names
    are served from quantized tensors, and each int4 linear read again on demand (nothing is
    kept: a 30B checkpoint's codes alone are 15 GB)."""

    scheme: Scheme
    stored: set[str]  # the checkpoint's own tensor names
    get: Any = field(repr=False)  # stored name -> torch tensor as stored
    served: set[str] = field(default_factory=set)  # <stem>.weight names the exports read
    placed: set[str] = field(default_factory=set)  # linears an engine holds as stored
    row_index: Any = field(default=None, repr=False)  # the builder's, made once a build

    @property
    def marker(self) -> str:
        return "." + MARKERS[self.scheme.method]

    def virtual(self) -> set[str]:
        """The ``<stem>.weight`` names the readers serve that are not stored as such."""
        return set(self.linear_names()) - self.stored

    def linear_names(self) -> list[str]:
        """Every quantized linear's ``<stem>.weight``, in the checkpoint's order."""
        m = self.marker
        return sorted(n[: -len(m)] + ".weight" for n in self.stored if n.endswith(m))

    def serves(self, name: str) -> bool:
        if not name.endswith(".weight"):
            return False
        return name[: -len(".weight")] + self.marker in self.stored

    def linear(self, name: str) -> QuantizedLinear:
        """The int4 linear ``<stem>.weight`` as stored."""
        stem = name[: -len("weight")]
        has = self.stored.__contains__
        if self.scheme.method == "awq":
            return read_awq(self.get, stem)
        if self.scheme.method == "gptq":
            return read_gptq(self.get, stem, self.scheme.gptq_v1_zeros, has)
        return read_compressed(self.get, stem, has)

    def tensor(self, name: str) -> Any:
        """``<stem>.weight`` as float32 torch, from the stored tensors that make it."""
        import torch

        self.served.add(name)
        if self.scheme.method == "fp8":
            stem = name[: -len("weight")]
            return dequantize_fp8(self.get(name), self.get(stem + "weight_scale_inv"),
                                  self.scheme.fp8_block)  # type: ignore[arg-type]  # fmt: skip
        return torch.from_numpy(self.linear(name).dequantized())


def fp8_note(ckpt: Any, dtype: str) -> str:
    """What reading an FP8 checkpoint to ``dtype`` costs, in one line."""
    from safetensors import safe_open

    count, elements = 0, 0
    marker = "." + MARKERS["fp8"]
    for name, shard in ckpt.weight_files.items():
        if name.endswith(marker):
            weight = name[: -len(marker)] + ".weight"
            with safe_open(str(ckpt.weight_files.get(weight, shard)), framework="pt") as f:
                shape = f.get_slice(weight).get_shape()
            count += 1
            elements += int(np.prod(shape))
    per = {"float32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 2)
    return (
        f"{ckpt.path}: {count} FP8 weights (block-scaled e4m3) are read to {dtype}: no backend "
        f"here runs FP8 weights, so they take {elements * per / 1e9:.2f} GB instead of "
        f"{elements / 1e9:.2f} GB; add --quantization int4_rtn to round them to int4"
    )
