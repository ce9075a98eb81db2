"""The Qwen3 vision encoder (Qwen3-Omni's, Qwen3-VL's, Qwen3.5's): image/video patches -> merged
embeddings + DeepStack features (none where its config lists no DeepStack taps: Qwen3.5).

The engine (export.media.vision_encoder) takes every data-dependent index as an input, so
they are computed here in numpy from ``grid_thw``, each equal to what transformers'
``vision_utils`` helpers compute in torch (same float32 operations for the interpolation
weights):

- ``pos_indices``/``pos_weights`` [N, 4]: bilinear (align_corners) taps into the learned
  ``side x side`` position grid, resampled to each item's (h, w) patch grid;
- ``rotary_ids`` [N, 2]: each patch's (row, column) for the 2-D rotary embedding;
- the segment layout: each temporal frame of each item attends only to itself, so frame ``f``
  becomes batch row ``f`` of the plugin attention, right-padded to the longest frame.

Tokens are in merge-block order (the order image.py beside this file patchifies in):
frame-major, then ``merge x merge`` blocks in raster order, then raster order inside a block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime.artifacts import Artifact, check_folder
from edgeomni.runtime.engine import Engine, open_engine
from edgeomni.runtime.media.image import ImageSettings
from edgeomni.runtime.media.video import VideoSettings

__all__ = ["VisualEncoder", "interpolation_taps", "rotary_ids", "segment_layout"]


def _grid(grid_thw: Any, merge: int) -> np.ndarray:
    grid = np.asarray(grid_thw, dtype=np.int64).reshape(-1, 3)
    if (grid <= 0).any() or (grid[:, 1:] % merge).any():
        raise ValueError(f"grid_thw {grid.tolist()}: h and w must be positive multiples of {merge}")
    return grid


def _frame_rows_cols(h: int, w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of each patch of one frame, in merge-block order."""
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    rows, cols = (a.reshape(shape).transpose(0, 2, 1, 3).ravel() for a in (rows, cols))
    return rows, cols


def rotary_ids(grid_thw: Any, merge: int) -> np.ndarray:
    """int64 [N, 2]: ``get_vision_position_ids`` (h, w per patch, repeated for every frame)."""
    parts = []
    for t, h, w in _grid(grid_thw, merge).tolist():
        rows, cols = _frame_rows_cols(h, w, merge)
        parts.append(np.tile(np.stack([rows, cols], -1), (t, 1)))
    return np.concatenate(parts).astype(np.int64)


def _axis_taps(index: np.ndarray, size: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear, align_corners taps [n, 2] and float32 weights along one axis (HF's math)."""
    src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
    floor = np.floor(src)
    offsets = np.arange(2, dtype=np.float32)
    taps = np.clip(floor.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
    distance = np.abs(src[:, None] - floor[:, None] - offsets)
    return taps, np.maximum(np.float32(1) - distance, np.float32(0))


def interpolation_taps(grid_thw: Any, side: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """``get_vision_interpolation_indices_and_weights(mode="bilinear", align_corners=True)``:
    int64 [N, 4] indices into the flattened side x side grid and float32 [N, 4] weights."""
    indices, weights = [], []
    for t, h, w in _grid(grid_thw, merge).tolist():
        rows, cols = _frame_rows_cols(h, w, merge)
        h_taps, h_w = _axis_taps(rows, h, side)
        w_taps, w_w = _axis_taps(cols, w, side)
        idx = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4)
        wts = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, 4)
        indices.append(np.tile(idx, (t, 1)))
        weights.append(np.tile(wts, (t, 1)))
    return np.concatenate(indices), np.concatenate(weights).astype(np.float32)


def segment_layout(grid_thw: Any, merge: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One attention row per frame: (segment_tokens int64 [B, S], segment_lens int32 [B],
    token_slots int64 [N]). Padding slots repeat the row's last token; their output is dropped."""
    lens = np.concatenate([np.full(t, h * w) for t, h, w in _grid(grid_thw, merge).tolist()])
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    width = int(lens.max())
    slot = np.arange(width)
    tokens = starts[:, None] + np.minimum(slot[None], lens[:, None] - 1)
    slots = np.concatenate([r * width + np.arange(n) for r, n in enumerate(lens.tolist())])
    return tokens.astype(np.int64), lens.astype(np.int32), slots.astype(np.int64)


ARTIFACT = Artifact(
    keys=("spatial_merge_size", "num_grid_per_side", "patch_dim", "out_hidden_size",
          "deepstack_visual_indexes"),
    component="visual",
)  # fmt: skip


class VisualEncoder:
    """Encode images and videos (patches from image.py's ``preprocess``) with the visual engine."""

    def __init__(self, folder: str | Path, *, threads: int | None = None) -> None:
        folder = Path(folder)
        self.config = cfg = check_folder(folder, ARTIFACT).config
        self.engine: Engine = open_engine(folder, cfg, threads=threads)
        self.merge = int(cfg["spatial_merge_size"])
        self.side = int(cfg["num_grid_per_side"])
        self.patch_dim = int(cfg["patch_dim"])
        self.out_hidden = int(cfg["out_hidden_size"])
        self.deepstack_layers = len(cfg["deepstack_visual_indexes"])
        # the checkpoint's image and video processor settings, when the build copied them (for
        # image.py and video.py)
        processor = cfg.get("image_processor")
        self.image_settings = ImageSettings.from_config(processor) if processor else None
        video = cfg.get("video_processor")
        self.video_settings = VideoSettings.from_config(video) if video else None

    def inputs(self, pixel_values: np.ndarray, grid_thw: Any) -> dict[str, np.ndarray]:
        """The engine's feeds: the patches plus every index computed from ``grid_thw``."""
        grid = _grid(grid_thw, self.merge)
        n = int(grid.prod(axis=1).sum())
        pixel_values = np.ascontiguousarray(pixel_values, dtype=np.float32)
        if pixel_values.shape != (n, self.patch_dim):
            raise ValueError(
                f"pixel_values {pixel_values.shape} do not match grid_thw {grid.tolist()}: "
                f"expected ({n}, {self.patch_dim})"
            )
        pos_indices, pos_weights = interpolation_taps(grid, self.side, self.merge)
        segment_tokens, segment_lens, token_slots = segment_layout(grid, self.merge)
        return {
            "pixel_values": pixel_values,
            "pos_indices": pos_indices,
            "pos_weights": pos_weights,
            "rotary_ids": rotary_ids(grid, self.merge),
            "segment_tokens": segment_tokens,
            "segment_lens": segment_lens,
            "token_slots": token_slots,
        }

    def encode(
        self, pixel_values: np.ndarray, grid_thw: Any
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """(embeds float32 [N/m^2, out_hidden], deepstack float32 [K, N/m^2, out_hidden] or None
        without DeepStack) for the items of ``grid_thw`` ((t, h, w) or [items, 3]) packed in
        order in pixel_values."""
        feeds = self.inputs(pixel_values, grid_thw)
        merged = feeds["pixel_values"].shape[0] // (self.merge * self.merge)
        embeds = np.empty((merged, self.out_hidden), np.float32)
        binding = self.engine.binding()
        binding.bind_output("image_embeds", embeds)
        deepstack = None
        if self.deepstack_layers:
            deepstack = np.empty((self.deepstack_layers, merged, self.out_hidden), np.float32)
            binding.bind_output("deepstack", deepstack)
        binding.run(feeds)
        return embeds, deepstack
