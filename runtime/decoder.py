"""One cohort's calls into a decoder engine (thinker, talker, code predictor, plain LLM).

The KV cache stays bound in place for the whole cohort; outputs land in arrays allocated once per
shape; each call passes embeddings, positions and per-row lengths. Rows are right-padded to the
call's width, and a row with query length 0 sits the call out (its cache is left untouched).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edgeomni.runtime.engine import Engine
from edgeomni.runtime.kv import KVCache


class DecoderSession:
    def __init__(
        self,
        engine: Engine,
        kv: KVCache,
        rows: int,
        outputs: Mapping[str, tuple[int, ...]],
        *,
        per_position: tuple[str, ...] = (),
        first_row: int = 0,
    ) -> None:
        """``outputs``: name -> shape after the batch axis, e.g. {"logits": (V,)}; names in
        ``per_position`` also carry the call's width, [rows, S, *shape]. ``first_row``: the cache
        rows start there (a one-row session over row r of a cohort's cache)."""
        self.rows = rows
        self.engine = engine
        self.binding = engine.binding()
        kv.bind(self.binding, rows, first_row)
        self._shapes = dict(outputs)
        self._per_position = per_position
        self._buffers: dict[tuple[str, int], np.ndarray] = {}
        for name, shape in outputs.items():
            if name not in per_position:
                self._buffer(name, (rows, *shape))

    def _buffer(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        key = (name, shape[1] if name in self._per_position else 0)
        buf = self._buffers.get(key)
        if buf is None:  # outputs the host reads, in the engine's own dtype
            buf = self._buffers[key] = np.empty(
                shape, self.engine.output_types.get(name, np.float32)
            )
        self.binding.bind_output(name, buf)
        return buf

    def run(
        self,
        embeds: np.ndarray,
        positions: np.ndarray,
        past_lens: np.ndarray,
        query_lens: np.ndarray,
        last_indices: np.ndarray,
        **extra: np.ndarray,
    ) -> dict[str, np.ndarray]:
        width = embeds.shape[1]
        out = {}
        for name, shape in self._shapes.items():
            if name in self._per_position:
                out[name] = self._buffer(name, (self.rows, width, *shape))
            else:
                out[name] = self._buffers[(name, 0)]
        feeds = {
            "inputs_embeds": embeds,
            "position_ids": positions.astype(np.int64),
            "past_lens": past_lens.astype(np.int32),
            "query_lens": query_lens.astype(np.int32),
            "last_indices": last_indices.astype(np.int64),
            **extra,
        }
        if "gqa_seqlens_k" in self.engine.input_names:  # lengths the lowering left to the host
            total = feeds["past_lens"] + feeds["query_lens"]
            feeds["gqa_seqlens_k"] = np.maximum(total - 1, 0).astype(np.int32)
            feeds["gqa_total_length"] = np.array(total.max(), np.int32)
        types = self.engine.input_types
        for name, value in feeds.items():  # float feeds in the engine's dtype (fp16 on a GPU)
            if value.dtype.kind == "f" and name in types:
                feeds[name] = np.ascontiguousarray(value, types[name])
        self.binding.run(feeds)
        return out


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
