"""What an ONNX file says of itself, read without onnx or onnxruntime: that it is a whole
ModelProto with a graph, and which external data files its initializers read, from where.

``edge-infer --validate-config`` loads no engine, yet a truncated model, random bytes or an
external data file shorter than its tensors need would otherwise pass it and fail later (or
map past the end of a file). Protobuf's wire format is small enough to walk here: every field
is a key (field number and wire type) and a varint, a fixed-size value or a length-prefixed
blob, so the model is checked by skipping through it, never copying its weights.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# ModelProto, GraphProto and TensorProto field numbers (onnx.proto3)
_MODEL_IR_VERSION, _MODEL_GRAPH = 1, 7
_GRAPH_INITIALIZER, _GRAPH_INPUT, _GRAPH_OUTPUT = 5, 11, 12
# ValueInfoProto name/type; TypeProto.tensor_type; its elem_type/shape; a dim's value/param
_VALUE_NAME, _VALUE_TYPE, _TYPE_TENSOR, _TENSOR_ELEM, _TENSOR_SHAPE = 1, 2, 1, 1, 2
_SHAPE_DIM, _DIM_VALUE, _DIM_PARAM = 1, 1, 2
_DTYPE_NAMES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool",
                10: "float16", 11: "float64", 16: "bfloat16"}  # fmt: skip
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME = 1, 2, 8
_TENSOR_EXTERNAL_DATA, _TENSOR_LOCATION = 13, 14
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
# bits per element of each TensorProto.DataType (strings have no fixed size)
_BITS = {1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64,
         14: 64, 15: 128, 16: 16, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4}  # fmt: skip


class OnnxFileError(ValueError):
    """The file is not a whole ONNX model, or its external data does not hold its tensors."""


@dataclass(frozen=True)
class External:
    """An initializer whose bytes live in another file: ``location`` (relative to the model's
    folder), the byte range it reads there (``length`` None: the rest of the file)."""

    tensor: str
    location: str
    offset: int
    length: int | None


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end:
            raise OnnxFileError("it ends inside a field (truncated?)")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise OnnxFileError("a malformed varint: not an ONNX model")


def _fields(buf: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value or start, end) of each field in buf[pos:end]; a
    length-delimited field gives its bytes' start and end, others their value and 0."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise OnnxFileError("a field numbered 0: not an ONNX model")
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value, 0
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > end:
                raise OnnxFileError("it ends inside a field (truncated?)")
            yield number, wire, int.from_bytes(buf[pos : pos + size], "little"), 0
            pos += size
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if pos + length > end:
                raise OnnxFileError(
                    f"a field of {length} bytes runs past the end at byte {end} (truncated?)"
                )
            yield number, wire, pos, pos + length
            pos += length
        else:
            raise OnnxFileError(f"wire type {wire} at byte {pos}: not an ONNX model")


def _text(buf: memoryview, start: int, end: int) -> str:
    return bytes(buf[start:end]).decode("utf-8", "replace")


def _tensor(buf: memoryview, start: int, end: int) -> External | None:
    dims: list[int] = []
    dtype, name, location = 0, "", 0
    entries: dict[str, str] = {}
    for number, wire, a, b in _fields(buf, start, end):
        if number == _TENSOR_DIMS:
            if wire == 2:  # packed
                pos = a
                while pos < b:
                    dim, pos = _varint(buf, pos, b)
                    dims.append(dim)
            else:
                dims.append(a)
        elif number == _TENSOR_TYPE and wire == 0:
            dtype = a
        elif number == _TENSOR_NAME and wire == 2:
            name = _text(buf, a, b)
        elif number == _TENSOR_LOCATION and wire == 0:
            location = a
        elif number == _TENSOR_EXTERNAL_DATA and wire == 2:
            # a StringStringEntryProto: key (1) and value (2), the last of each counting
            entry = {n: _text(buf, x, y) for n, w, x, y in _fields(buf, a, b) if w == 2}
            entries[entry.get(1, "")] = entry.get(2, "")
    if location != _EXTERNAL:
        return None
    if not entries.get("location"):
        raise OnnxFileError(f"initializer {name!r} is external but names no file")
    try:
        offset = int(entries.get("offset", 0))
        length = int(entries["length"]) if "length" in entries else None
    except ValueError:
        raise OnnxFileError(f"initializer {name!r} has a malformed offset or length") from None
    if length is None and dtype in _BITS:
        length = (math.prod(dims) * _BITS[dtype] + 7) // 8
    return External(name, entries["location"], offset, length)


def read_externals(path: Path) -> list[External]:
    """Check that ``path`` is a whole ONNX model with a graph; its external initializers."""
    size = path.stat().st_size
    if size == 0:
        raise OnnxFileError("the file is empty")
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        buf = memoryview(mm)
        try:
            return _read(buf, size)
        finally:
            buf.release()


def _read(buf: memoryview, size: int) -> list[External]:
    graph: tuple[int, int] | None = None
    ir_version = None
    for number, wire, a, b in _fields(buf, 0, size):
        if number == _MODEL_GRAPH and wire == 2:
            graph = (a, b)
        elif number == _MODEL_IR_VERSION and wire == 0:
            ir_version = a
    if graph is None or ir_version is None:
        raise OnnxFileError("no graph or no IR version in it: not an ONNX model")
    out = []
    for number, wire, a, b in _fields(buf, *graph):
        if number == _GRAPH_INITIALIZER and wire == 2:
            ext = _tensor(buf, a, b)
            if ext is not None:
                out.append(ext)
    return out


Dims = tuple[int | str | None, ...]


def _value_info(buf: memoryview, start: int, end: int) -> tuple[str, str | None, Dims]:
    """A graph input's or output's name, dtype name (None where unnamed here) and dims (an
    int where fixed, the dim's parameter name or None where dynamic)."""
    name, dtype, dims = "", None, []
    for number, wire, a, b in _fields(buf, start, end):
        if number == _VALUE_NAME and wire == 2:
            name = _text(buf, a, b)
        elif number == _VALUE_TYPE and wire == 2:
            for n, w, x, y in _fields(buf, a, b):
                if n != _TYPE_TENSOR or w != 2:
                    continue
                for n2, w2, x2, y2 in _fields(buf, x, y):
                    if n2 == _TENSOR_ELEM and w2 == 0:
                        dtype = _DTYPE_NAMES.get(x2)
                    elif n2 == _TENSOR_SHAPE and w2 == 2:
                        for n3, w3, x3, y3 in _fields(buf, x2, y2):
                            if n3 != _SHAPE_DIM or w3 != 2:
                                continue
                            dim: int | str | None = None
                            for n4, w4, x4, y4 in _fields(buf, x3, y3):
                                if n4 == _DIM_VALUE and w4 == 0:
                                    dim = x4
                                elif n4 == _DIM_PARAM and w4 == 2:
                                    dim = _text(buf, x4, y4)
                            dims.append(dim)
    return name, dtype, tuple(dims)


def read_io(
    path: Path,
) -> tuple[dict[str, tuple[str | None, Dims]], dict[str, tuple[str | None, Dims]]]:
    """A model's graph inputs and outputs: name -> (dtype name, dims), read without onnx."""
    inputs: dict[str, tuple[str | None, Dims]] = {}
    outputs: dict[str, tuple[str | None, Dims]] = {}
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        buf = memoryview(mm)
        try:
            graph = next(((a, b) for n, w, a, b in _fields(buf, 0, len(buf))
                          if n == _MODEL_GRAPH and w == 2), None)  # fmt: skip
            if graph is None:
                raise OnnxFileError("no graph in it: not an ONNX model")
            for number, wire, a, b in _fields(buf, *graph):
                if wire == 2 and number in (_GRAPH_INPUT, _GRAPH_OUTPUT):
                    name, dtype, dims = _value_info(buf, a, b)
                    (inputs if number == _GRAPH_INPUT else outputs)[name] = (dtype, dims)
        finally:
            buf.release()
    return inputs, outputs


def check_onnx_file(path: Path) -> list[Path]:
    """An OnnxFileError naming the fault when ``path`` is not a whole model or an external
    data file it reads is missing or shorter than its tensors need; else the external data
    files it reads (the model's own inputs, beside it)."""
    externals = read_externals(path)
    folder = path.parent
    sizes: dict[str, int] = {}
    files: list[Path] = []
    for ext in externals:
        data = folder / ext.location
        if ext.location not in sizes:
            try:
                sizes[ext.location] = os.stat(data).st_size
            except OSError as e:
                raise OnnxFileError(
                    f"its external data {data} cannot be read ({e.strerror or e})"
                ) from None
            files.append(data)
        end = ext.offset + (ext.length or 0)
        if end > sizes[ext.location]:
            raise OnnxFileError(
                f"tensor {ext.tensor!r} reads bytes {ext.offset}..{end} of its external data "
                f"{data}, which holds {sizes[ext.location]} (truncated?)"
            )
    return files
