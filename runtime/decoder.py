"""One cohort's calls into a decoder engine (thinker, talker, code predictor, plain LLM).

The KV cache stays bound in place for the whole cohort; outputs land in arrays allocated once per
shape; each call passes embeddings, positions and per-row lengths. Rows are right-padded to the
call's width, and a row with query length 0 sits the call out (its cache is left untouched).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeomni.runtime.buffers import Buffers
from edgeomni.runtime.engine import Binding, Engine
from edgeomni.runtime.row_state import RowState
from edgeomni.runtime.sampling import StepLogits

# one-token calls (decode steps) repeat one shape for a whole cohort, so on a GPU they run as
# captured CUDA graphs; wider calls do not (prefill; and a graph freezes GroupQueryAttention's
# total length at the capacity, which onnxruntime before 1.32 refuses for several new tokens)
GRAPH_WIDTHS = (1,)
TOPK_OUTPUTS = ("topk_values", "topk_indices")


class StepOutputs(Mapping[str, np.ndarray]):
    """One call's outputs as host arrays. Host buffers are returned as they are (the next call
    overwrites them); device buffers are copied to the host on first access, so what the host
    never reads (full logits, mostly) never leaves the GPU."""

    def __init__(self, rows: int, buffers: Mapping[str, Any], memory: Buffers) -> None:
        """``memory``: the engine's ``buffers``, where these outputs live."""
        self.rows = rows
        self._buffers = dict(buffers)
        self._memory = memory
        self._host: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._host:
            self.fetch(name)
        return self._host[name]

    def buffer(self, name: str) -> Any:
        """The output where the engine left it (on a GPU, in device memory), for another engine
        to read without a copy to the host; the next call of this session overwrites it."""
        return self._buffers[name]

    def fetch(self, *names: str) -> None:
        """Bring these outputs to the host, with one synchronisation for all of them (names
        this call did not output are passed over)."""
        queued = False
        for name in names:
            buf = self._buffers.get(name)
            if buf is None or name in self._host:
                continue
            self._host[name] = self._memory.to_host(buf, wait=False)
            queued = queued or self._memory.resident(buf)  # a device buffer: a copy queued
        if queued:
            self._memory.synchronize()

    def __contains__(self, name: object) -> bool:
        """Whether the call outputs ``name``: nothing fetched (Mapping's own would read it)."""
        return name in self._buffers

    def __iter__(self) -> Iterator[str]:
        return iter(self._buffers)

    def __len__(self) -> int:
        return len(self._buffers)

    def logits(self) -> StepLogits:
        """What sampling reads: the engine's top-K when it has one; full rows on demand."""

        def full(rows: np.ndarray) -> np.ndarray:
            return np.asarray(self["logits"], np.float32)[rows]

        if "topk_values" not in self._buffers:
            return StepLogits(self.rows, full)
        self.fetch(*TOPK_OUTPUTS)
        return StepLogits(self.rows, full, self["topk_values"], self["topk_indices"])


@dataclass
class _Slot:
    """The engine bound at one call shape: cache rows and output buffers at fixed addresses
    (what a captured CUDA graph replays against; its inputs are the binding's)."""

    binding: Binding
    outputs: dict[str, Any]
    graph: int | None = None
    # copies made for the last call, kept until the next one (a queued call may still read them)
    held: list[Any] = field(default_factory=list)


