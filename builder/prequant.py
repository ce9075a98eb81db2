"""A pre-quantized checkpoint's int4 weights into the exported graph, as they are stored.

The export reads each quantized linear as its dequantized float value (export/common/
prequantized.py), so the exported graph is the float model of those weights and every family's
export code stays as it is. This pass then finds each MatMul (or Gemm) weight of that graph
whose every output column is a dequantized row the checkpoint stored as int4, and puts the
stored codes, scales and zero points in an edgeomni::QuantMatMul in its place (the same op and
lowerings as builder/quantize.py's). Rows are matched by content, so the exporter's names,
transposes and concatenations (q, k and v packed in one MatMul) do not matter, and each matched
weight is checked: the QuantMatMul's weight, dequantized, equals the float weight it replaces.

A weight only partly int4 in the checkpoint, or with groups no MatMulNBits block fits, stays the
float value it was read as, and the report says which and why; so does every int4 weight of the
checkpoint that no MatMul of the graph holds (MoE experts, which the graph packs per block).
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.export.common.prequantized import QuantizedLinear

log = logging.getLogger("edge-build")
MAX_BLOCK = 128  # MatMulNBits' largest block: bigger groups repeat their scale per block


def _key(row: np.ndarray) -> tuple[str, int, bytes]:
    return row.dtype.str, row.size, hashlib.blake2b(row.tobytes(), digest_size=16).digest()


Segment = tuple[str, QuantizedLinear]  # (linear name, the linear): rows of a graph weight


class RowIndex:
    """The first dequantized row of each of the checkpoint's int4 linears (as float32 and as
    float16) -> the linears starting so. Built once a build, reading every int4 linear once;
    a graph weight is then walked row by row: a row that starts a linear must be followed by
    the rest of that linear's rows, compared in full."""

    def __init__(self, read: Callable[[str], QuantizedLinear], names: Iterable[str]) -> None:
        self.read = functools.lru_cache(maxsize=8)(read)  # q, k, v of one layer, re-read
        self.starts: dict[tuple[str, int, bytes], list[str]] = {}
        for name in names:
            first = read(name).dequantized()[0]
            for dtype in (np.float32, np.float16):
                self.starts.setdefault(_key(first.astype(dtype)), []).append(name)

    def find(self, w_nk: np.ndarray) -> tuple[list[Segment] | None, str]:
        """The linears whose dequantized rows, one after another, are W [N, K] exactly; or
        None and why not ("" when no row of W is int4 in the checkpoint)."""
        segments: list[Segment] = []
        r = 0
        while r < w_nk.shape[0]:
            hit = None
            for name in self.starts.get(_key(np.ascontiguousarray(w_nk[r])), []):
                q = self.read(name)
                rows = q.codes.shape[0]
                deq = q.dequantized().astype(w_nk.dtype)
                if r + rows <= w_nk.shape[0] and np.array_equal(deq, w_nk[r : r + rows]):
                    hit = (name, q)
                    break
            if hit is None:
                return None, ("only partly int4 in the checkpoint" if segments else "")
            segments.append(hit)
            r += hit[1].codes.shape[0]
        return segments, ""


def block_for(group: int) -> int | None:
    """The MatMulNBits block that represents groups of ``group`` exactly, or None."""
    if group in (16, 32, 64, 128):
        return group
    if group > MAX_BLOCK and group % MAX_BLOCK == 0:
        return MAX_BLOCK
    return None


