"""Read safetensors files as memory-mapped numpy arrays.

The format is an 8-byte header length, a JSON header and raw little-endian data. Mapping the file
means a large embedding table costs memory only for the rows a request touches.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "F64": np.float64,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def header(path: str | Path) -> dict[str, dict]:
    """The file's tensor table (name -> dtype, shape, offsets), read without its data; a file
    too short for its header or for a tensor's bytes (truncated), or a header that is no JSON
    object of well-formed entries, is a ValueError."""
    return _header(Path(path))[0]


def _header(path: Path) -> tuple[dict[str, dict], int]:
    """``header``'s table, and where the data starts."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("too short for a safetensors header")
        (header_len,) = struct.unpack("<Q", head)
        raw = f.read(header_len)
    if len(raw) != header_len:
        raise ValueError(f"header of {header_len} bytes, file ends after {len(raw)}")
    table = json.loads(raw)
    if not isinstance(table, dict):
        raise ValueError("the header is not a JSON object")
    base, size = 8 + header_len, path.stat().st_size
    for name, info in table.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        ok = (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in offsets)
            and 0 <= offsets[0] <= offsets[1]
        )
        if not ok:
            raise ValueError(f"tensor {name} has no valid data_offsets")
        if base + offsets[1] > size:
            raise ValueError(
                f"tensor {name} needs bytes up to {base + offsets[1]}, but the file holds "
                f"{size} (truncated?)"
            )
    return table, base


def load(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of the file, as read-only memory-mapped arrays."""
    path = Path(path)
    try:
        table, base = _header(path)  # every tensor within the file, or a ValueError naming it
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    out: dict[str, np.ndarray] = {}
    for name, info in table.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        start, end = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        if end - start != count * np.dtype(dtype).itemsize:
            raise ValueError(f"{path}: tensor {name} has inconsistent offsets")
        out[name] = np.memmap(path, dtype=dtype, mode="r", offset=base + start, shape=shape)
    return out


_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}


def save(path: str | Path, tensors: dict[str, np.ndarray]) -> None:
    """Write tensors in the safetensors format, atomically (temp file, then rename)."""
    import os
    import tempfile

    path = Path(os.path.realpath(path))  # through a symlink to its file, as ``>`` writes
    header: dict[str, object] = {}
    offset = 0
    arrays = []
    for name, value in tensors.items():
        arr = np.ascontiguousarray(value)
        code = _CODES.get(arr.dtype)
        if code is None:
            raise ValueError(f"tensor {name}: dtype {arr.dtype} cannot be saved")
        header[name] = {
            "dtype": code,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + arr.nbytes],
        }
        offset += arr.nbytes
        arrays.append(arr)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keep the data 8-byte aligned
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for arr in arrays:
                f.write(arr.tobytes())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