class DecoderSession:
    def __init__(
        self,
        engine: Engine,
        state: RowState,
        rows: int,
        outputs: Mapping[str, tuple[int, ...]],
        *,
        per_position: tuple[str, ...] = (),
        first_row: int = 0,
    ) -> None:
        """``outputs``: name -> shape after the batch axis, e.g. {"logits": (V,)}; names in
        ``per_position`` also carry the call's width, [rows, S, *shape]. An engine's top-K
        outputs are added to them. ``first_row``: the cache rows start there (a one-row session
        over row r of a cohort's cache)."""
        self.rows = rows
        self.engine = engine
        self.state = state
        self.first_row = first_row
        self._shapes = dict(outputs)
        for name in TOPK_OUTPUTS:
            if name in engine.output_names:
                self._shapes[name] = (int(engine.output_shapes[name][-1]),)
        self._per_position = per_position
        self._slots: dict[int, _Slot] = {}  # by width, calls not graphed
        # time inside the engine's run calls (on a GPU up to the end of its kernels, since ONNX
        # Runtime synchronises its providers at the end of a run); the rest is the host's work
        self.engine_seconds = 0.0

    def _new_slot(self, width: int, graphed: bool) -> _Slot:
        binding = self.engine.binding()
        self.state.bind(binding, self.rows, self.first_row)
        out: dict[str, Any] = {}
        for name, shape in self._shapes.items():
            full = (self.rows, width, *shape) if name in self._per_position else (self.rows, *shape)
            dtype = self.engine.output_types.get(name, np.dtype(np.float32))
            out[name] = self.engine.buffers.zeros(full, dtype)  # a GPU's stay there until read
            binding.bind_output(name, out[name])
        return _Slot(binding, out, self.engine.new_graph_id() if graphed else None)

    def _slot(self, width: int, feeds: Mapping[str, np.ndarray], tag: int | None) -> _Slot:
        if not (self.engine.replays_steps and width in GRAPH_WIDTHS):
            slot = self._slots.get(width)
            if slot is None:
                slot = self._slots[width] = self._new_slot(width, False)
            return slot
        # graphed slots live with the cache they bind, so later cohorts replay the same graphs
        key = (id(self.engine), self.rows, self.first_row, width, tag,
               tuple((k, v.shape) for k, v in sorted(feeds.items())))  # fmt: skip
        slot = self.state.graph_slots.get(key)
        if slot is None:
            slot = self.state.graph_slots[key] = self._new_slot(width, True)
        return slot

    def run(
        self,
        embeds: Any,
        positions: np.ndarray,
        past_lens: np.ndarray,
        query_lens: np.ndarray,
        last_indices: np.ndarray,
        *,
        tag: int | None = None,
        wait: bool = True,
        **extra: np.ndarray,
    ) -> StepOutputs:
        """One call. ``embeds`` [rows, S, H]: a host array, or on a GPU a buffer another engine
        (or an earlier call) wrote, read where it is. ``tag``: graphed calls with
        different tags get their own graph and input buffers, so a call that repeats each frame
        with the same lengths and positions (a code predictor step) sends only what changed.
        ``wait=False``: on a GPU, return once the call is queued (calls that feed each other
        on the device, read by the host only at the end)."""
        width = embeds.shape[1]
        feeds = {
            "inputs_embeds": embeds,
            "position_ids": positions.astype(np.int64),
            "past_lens": past_lens.astype(np.int32),
            "query_lens": query_lens.astype(np.int32),
            "last_indices": last_indices.astype(np.int64),
            **extra,
        }
        memory = self.engine.buffers
        types = self.engine.input_types
        for name, value in feeds.items():  # float feeds in the engine's dtype (fp16 on a GPU)
            if value.dtype.kind != "f" or name not in types:
                continue
            if not memory.resident(value):
                feeds[name] = np.ascontiguousarray(value, types[name])
            elif value.dtype != types[name]:  # a device buffer is read as it is
                raise ValueError(f"{name}: a {value.dtype} device buffer for a {types[name]} input")
        slot = self._slot(width, feeds, tag)
        if slot.graph is None:
            slot.held = []
            outputs = slot.outputs.values()
            for name, value in feeds.items():  # an earlier call's output, bound as an output
                if memory.overlaps(value, outputs):  # again
                    feeds[name] = memory.copy(value)
                    slot.held.append(feeds[name])
        # graphed: the binding copies the inputs into buffers of its own (what the lowering's
        # lengths are and what a captured graph freezes is the engine's)
        start = time.perf_counter()
        slot.binding.run(feeds, graph=slot.graph, wait=wait)
        self.engine_seconds += time.perf_counter() - start
        return StepOutputs(self.rows, slot.outputs, memory)


def right_pad(rows: list[np.ndarray], width: int | None = None) -> np.ndarray:
    """Stack [len_i, ...] arrays into [n, width, ...], zero-padded at the right."""
    width = width or max(len(r) for r in rows)
    out = np.zeros((len(rows), width, *rows[0].shape[1:]), rows[0].dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def text_positions(past_lens: np.ndarray, width: int, mrope: bool) -> np.ndarray:
    """Positions past_len + i for each row; with MRoPE all three axes take them."""
    pos = past_lens.astype(np.int64)[:, None] + np.arange(width, dtype=np.int64)[None, :]
    return np.broadcast_to(pos, (3, *pos.shape)).copy() if mrope else pos
