"""The KV cache: one fixed-capacity buffer per layer and kind, updated in place by the engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgeomni.runtime.engine import Binding, Engine


class KVCache:
    """[max_batch, kv_heads, capacity, head_dim] per layer for keys and values.

    Allocated once (np.zeros maps pages lazily, so untouched capacity costs no memory); a cohort
    of n rows binds the first n rows, which are contiguous.
    """

    def __init__(
        self,
        layers: int,
        max_batch: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype: type[np.generic] = np.float32,
        alloc: Callable[[tuple[int, ...], Any], Any] = np.zeros,
    ) -> None:
        """``alloc(shape, dtype)``: where the buffers live, the engine's ``zeros`` (on a GPU
        the cache never leaves device memory)."""
        shape = (max_batch, kv_heads, capacity, head_dim)
        self.capacity = capacity
        self.max_batch = max_batch
        self.graph_slots: dict[tuple[Any, ...], Any] = {}  # decoder.DecoderSession's, by shape
        self.keys = [alloc(shape, dtype) for _ in range(layers)]
        self.values = [alloc(shape, dtype) for _ in range(layers)]

    @classmethod
    def for_decoder(cls, cfg: dict[str, Any], rows: int, capacity: int, engine: Engine) -> KVCache:
        """The cache a decoder engine's config.json describes, where that engine binds it."""
        return cls(
            int(cfg["num_hidden_layers"]),
            rows,
            int(cfg["num_key_value_heads"]),
            capacity,
            int(cfg["head_dim"]),
            dtype=np.dtype(cfg.get("dtype", "float32")).type,
            alloc=engine.zeros,
        )

    @staticmethod
    def _rows(buffer: Any, rows: int, start: int) -> Any:
        if isinstance(buffer, np.ndarray):
            return buffer[start : start + rows]
        return buffer.rows(rows, start)

    def bind(self, binding: Binding, rows: int, start: int = 0) -> None:
        """Bind rows start..start+rows (contiguous) as the engine's cache."""
        if start + rows > self.max_batch:
            raise ValueError(f"rows {start}..{start + rows} exceed the cache's {self.max_batch}")
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            binding.bind_in_place(f"past_key_{i}", f"present_key_{i}", self._rows(k, rows, start))
            binding.bind_in_place(
                f"past_value_{i}", f"present_value_{i}", self._rows(v, rows, start)
            )

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy row ``src``'s first ``length`` positions of every layer into row ``dst`` (a
        request moving to a lower row, so a draining batch calls fewer rows)."""
        for buffers in (self.keys, self.values):
            for buf in buffers:
                if isinstance(buf, np.ndarray):
                    buf[dst, :, :length] = buf[src, :, :length]
                else:  # the whole row on the device: one contiguous copy
                    buf.rows(1, dst).copy_from(buf.rows(1, src))
