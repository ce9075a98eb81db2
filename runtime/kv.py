"""The KV cache: one fixed-capacity buffer per layer and kind, updated in place by the engine."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgeomni.runtime.buffers import Buffers, HostBuffers
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
        buffers: Buffers | None = None,
    ) -> None:
        """``buffers``: where the cache lives, the engine's (on a GPU the cache never leaves
        device memory); host arrays by default."""
        shape = (max_batch, kv_heads, capacity, head_dim)
        self.capacity = capacity
        self.max_batch = max_batch
        self.graph_slots: dict[tuple[Any, ...], Any] = {}  # decoder.DecoderSession's, by shape
        self.buffers = buffers = buffers or HostBuffers()
        self.keys = [buffers.zeros(shape, dtype) for _ in range(layers)]
        self.values = [buffers.zeros(shape, dtype) for _ in range(layers)]

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
            buffers=engine.buffers,
        )

    def bind(self, binding: Binding, rows: int, start: int = 0) -> None:
        """Bind rows start..start+rows (contiguous) as the engine's cache."""
        if start + rows > self.max_batch:
            raise ValueError(f"rows {start}..{start + rows} exceed the cache's {self.max_batch}")
        at = self.buffers.rows
        for i, (k, v) in enumerate(zip(self.keys, self.values, strict=True)):
            binding.bind_in_place(f"past_key_{i}", f"present_key_{i}", at(k, rows, start))
            binding.bind_in_place(f"past_value_{i}", f"present_value_{i}", at(v, rows, start))

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Copy row ``src``'s first ``length`` positions of every layer into row ``dst`` (a
        request moving to a lower row, so a draining batch calls fewer rows)."""
        for buf in (*self.keys, *self.values):
            self.buffers.copy_row(buf, src, dst, length)
