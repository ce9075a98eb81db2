"""Video input for the Qwen3 vision encoders in numpy: frames in, patches and timestamps out.

What transformers' ``Qwen3VLVideoProcessor`` and ``Qwen3VLProcessor`` do to a video, step for
step, so the encoder sees the numbers it was exported against and the prompt reads the same
timestamps:

1. frames: a video file decoded with PyAV (the ``video`` extra) and sampled as the processor's
   ``sample_frames`` samples (``fps`` frames a second of the source, clamped to
   [min_frames, max_frames] and the frame count, ``np.linspace(...).round()``), or a list of
   frame images taken as they are (the processor samples no list of images).
2. the video's ``smart_resize``: every frame to one size, multiples of ``patch * merge`` with
   frames x pixels inside [min_pixels, max_pixels] (``size``'s shortest and longest edge), then
   torchvision's uint8 bicubic antialiased resize (image.torch_resize);
3. rescale and normalise fused, in float32: ``(x - mean / rescale) / (std / rescale)``;
4. the last frame repeated up to a multiple of ``temporal_patch_size``, then patchify
   (image.patchify): grid (t, h, w) with t = frames / temporal_patch_size;
5. one timestamp per temporal group: the mean of its first and last frame's time (frame index
   / source fps), as ``Qwen3VLProcessor._calculate_timestamps`` computes it, rendered
   ``<{t:.1f} seconds>`` before that group's placeholder tokens.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from edgeomni.runtime.media.image import (
    MAX_IMAGE_PIXELS,
    ImageSettings,
    load_image,
    patchify,
    smart_resize,
    torch_resize,
)

__all__ = ["Video", "VideoSettings", "frame_timestamps", "load_frames", "preprocess_video",
           "read_video", "sample_indices", "smart_resize_video"]  # fmt: skip

# the source frame rate the processor assumes for frames that come without one
DEFAULT_SOURCE_FPS = 24.0
VIDEO_EXTRA = "pip install 'edgeomni[video]' (PyAV)"


@dataclass(frozen=True)
class VideoSettings(ImageSettings):
    """A checkpoint's video processor settings; defaults are Qwen3VLVideoProcessor's."""

    patch_size: int = 16
    min_pixels: int = 128 * 32 * 32
    max_pixels: int = 32 * 32 * 768
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    fps: float = 2.0  # frames sampled per second of a video file
    min_frames: int = 4
    max_frames: int = 768
    do_sample_frames: bool = True
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768
    SECTION: ClassVar[str] = "video_processor"

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> VideoSettings:
        """From video_preprocessor_config.json (flat) or processor_config.json's
        "video_processor" section."""
        cfg = dict(config.get(cls.SECTION, config))
        base = super().from_config(cfg)
        return dataclasses.replace(
            base,  # type: ignore[arg-type]
            fps=float(cfg.get("fps") or cls.fps),
            min_frames=int(cfg.get("min_frames", cls.min_frames)),
            max_frames=int(cfg.get("max_frames", cls.max_frames)),
            do_sample_frames=bool(cfg.get("do_sample_frames", cls.do_sample_frames)),
            cap_pixels_per_frame=bool(cfg.get("cap_pixels_per_frame") or False),
            max_video_tokens=int(cfg.get("max_video_tokens", cls.max_video_tokens)),
        )


@dataclass(frozen=True)
class Video:
    """Decoded frames and where they sit in time: uint8 [T, H, W, 3], each frame's index in
    the source and the source's frame rate (index / fps = its time in seconds)."""

    frames: np.ndarray
    indices: np.ndarray  # float64 [T]
    fps: float


def sample_indices(total: int, source_fps: float | None, settings: VideoSettings,
                   fps: float | None = None) -> np.ndarray:  # fmt: skip
    """``Qwen3VLVideoProcessor.sample_frames``: ``fps`` (default the settings') frames a second
    of a ``total``-frame source, at least min_frames, at most max_frames and ``total``."""
    fps = settings.fps if fps is None else fps
    source = DEFAULT_SOURCE_FPS if source_fps is None else source_fps
    n = int(total / source * fps)
    n = min(max(n, settings.min_frames), settings.max_frames, total)
    return np.linspace(0, total - 1, n).round().astype(int)


def load_frames(paths: Sequence[str | os.PathLike[str]], fps: float | None = None,
                timestamps: Sequence[float] | None = None,
                max_pixels: int = MAX_IMAGE_PIXELS) -> Video:  # fmt: skip
    """Frame image files as one video, all of them, in order: frame i at ``i / fps`` seconds
    (``fps`` default the processor's assumption, 24), or at ``timestamps[i]``; each within the
    image cap ``max_pixels``."""
    frames = [load_image(p, max_pixels) for p in paths]
    if any(f.shape != frames[0].shape for f in frames):
        sizes = sorted({f"{f.shape[1]}x{f.shape[0]}" for f in frames})
        raise ValueError(f"the frames of a video must have one size, got {', '.join(sizes)}")
    if timestamps is not None:
        if len(timestamps) != len(frames):
            raise ValueError(f"{len(timestamps)} timestamps for {len(frames)} frames")
        return Video(np.stack(frames), np.asarray(timestamps, np.float64), 1.0)
    return Video(np.stack(frames), np.arange(len(frames), dtype=np.float64),
                 DEFAULT_SOURCE_FPS if fps is None else float(fps))  # fmt: skip


