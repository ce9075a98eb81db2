"""3-axis MRoPE positions for Qwen3-Omni and Qwen3-VL prompts, computed on the host in numpy.

Ports of transformers' ``get_rope_index``. The rule the two share (``grid_positions``): text and
audio tokens advance all three axes together; an image's merged patches take (t, h, w) grid
positions offset from the text before it, and the text after it resumes at the largest
position + 1. Without visual media, positions are plain 0..S-1 on all three axes (transformers
takes the same shortcut even when audio is present). ``rope_index`` is Qwen3-Omni's (text, audio
and images, found by their start tokens); ``vision_rope_index`` Qwen3-VL's (images and videos,
found as runs of their placeholder tokens, a video's frames each a grid of one temporal step,
as its processor separates them with timestamps).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MropeIds:
    """The token ids and settings the position rules depend on (from the thinker's config)."""

    image_token_id: int
    video_token_id: int
    audio_token_id: int
    vision_start_token_id: int
    audio_start_token_id: int
    spatial_merge_size: int = 2
    position_id_per_seconds: int = 25
    audio_n_window: int = 50


def audio_output_length(mel_frames: int, n_window: int = 50) -> int:
    """Audio tokens the encoder yields for ``mel_frames`` mel frames: it works in chunks of
    ``2 * n_window`` frames (13 tokens each after three stride-2 convolutions, with n_window
    50), and a remainder of ``r > 0`` frames gives ``ceil(ceil(ceil(r / 2) / 2) / 2)``."""
    chunk = n_window * 2
    leave = mel_frames % chunk
    feat = (leave - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (mel_frames // chunk) * 13


def grid_positions(grid: Sequence[int], merge: int, start: int, time_scale: int = 1) -> np.ndarray:
    """[3, t*h*w/merge^2] positions of one image's or video's merged patches: (t * time_scale,
    row, column), each offset by ``start`` (transformers' get_vision_position_ids)."""
    t, h, w = (int(v) for v in grid)
    gh, gw = h // merge, w // merge
    t_index = np.repeat(np.arange(t, dtype=np.int64) * time_scale, gh * gw)
    h_index = np.tile(np.repeat(np.arange(gh, dtype=np.int64), gw), t)
    w_index = np.tile(np.arange(gw, dtype=np.int64), t * gh)
    return np.stack([t_index, h_index, w_index]) + start


def vision_rope_index(
    input_ids: Sequence[int],
    image_token_id: int,
    video_token_id: int,
    *,
    image_grids: Sequence[tuple[int, int, int]] = (),
    video_grids: Sequence[tuple[int, int, int]] = (),
    merge: int = 2,
) -> tuple[np.ndarray, int]:
    """Qwen3-VL's positions [3, S] (int64) for one prompt and its decode delta: each run of
    image tokens is the next image's grid, each run of video tokens the next frame's (a video's
    grid split into t grids of one step); everything else is text."""
    tokens = np.asarray(input_ids, np.int64)
    if not image_grids and not video_grids:
        return np.broadcast_to(np.arange(len(tokens), dtype=np.int64), (3, len(tokens))).copy(), 0
    frames = [(1, h, w) for t, h, w in video_grids for _ in range(t)]
    grids = {image_token_id: iter(image_grids), video_token_id: iter(frames)}
    kinds = np.where(np.isin(tokens, (image_token_id, video_token_id)), tokens, -1)
    bounds = np.flatnonzero(np.diff(kinds)) + 1
    pieces: list[np.ndarray] = []
    pos = 0
    for run in np.split(np.arange(len(tokens)), bounds):
        kind = int(kinds[run[0]])
        if kind == -1:
            pieces.append(np.broadcast_to(np.arange(len(run), dtype=np.int64) + pos, (3, len(run))))
            pos += len(run)
            continue
        grid = next(grids[kind], None)
        if grid is None:
            raise ValueError("the prompt has more image or video placeholders than media")
        span = grid_positions(grid, merge, pos)
        if span.shape[1] != len(run):
            raise ValueError(f"placeholder tokens do not match the media: {len(run)} tokens for "
                             f"a grid of {span.shape[1]}")  # fmt: skip
        pieces.append(span)
        pos += max(grid[1], grid[2]) // merge
    if any(next(g, None) is not None for g in grids.values()):
        raise ValueError("the prompt has fewer image or video placeholders than media")
    positions = np.concatenate(pieces, axis=1)
    return positions, int(positions.max()) + 1 - len(tokens)


def rope_index(
    input_ids: Sequence[int],
    ids: MropeIds,
    *,
    image_grids: Sequence[tuple[int, int, int]] = (),
    audio_mel_frames: Sequence[int] = (),
) -> tuple[np.ndarray, int]:
    """Positions [3, S] (int64) for one prompt, and the delta decode positions add to past_len."""
    tokens = list(input_ids)
    if ids.video_token_id in tokens:
        raise ValueError("video inputs are not supported")
    if not image_grids:
        pos = np.broadcast_to(np.arange(len(tokens), dtype=np.int64), (3, len(tokens))).copy()
        return pos, 0
    pieces: list[np.ndarray] = []
    st = 0
    image_idx = audio_idx = 0  # the media placed so far
    image_start = (ids.vision_start_token_id, ids.image_token_id)
    n_images = sum(pair == image_start for pair in itertools.pairwise(tokens))
    n_audios = tokens.count(ids.audio_start_token_id)

    def next_start() -> int:
        return int(pieces[-1].max()) + 1 if pieces else 0

    def span(length: int, start: int) -> np.ndarray:
        return np.broadcast_to(np.arange(length, dtype=np.int64) + start, (3, length))

    for _ in range(n_images + n_audios):
        st_idx = next_start()
        big = len(tokens) + 1
        ed_vision = (
            tokens.index(ids.vision_start_token_id, st)
            if ids.image_token_id in tokens and image_idx < n_images
            else big
        )
        ed_audio = (
            tokens.index(ids.audio_start_token_id, st)
            if ids.audio_token_id in tokens and audio_idx < n_audios
            else big
        )
        min_ed = min(ed_vision, ed_audio)
        text_len = min_ed - st
        if text_len:
            pieces.append(span(text_len, st_idx))
            st_idx += text_len
        pieces.append(span(1, st_idx))  # the start token
        st_idx += 1
        if min_ed == ed_audio:
            length = audio_output_length(audio_mel_frames[audio_idx], ids.audio_n_window)
            pieces.append(span(length, st_idx))
            audio_idx += 1
        else:
            t, h, w = image_grids[image_idx]
            m = ids.spatial_merge_size
            pieces.append(grid_positions((t, h, w), m, st_idx, ids.position_id_per_seconds))
            length = t * h * w // (m * m)
            image_idx += 1
        st += text_len + 1 + length + 1
        pieces.append(span(1, next_start()))  # the end token
    if st < len(tokens):
        pieces.append(span(len(tokens) - st, next_start()))
    pos = np.concatenate(pieces, axis=1)
    if pos.shape[1] != len(tokens):
        raise ValueError(
            f"placeholder tokens do not match the media: {pos.shape[1]} positions for "
            f"{len(tokens)} tokens"
        )
    return pos, int(pos.max()) + 1 - len(tokens)