def assemble(
    segments: list[Segment], dtype: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int] | str:
    """The QuantMatMul inputs of the weight made of ``segments``: (packed [N, K/bs, bs/2],
    scales [N, K/bs] in ``dtype``, packed zero points or None when all are 8, bs); or why not."""
    from edgeomni.plugins import quant_linear

    groups = {q.group for _, q in segments}
    if len(groups) != 1:
        return f"linears of different group sizes {sorted(groups)}"
    group = groups.pop()
    bs = block_for(group)
    if bs is None:
        return f"int4 groups of {group}, which no MatMulNBits block (16 to 128) fits"
    codes = np.concatenate([q.codes for _, q in segments])
    repeat = group // bs
    scales = np.repeat(np.concatenate([q.scales for _, q in segments]), repeat, 1).astype(dtype)
    zeros = np.repeat(np.concatenate([q.zeros for _, q in segments]), repeat, axis=1)
    n, k = codes.shape
    packed = quant_linear.pack_codes(codes).reshape(n, k // bs, bs // 2)
    if np.all(zeros == quant_linear.SYMMETRIC_ZERO):
        return packed, scales, None, bs
    if zeros.shape[1] % 2:
        zeros = np.concatenate([zeros, np.zeros((n, 1), np.uint8)], axis=1)
    return packed, scales, quant_linear.pack_codes(zeros), bs


def apply_file(raw: Path, out: Path, index: RowIndex) -> dict[str, Any] | None:
    """apply() on the exported graph at ``raw``, saved to ``out`` when a weight was replaced."""
    import onnx

    from edgeomni.builder.quantize import save

    model = onnx.load(str(raw), load_external_data=False)
    report = apply(model, index, raw.parent)
    if report is not None and report["weights"]:
        save(model, raw, out)
    return report


def apply(model: Any, index: RowIndex, base_dir: Path | str = "") -> dict[str, Any] | None:
    """Replace each MatMul whose weight the checkpoint stored as int4 (in place); the report
    for the engine's config.json, or None when no weight of this graph is int4 in it."""
    from onnx import helper, numpy_helper

    from edgeomni.builder.quantize import _drop, _linear, weight_name
    from edgeomni.plugins import quant_linear

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    done: dict[tuple[str, bool], tuple[str, str, str | None, int, int, int]] = {}
    skipped: dict[str, str] = {}
    names: dict[str, str] = {}  # initializer -> the weight it is, as the log names it
    used: set[str] = set()
    sizes = [0, 0]
    nodes = []
    for i, node in enumerate(graph.node):
        linear = _linear(node, inits)
        if linear is None or linear[1] in skipped:
            nodes.append(node)
            continue
        x, w, transposed, bias = linear
        if (w, transposed) not in done:
            value = numpy_helper.to_array(inits[w], str(base_dir))
            if value.ndim != 2 or value.dtype not in (np.float32, np.float16):
                nodes.append(node)
                continue
            w_nk = value if transposed else value.T  # rows are output columns
            segments, why = index.find(w_nk)
            made = assemble(segments, value.dtype) if segments is not None else why
            if isinstance(made, str):
                if made:
                    skipped[w], names[w] = made, weight_name(node, w)
                nodes.append(node)
                continue
            packed, scales, zeros, bs = made
            n, k = w_nk.shape
            deq = quant_linear.dequantize(packed, scales, zeros, k=k, block_size=bs)
            if not np.array_equal(deq, np.ascontiguousarray(w_nk.T)):
                # the scales in the engine's float type move the weight (bfloat16 scales in a
                # float16 engine, say): it stays the float weight it was read as
                skipped[w] = f"its scales are not exact in {value.dtype}"
                names[w] = weight_name(node, w)
                nodes.append(node)
                continue
            stem = w + ("_t" if transposed else "") + "_q4"
            graph.initializer.append(numpy_helper.from_array(packed, stem))
            graph.initializer.append(numpy_helper.from_array(scales, stem + "_scales"))
            zname = None
            if zeros is not None:
                zname = stem + "_zeros"
                graph.initializer.append(numpy_helper.from_array(zeros, zname))
            done[w, transposed] = (stem, stem + "_scales", zname, k, n, bs)
            used.update(name for name, _ in segments)  # type: ignore[union-attr]
            sizes[0] += value.nbytes
            sizes[1] += packed.nbytes + scales.nbytes + (zeros.nbytes if zeros is not None else 0)
        packed_name, scales_name, zname, k, n, bs = done[w, transposed]
        y = node.output[0] if bias is None else node.output[0] + "_nobias"
        nodes.append(quant_linear.make_node(x, packed_name, scales_name, zname, y, k=k, n=n,
                                            block_size=bs, name=node.name or f"prequant_{i}"))  # fmt: skip
        if bias is not None:
            nodes.append(helper.make_node("Add", [y, bias], [node.output[0]]))
    if not done and not skipped:
        return None
    del graph.node[:]
    graph.node.extend(nodes)
    _drop(graph, {w for w, _ in done})
    if not any(o.domain == quant_linear.DOMAIN for o in model.opset_import):
        model.opset_import.add(domain=quant_linear.DOMAIN, version=quant_linear.VERSION)
    skipped = {names[k]: v for k, v in skipped.items()}
    if skipped:
        log.warning("int4 in the checkpoint but built float: %s",
                    "; ".join(f"{k} ({v})" for k, v in skipped.items()))  # fmt: skip
    blocks = sorted({v[5] for v in done.values()})
    return {
        "weights": len(done),
        "block_size": blocks[0] if len(blocks) == 1 else blocks,
        "zero_points": any(v[2] is not None for v in done.values()),
        "float_weights": skipped,
        "placed": used,
        "weight_bytes": {"float": sizes[0], "int4": sizes[1]},
    }