def read_video(path: str | os.PathLike[str], settings: VideoSettings,
               fps: float | None = None) -> Video:  # fmt: skip
    """A video file decoded with PyAV and sampled as the processor samples (transformers'
    ``read_video_pyav``: the stream's frame count and average rate, frames decoded in order,
    converted to RGB). Needs PyAV, the ``video`` extra."""
    try:
        import av
    except ImportError:
        raise ImportError(f"reading video files needs PyAV: {VIDEO_EXTRA}") from None
    try:
        return _decode(av, path, settings, fps)
    except av.FFmpegError as e:  # FFmpeg's errors that are no OSError or ValueError already
        if isinstance(e, OSError | ValueError):
            raise
        raise ValueError(f"cannot decode: {e}") from None


def _decode(av: Any, path: str | os.PathLike[str], settings: VideoSettings,
            fps: float | None) -> Video:  # fmt: skip
    """read_video's decoding (``av`` the PyAV module)."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        total = int(stream.frames)
        rate = float(stream.average_rate) if stream.average_rate else None
        if total <= 0:  # a container that does not count its frames: decode to count them
            total = sum(1 for _ in container.decode(video=0))
            container.seek(0)
        if not settings.do_sample_frames:
            indices = np.arange(total)
        else:
            indices = sample_indices(total, rate, settings, fps)
        wanted, frames = set(indices.tolist()), []
        for i, frame in enumerate(container.decode(video=0)):
            if i > indices[-1]:
                break
            if i in wanted:
                frames.append(frame.to_ndarray(format="rgb24"))
    if len(frames) != len(indices):
        raise ValueError(f"{path}: decoded {len(frames)} of the {len(indices)} frames sampled")
    return Video(np.stack(frames), indices.astype(np.float64), rate or DEFAULT_SOURCE_FPS)


def smart_resize_video(num_frames: int, height: int, width: int, temporal_factor: int,
                       factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:  # fmt: skip
    """Qwen3-VL's video ``smart_resize``, verbatim (Python's round-half-even included)."""
    if num_frames < temporal_factor:
        raise ValueError(f"a video needs at least {temporal_factor} frames, got {num_frames}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    return smart_resize(height, width, factor, min_pixels, max_pixels, num_frames, t_bar)


def target_size(num_frames: int, height: int, width: int, s: VideoSettings) -> tuple[int, int]:
    """The size every frame is resized to (the processor's ``resize``, with its optional
    per-frame pixel cap)."""
    factor = s.patch_size * s.merge_size
    max_pixels = s.max_pixels
    if s.cap_pixels_per_frame:
        per_frame = max(min(s.max_video_tokens * factor * factor, s.max_pixels // num_frames),
                        int(s.min_pixels * 1.05))  # fmt: skip
        max_pixels = per_frame * num_frames
    return smart_resize_video(num_frames, height, width, s.temporal_patch_size, factor,
                              s.min_pixels, max_pixels)  # fmt: skip


def preprocess_video(
    frames: np.ndarray, settings: VideoSettings
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """uint8 [T, H, W, 3] -> (pixel_values float32 [t*h*w, patch_dim], grid_thw (t, h, w)).

    Equal to ``Qwen3VLVideoProcessor(**config)(frames)``'s pixel_values_videos and
    video_grid_thw (frames already sampled)."""
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise ValueError(f"expected uint8 RGB frames [T, H, W, 3], got {frames.dtype} "
                         f"{frames.shape}")  # fmt: skip
    s = settings
    if s.do_resize:
        h, w = target_size(len(frames), frames.shape[1], frames.shape[2], s)
        frames = np.stack([torch_resize(f, h, w) for f in frames])
    x = frames.transpose(0, 3, 1, 2).astype(np.float32)  # TCHW, as the processor works
    if s.do_rescale and s.do_normalize:  # fused: one subtraction and one division in float32
        scale = np.float32(1.0 / s.rescale_factor)
        mean = np.asarray(s.image_mean, np.float32) * scale
        std = np.asarray(s.image_std, np.float32) * scale
        x = (x - mean[:, None, None]) / std[:, None, None]
    elif s.do_normalize:
        x = (x - np.asarray(s.image_mean, np.float32)[:, None, None]) / np.asarray(
            s.image_std, np.float32
        )[:, None, None]
    elif s.do_rescale:
        x = x * np.float32(s.rescale_factor)
    p, m, t = s.patch_size, s.merge_size, s.temporal_patch_size
    if x.shape[2] % (p * m) or x.shape[3] % (p * m):
        raise ValueError(f"frames {x.shape[3]}x{x.shape[2]} are not a multiple of {p * m}; "
                         f"enable do_resize")  # fmt: skip
    if pad := -len(x) % t:  # the last frame repeated up to a whole temporal patch
        x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)])
    return patchify(x, p, m, t), (len(x) // t, x.shape[2] // p, x.shape[3] // p)


def frame_timestamps(indices: Sequence[float], fps: float, temporal: int) -> list[float]:
    """``Qwen3VLProcessor._calculate_timestamps``: one time a temporal group, in seconds."""
    idx = list(indices)
    if len(idx) % temporal:
        idx.extend(idx[-1] for _ in range(temporal - len(idx) % temporal))
    times = [i / fps for i in idx]
    return [(times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal)]
