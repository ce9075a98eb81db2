"""The row state allocator: every tensor a component declares (graph_schema.state), held for
``max_batch`` rows in the engine's buffers and bound in place by name.

One allocator serves every kind a request carries between calls: attention KV (a decoder's,
the code predictor's per-frame cache), a linear-attention layer's recurrent and convolution
state, a vocoder's carried state. A request holds rows; the allocator moves, snapshots and
resets them by kind (kv copies a row's first ``length`` positions, the others whole), and
counts their bytes for the footprint. What the declaration says is what is bound: no binding
guesses which input is a cache from its shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.graph_schema import GraphError
from edgeomni.graph_schema.state import StateTensor, check_io, parse_state
from edgeomni.runtime.artifacts import ArtifactError
from edgeomni.runtime.buffers import Array, Buffers, HostBuffers
from edgeomni.runtime.engine import Binding, Engine


def declared(cfg: Mapping[str, Any], where: Path | str = "config.json") -> tuple[StateTensor, ...]:
    """The state a component's config declares; an ArtifactError naming the entry at fault
    (a config without ``state`` was written before components declared it: rebuild)."""
    if "state" not in cfg:
        raise ArtifactError(where, "declares no state (an engine built before edgeomni declared "
                            "row state: rebuild it with edge-build)")  # fmt: skip
    try:
        return parse_state(cfg["state"])
    except GraphError as e:
        raise ArtifactError(where, str(e)) from None


def engine_io(engine: Engine) -> tuple[dict[str, Any], dict[str, Any]]:
    """An opened engine's inputs and outputs as check_io takes them (name -> (dtype, dims)),
    dims unknown (None) where the engine does not say them (an engine says its outputs')."""

    def side(names: Sequence[str], types: Mapping[str, Any],
             shapes: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
        return {n: (np.dtype(types[n]).name if n in types else None,
                    tuple(shapes.get(n, ())) or None) for n in names}  # fmt: skip

    return (side(engine.input_names, engine.input_types, {}),
            side(engine.output_names, engine.output_types, engine.output_shapes))  # fmt: skip


def check_engine(state: Sequence[StateTensor], engine: Engine, where: Path | str) -> None:
    """The declaration against an opened engine's inputs and outputs (ArtifactError)."""
    inputs, outputs = engine_io(engine)
    if not inputs:
        return  # an engine that does not list its inputs is checked by its first call
    try:
        check_io(state, inputs, outputs)
    except GraphError as e:
        raise ArtifactError(where, f"its state does not match the engine: {e}") from None


def check_declared(cfg: Mapping[str, Any], model: Path, where: Path | str) -> None:
    """An ONNX engine's declared state against its inputs and outputs, read from the file
    (``edge-infer --validate-config`` opens no engine); ArtifactError naming the entry."""
    from edgeomni.runtime.onnx_header import read_io

    inputs, outputs = read_io(model)
    tensors = declared(cfg, where)
    try:
        check_io(tensors, inputs, outputs)
    except GraphError as e:
        raise ArtifactError(where, f"its state does not match {model.name}: {e}") from None


class RowState:
    """The declared tensors, ``rows`` rows each, in ``buffers`` (the engine's: on a GPU the
    state never leaves device memory). ``capacity``: a kv row's positions."""

    def __init__(
        self,
        tensors: Sequence[StateTensor],
        rows: int,
        capacity: int | None = None,
        buffers: Buffers | None = None,
    ) -> None:
        self.tensors = tuple(tensors)
        self.max_batch = rows
        self.capacity = capacity
        self.buffers = buffers = buffers or HostBuffers()
        self.arrays: dict[str, Array] = {
            t.name: buffers.zeros((rows, *t.row_shape(capacity)), np.dtype(t.dtype))
            for t in self.tensors
        }  # np.zeros maps pages lazily: capacity never touched costs no memory
        self.graph_slots: dict[tuple[Any, ...], Any] = {}  # decoder.DecoderSession's, by shape

    @classmethod
    def for_engine(
        cls,
        cfg: Mapping[str, Any],
        rows: int,
        engine: Engine,
        capacity: int | None = None,
        where: Path | str = "config.json",
    ) -> RowState:
        """The state a component's config declares, checked against its engine, held where
        the engine binds it."""
        tensors = declared(cfg, where)
        check_engine(tensors, engine, where)
        return cls(tensors, rows, capacity, engine.buffers)

    def of_kind(self, *kinds: str) -> list[Array]:
        """The buffers of the tensors of these kinds, in declaration order."""
        return [self.arrays[t.name] for t in self.tensors if t.kind in kinds]

    def nbytes(self) -> int:
        """All rows of every tensor (what the footprint counts)."""
        return self.max_batch * sum(t.row_bytes(self.capacity) for t in self.tensors)

    def bind(self, binding: Binding, rows: int, start: int = 0) -> None:
        """Bind rows start..start+rows (contiguous) of every tensor as its input and output,
        a kv tensor with its capacity."""
        if start + rows > self.max_batch:
            raise ValueError(f"rows {start}..{start + rows} exceed the state's {self.max_batch}")
        at = self.buffers.rows
        for t in self.tensors:
            cap = self.capacity if t.kind == "kv" else None
            binding.bind_in_place(t.input, t.output, at(self.arrays[t.name], rows, start),
                                  capacity=cap)  # fmt: skip

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Row ``src`` into row ``dst`` (a request moving to a lower row): a kv tensor's first
        ``length`` positions along its capacity axis, the others (no such axis) whole."""
        for t in self.tensors:
            self.buffers.copy_row(self.arrays[t.name], src, dst, length, t.capacity_axis)

    def reset_rows(self, start: int, n: int = 1) -> None:
        """Rows a new request takes: every tensor but kv zeroed (a kv row needs none: the
        lengths fed with it hide what an earlier request left)."""
        for t in self.tensors:
            if t.kind != "kv":
                self.buffers.fill_zero(self.buffers.rows(self.arrays[t.name], n, start))

    def snapshot(self, row: int) -> dict[str, Array]:
        """A copy of one row, in the engine's memory, that later writes to the row leave as
        it is."""
        out: dict[str, Array] = {}
        for t in self.tensors:
            one = self.buffers.rows(self.arrays[t.name], 1, row)
            out[t.name] = self.buffers.copy(one)
        return out

    def restore(self, row: int, snap: Mapping[str, Array]) -> None:
        """A snapshot into a row, whole."""
        for t in self.tensors:
            self.buffers.copy_into(self.buffers.rows(self.arrays[t.name], 1, row), snap[t.name])

    # -- rows in any order (a call over rows that are not one run) -----------------------------
    def gather(self, name: str, rows: Sequence[int]) -> Array:
        """Tensor ``name``'s rows, in this order: a view where they are one ascending run, else
        a copy."""
        buf, memory = self.arrays[name], self.buffers
        start = _run(rows)
        if start is not None:
            return memory.rows(buf, len(rows), start)
        t = next(t for t in self.tensors if t.name == name)
        out = memory.zeros((len(rows), *t.row_shape(self.capacity)), np.dtype(t.dtype))
        for i, r in enumerate(rows):
            memory.copy_into(memory.rows(out, 1, i), memory.rows(buf, 1, r))
        return out

    def scatter(self, name: str, rows: Sequence[int], src: Array) -> None:
        """``src``'s rows (a call's new state, in the order of ``rows``) into those rows."""
        buf, memory = self.arrays[name], self.buffers
        start = _run(rows)
        if start is not None:
            memory.copy_into(memory.rows(buf, len(rows), start), src)
            return
        for i, r in enumerate(rows):
            memory.copy_into(memory.rows(buf, 1, r), memory.rows(src, 1, i))


def _run(rows: Sequence[int]) -> int | None:
    """The first row where ``rows`` are one ascending run, else None."""
    if not rows:
        return None
    first = rows[0]
    return first if all(r == first + i for i, r in enumerate(rows)) else None


class RowPool:
    """Rows handed to requests one at a time (a vocoder's streams: no scheduler assigns their
    rows), the lowest free first so rows stepping together tend to be one run; it grows by
    doubling when all are taken (the rows held move with it: ``generation`` counts the moves,
    so a holder of views knows to take them again)."""

    def __init__(self, tensors: Sequence[StateTensor], buffers: Buffers, rows: int = 1) -> None:
        self.state = RowState(tensors, rows, buffers=buffers)
        self._free = list(range(rows))
        self.generation = 0

    @property
    def free(self) -> int:
        """Rows free now (0: the next ``take`` grows the pool)."""
        return len(self._free)

    def take(self) -> int:
        """A free row, zeroed (a new request's state)."""
        if not self._free:
            self._grow()
        row = min(self._free)
        self._free.remove(row)
        self.state.reset_rows(row)
        return row

    def release(self, row: int) -> None:
        if row in self._free or not 0 <= row < self.state.max_batch:
            raise ValueError(f"row {row} is not taken")
        self._free.append(row)

    def _grow(self) -> None:
        old = self.state
        rows = 2 * old.max_batch
        self.state = RowState(old.tensors, rows, old.capacity, old.buffers)
        for t in old.tensors:
            new = self.state.buffers.rows(self.state.arrays[t.name], old.max_batch)
            self.state.buffers.copy_into(new, old.arrays[t.name])
        self._free.extend(range(old.max_batch, rows))
        self.generation += 1

    def views(self, row: int) -> list[Array]:
        """One row of every tensor, in declaration order (views: valid until the pool grows)."""
        s = self.state
        return [s.buffers.rows(s.arrays[t.name], 1, row) for t in s.tensors]
