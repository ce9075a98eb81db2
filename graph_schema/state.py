"""A component's declared row state: the tensors a request carries from one engine call to the
next (the ``state`` list of its folder's config.json), written by the export, read by the
runtime's allocator (runtime/row_state.py), the graph validator and ``--estimate``.

Each tensor is one engine input bound to the matching output in place (the engine updates it),
``max_batch`` rows of ``shape`` each. ``kind`` says how a row is moved, snapshotted and reset:

- ``kv``: attention keys or values; the axis named ``capacity`` holds positions, and only a
  row's first ``length`` of them mean anything (copies take those; a new request needs no reset,
  since its lengths hide what is there);
- ``recurrent``, ``conv``: a linear-attention state and a convolution's carried columns, read
  whole by every call (a new request's row is zeroed);
- ``opaque``: any other carried tensor (a vocoder's), read whole, zeroed for a new request.

``lengths`` names the length inputs the engine reads beside it (which rows a call advances).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .model import GraphError

KINDS = ("kv", "recurrent", "conv", "opaque")
CAPACITY = "capacity"  # the symbolic axis of a kv tensor's positions
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int8": 1}
_KEYS = ("name", "kind", "input", "output", "shape", "dtype", "lengths")


@dataclass(frozen=True)
class StateTensor:
    """One declared state tensor of a component (per row)."""

    name: str
    kind: str
    input: str  # the engine input the rows are bound as
    output: str  # the engine output written into the same memory
    shape: tuple[int | str, ...]  # per row; a kv tensor has one axis named CAPACITY
    dtype: str
    lengths: tuple[str, ...] = ()

    @property
    def capacity_axis(self) -> int | None:
        """Where the positions are in the row shape (kv only), else None."""
        return self.shape.index(CAPACITY) if CAPACITY in self.shape else None

    def row_shape(self, capacity: int | None = None) -> tuple[int, ...]:
        """The row's shape with the capacity filled in (a kv tensor needs one)."""
        if self.capacity_axis is not None and capacity is None:
            raise ValueError(f"state {self.name}: a kv tensor's shape needs a capacity")
        return tuple(capacity if d == CAPACITY else d for d in self.shape)  # type: ignore[misc]

    def row_bytes(self, capacity: int | None = None) -> int:
        n = DTYPE_BYTES[self.dtype]
        for d in self.row_shape(capacity):
            n *= d
        return n

    def describe(self) -> dict[str, Any]:
        """The config.json entry."""
        return {"name": self.name, "kind": self.kind, "input": self.input, "output": self.output,
                "shape": list(self.shape), "dtype": self.dtype,
                "lengths": list(self.lengths)}  # fmt: skip


def parse_state(value: Any, path: str = "$.state") -> tuple[StateTensor, ...]:
    """The ``state`` list of a component config; GraphError naming the entry at fault."""
    if not isinstance(value, list):
        raise GraphError(path, "must be a list of state tensors")
    out: list[StateTensor] = []
    names: set[str] = set()
    for i, entry in enumerate(value):
        at = f"{path}[{i}]"
        if not isinstance(entry, Mapping):
            raise GraphError(at, "must be an object")
        unknown = sorted(set(entry) - set(_KEYS))
        missing = [k for k in _KEYS[:6] if k not in entry]
        if unknown or missing:
            what = f"unknown keys {unknown}" if unknown else f"missing {missing}"
            raise GraphError(at, f"{what} (a state tensor has {', '.join(_KEYS)})")
        for key in ("name", "input", "output"):
            if not isinstance(entry[key], str) or not entry[key]:
                raise GraphError(f"{at}.{key}", "must be a non-empty string")
        if entry["kind"] not in KINDS:
            raise GraphError(f"{at}.kind", f"{entry['kind']!r} is not one of {', '.join(KINDS)}")
        if entry["dtype"] not in DTYPE_BYTES:
            raise GraphError(f"{at}.dtype", f"{entry['dtype']!r}: one of {sorted(DTYPE_BYTES)}")
        shape = entry["shape"]
        ok = isinstance(shape, list) and all(
            d == CAPACITY or (isinstance(d, int) and not isinstance(d, bool) and d > 0)
            for d in shape
        )
        if not ok:
            raise GraphError(f"{at}.shape", f"must list positive sizes or {CAPACITY!r}")
        caps = shape.count(CAPACITY)
        if (entry["kind"] == "kv") != (caps == 1) or caps > 1:
            raise GraphError(f"{at}.shape", f"a kv tensor, and only one, has one {CAPACITY!r} axis")
        lengths = entry.get("lengths", [])
        if not isinstance(lengths, list) or not all(isinstance(n, str) for n in lengths):
            raise GraphError(f"{at}.lengths", "must be a list of input names")
        if entry["name"] in names:
            raise GraphError(f"{at}.name", f"{entry['name']!r} is declared twice")
        names.add(entry["name"])
        out.append(StateTensor(entry["name"], entry["kind"], entry["input"], entry["output"],
                               tuple(shape), entry["dtype"], tuple(lengths)))  # fmt: skip
    return tuple(out)


ATTENTION_LENGTHS = ("past_lens", "query_lens")


def kv_tensors(
    layers: int, kv_heads: int, head_dim: int, dtype: str, ids: Sequence[int] | None = None
) -> list[StateTensor]:
    """The row state of attention layers (each of ``ids``, default 0..layers-1): a key and a
    value of [kv_heads, capacity, head_dim] each, bound as past_<kind>_<i>/present_<kind>_<i>."""
    return [
        StateTensor(
            f"{kind}_{i}",
            "kv",
            f"past_{kind}_{i}",
            f"present_{kind}_{i}",
            (kv_heads, CAPACITY, head_dim),
            dtype,
            ATTENTION_LENGTHS,
        )  # fmt: skip
        for i in (range(layers) if ids is None else ids)
        for kind in ("key", "value")
    ]


Dims = Sequence[int | str | None]  # an engine tensor's dims; a name or None where dynamic
IO = Mapping[str, tuple[str | None, Dims | None]]  # name -> (dtype, dims); None: not known


def check_io(state: Sequence[StateTensor], inputs: IO, outputs: IO, path: str = "$.state") -> None:
    """The declaration against the engine's inputs and outputs: each tensor's input and
    output exist, with its dtype and rank, and its fixed sizes where the engine's are fixed
    (what the engine leaves unsaid is not checked); its length inputs exist. GraphError
    naming the entry otherwise."""
    for i, t in enumerate(state):
        at = f"{path}[{i}]"
        for key, name, side in (("input", t.input, inputs), ("output", t.output, outputs)):
            if name not in side:
                raise GraphError(f"{at}.{key}", f"the engine has no {key} {name!r}")
            dtype, dims = side[name]
            if dtype is not None and dtype != t.dtype:
                raise GraphError(f"{at}.dtype", f"{t.dtype}, but the engine's {name} is {dtype}")
            if dims is None:
                continue
            if len(dims) != len(t.shape) + 1:
                raise GraphError(f"{at}.shape", f"{len(t.shape)} axes per row, but the engine's "
                                 f"{name} has {len(dims)} (rows first)")  # fmt: skip
            for axis, (want, got) in enumerate(zip(t.shape, dims[1:], strict=True)):
                if isinstance(want, int) and isinstance(got, int) and want != got:
                    raise GraphError(f"{at}.shape[{axis}]", f"{want}, but the engine's {name} "
                                     f"has {got}")  # fmt: skip
        for name in t.lengths:
            if name not in inputs:
                raise GraphError(f"{at}.lengths", f"the engine has no input {name!r}")
