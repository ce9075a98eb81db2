"""The image input path of the Qwen3 vision encoders (read, resize, normalise, patchify) in
numpy, shared by Qwen3-Omni and Qwen3-VL (whose video path, video.py, builds on it).

The embedded board has no torch or torchvision, so what transformers' ``Qwen2VLImageProcessor``
(the image processor both ship; its PIL backend, ``Qwen2VLImageProcessorPil``) does to an
image is rebuilt here step for step, in the same dtypes, so the vision encoder sees the numbers
it was exported against:

1. ``smart_resize``: height and width become multiples of ``patch_size * merge_size`` (32) with
   the pixel count inside [min_pixels, max_pixels], the aspect ratio kept as well as it can be.
2. Pillow's BICUBIC resize of the uint8 image (Pillow itself: the ``image`` extra).
   ``torch_resize`` is PyTorch's uint8 path, ported (what the torchvision processors, Qwen3-VL's
   video processor among them, do to a frame).
3. rescale by 1/255 in float64, cast to float32; normalise ``(x - mean) / std`` in float32.
4. patchify in 2x2 merge-block order, the image repeated ``temporal_patch_size`` times in time:
   ``pixel_values [t*h*w, 3*2*16*16]`` and ``grid_thw (1, h, w)`` in patches.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from edgeomni.runtime.media import MediaError

__all__ = [
    "MAX_IMAGE_PIXELS",
    "PIL_PIXEL_LIMIT",
    "ImageSettings",
    "image_size",
    "patchify",
    "image_token_count",
    "load_image",
    "preprocess",
    "smart_resize",
    "torch_resize",
]

_PIL_BICUBIC = 3  # PIL.Image.Resampling.BICUBIC, the value preprocessor configs store
_ROW_BLOCK = 256  # rows per resampling block: bounds the int32 accumulator for large images
_OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# The most pixels an image file may have to be decoded (edge-infer's and edge-serve's
# --max-image-pixels default): 4096x4096. Past it a PNG's decoding alone takes seconds and its
# RGB array, resampled in int32 passes, gigabytes, while the model sees it resized to its
# processor's max_pixels (about 1 Mpx) anyway.
MAX_IMAGE_PIXELS = 4096 * 4096
MAX_PIXELS_FLAG = "--max-image-pixels"
# Pillow refuses to open more than twice its Image.MAX_IMAGE_PIXELS (a decompression bomb):
# the highest cap that can be set
PIL_PIXEL_LIMIT = 2 * (1024 * 1024 * 1024 // 4 // 3)


@dataclass(frozen=True)
class ImageSettings:
    """The image processor settings a checkpoint ships; defaults are Qwen2VLImageProcessor's."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, ...] = _OPENAI_CLIP_MEAN
    image_std: tuple[float, ...] = _OPENAI_CLIP_STD
    rescale_factor: float = 1 / 255
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    resample: int = _PIL_BICUBIC
    # the section of processor_config.json that holds these settings
    SECTION: ClassVar[str] = "image_processor"

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ImageSettings:
        """From preprocessor_config.json (flat) or processor_config.json (its ``SECTION``); a
        subclass's defaults are its own.

        As in the processor, ``min_pixels``/``max_pixels`` override ``size``'s shortest_edge and
        longest_edge (both are pixel counts here, not edge lengths).
        """
        cfg = dict(config.get(cls.SECTION, config))
        size = dict(cfg.get("size") or {})
        min_pixels = cfg.get("min_pixels", size.get("shortest_edge", cls.min_pixels))
        max_pixels = cfg.get("max_pixels", size.get("longest_edge", cls.max_pixels))
        settings = cls(
            patch_size=int(cfg.get("patch_size", cls.patch_size)),
            merge_size=int(cfg.get("merge_size", cls.merge_size)),
            temporal_patch_size=int(cfg.get("temporal_patch_size", cls.temporal_patch_size)),
            min_pixels=int(min_pixels),
            max_pixels=int(max_pixels),
            image_mean=_channels(cfg.get("image_mean", cls.image_mean)),
            image_std=_channels(cfg.get("image_std", cls.image_std)),
            rescale_factor=float(cfg.get("rescale_factor", cls.rescale_factor)),
            do_resize=bool(cfg.get("do_resize", True)),
            do_rescale=bool(cfg.get("do_rescale", True)),
            do_normalize=bool(cfg.get("do_normalize", True)),
            resample=int(cfg.get("resample", _PIL_BICUBIC)),
        )
        if settings.do_resize and settings.resample != _PIL_BICUBIC:
            raise ValueError(
                f"only BICUBIC resizing (3) is supported, the config asks for {settings.resample}"
            )
        return settings

    @property
    def patch_dim(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size


def _channels(value: float | Sequence[float]) -> tuple[float, ...]:
    values = tuple(float(v) for v in value) if isinstance(value, Sequence) else (float(value),)
    return values * 3 if len(values) == 1 else values


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "reading or resizing images needs Pillow: pip install 'edgeomni[image]'"
        ) from None
    return Image


def image_size(path: str | os.PathLike[str], max_pixels: int = MAX_IMAGE_PIXELS) -> tuple[int, int]:
    """An image file's (width, height) from its header, nothing decoded: a ``MediaError``
    naming the file when it is no image Pillow reads or has more than ``max_pixels`` pixels
    (so a huge image is refused before its decoding takes seconds and gigabytes)."""
    Image = _pil()
    with _opened(Image, path, max_pixels) as im:
        return im.size


def load_image(path: str | os.PathLike[str], max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """Decode an image file to uint8 [H, W, 3] RGB as transformers' ``load_image`` does (EXIF
    orientation applied, then ``convert("RGB")``). Needs Pillow, the ``image`` extra. A
    ``MediaError`` naming the file for one that is no image, is over ``max_pixels`` (checked
    from its header, before decoding) or cannot be decoded (truncated)."""
    Image = _pil()
    from PIL import ImageOps

    with _opened(Image, path, max_pixels) as im:
        try:
            rgb = ImageOps.exif_transpose(im).convert("RGB")
        except (OSError, ValueError, SyntaxError) as e:  # Pillow's decoders raise these
            raise MediaError("image", path, _said(e, path)) from None
        return np.array(rgb, dtype=np.uint8)


def _opened(Image: Any, path: str | os.PathLike[str], max_pixels: int) -> Any:
    """``Image.open(path)`` (lazy: the header only) within the cap, or a MediaError."""
    with warnings.catch_warnings():  # the cap below speaks for Pillow's bomb warning
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = Image.open(path)
        except Image.DecompressionBombError as e:  # over Pillow's own limit, far over the cap
            found = re.search(r"\((\d+) pixels\)", str(e))
            size = f"{int(found.group(1))} pixels" if found else "more pixels than Pillow opens"
            raise MediaError("image", path, _over(size, max_pixels)) from None
        except Image.UnidentifiedImageError:
            raise MediaError("image", path, "not an image: cannot identify image file") from None
        except (OSError, ValueError, SyntaxError) as e:
            if isinstance(e, OSError) and e.errno is not None:
                raise  # the file itself: missing, unreadable
            raise MediaError("image", path, f"not an image: {_said(e, path)}") from None
    width, height = im.size
    if width * height > max_pixels:
        im.close()
        raise MediaError("image", path, _over(f"{width}x{height} pixels", max_pixels))
    return im


def _over(size: str, max_pixels: int) -> str:
    return (f"{size}, over the cap of {max_pixels} ({MAX_PIXELS_FLAG} raises it, up to "
            f"{PIL_PIXEL_LIMIT})")  # fmt: skip


def _said(e: BaseException, path: str | os.PathLike[str]) -> str:
    """A decoder's complaint without the file's path (the message names it once)."""
    text = str(e).replace(repr(str(path)), "").replace(str(path), "").strip(" :")
    return text or type(e).__name__


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int,
    frames: int = 1, t_frames: int = 1,
) -> tuple[int, int]:  # fmt: skip
    """transformers' ``smart_resize``, verbatim (Python's round-half-even included): an
    image's, or with ``frames`` sampled (``t_frames``: rounded to the temporal patch) Qwen3-VL's
    video one past its frame checks (video.smart_resize_video)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got "
            f"{max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if t_frames * h_bar * w_bar > max_pixels:
        beta = math.sqrt((frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_frames * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _bicubic_torch(x: np.ndarray) -> np.ndarray:
    """PyTorch's antialiased bicubic kernel (UpSampleKernel.cpp's aa_filter, Keys' a = -0.5),
    in its operation order."""
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """PyTorch's antialiased weights (a port of Pillow's precompute_coeffs): per output pixel,
    the source indices [out, ksize] and int32 fixed-point weights (0 past each pixel's taps),
    and their fractional bits (the most that keep the largest weight inside int16,
    _compute_index_ranges_int16_weights)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    center = (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)  # C's (int): toward zero
    xmax = np.minimum((center + support + 0.5).astype(np.int64), in_size) - xmin
    taps = np.arange(ksize)
    w = _bicubic_torch(((taps[None] + xmin[:, None]) - center[:, None] + 0.5) * (1.0 / filterscale))
    w = np.where(taps[None] < xmax[:, None], w, 0.0)
    total = np.zeros(out_size)
    for j in range(ksize):  # summed tap by tap, in order; keep its rounding
        total += w[:, j]
    w = np.where(total[:, None] != 0.0, w / np.where(total == 0.0, 1.0, total)[:, None], w)
    top = float(w.max(initial=0.0))
    bits = 0
    while bits < 22 and int(0.5 + top * (1 << (bits + 1))) < (1 << 15):
        bits += 1
    fixed = np.where(w < 0, -0.5 + w * (1 << bits), 0.5 + w * (1 << bits))
    index = np.minimum(xmin[:, None] + taps[None], in_size - 1)
    return index, np.trunc(fixed).astype(np.int32), bits


def _resample_width(image: np.ndarray, out_w: int) -> np.ndarray:
    """One fixed-point pass along axis 1 of uint8 [H, W, C], rounded and clipped to uint8."""
    index, weights, bits = _coefficients(image.shape[1], out_w)
    out = np.empty((image.shape[0], out_w, image.shape[2]), np.uint8)
    for r0 in range(0, image.shape[0], _ROW_BLOCK):
        rows = image[r0 : r0 + _ROW_BLOCK]
        acc = np.full((rows.shape[0], out_w, rows.shape[2]), 1 << (bits - 1), np.int32)
        for j in range(index.shape[1]):
            acc += rows[:, index[:, j]].astype(np.int32) * weights[None, :, j, None]
        out[r0 : r0 + _ROW_BLOCK] = np.clip(acc >> bits, 0, 255)
    return out


def torch_resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """torchvision's ``resize(uint8 tensor, BICUBIC, antialias=True)`` of uint8 [H, W, C] on a
    CPU (PyTorch's uint8 path: its kernel, int16 weights at a per-pass precision, the
    horizontal pass first, each rounded to uint8): what transformers' torchvision processors
    (Qwen3-VL's video processor) do to a frame. No library on the board runs it, hence this
    port: Pillow's resize (22-bit weights, its own pass order) differs, up to 21 levels on
    random images (measured)."""
    if image.shape[1] != width:
        image = _resample_width(image, width)
    if image.shape[0] != height:
        image = _resample_width(image.transpose(1, 0, 2), height).transpose(1, 0, 2)
    return np.ascontiguousarray(image)


def preprocess(
    image: np.ndarray, settings: ImageSettings
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """uint8 [H, W, 3] -> (pixel_values float32 [t*h*w, patch_dim], grid_thw (t, h, w)).

    Equal to ``Qwen2VLImageProcessorPil(**config)(PIL image)``'s pixel_values and image_grid_thw.
    Resizing is Pillow's (the ``image`` extra), as that processor's; an ImportError naming the
    extra without it.
    """
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"expected a uint8 RGB image [H, W, 3], got {image.dtype} {image.shape}")
    s = settings
    if s.do_resize:
        factor = s.patch_size * s.merge_size
        h, w = smart_resize(image.shape[0], image.shape[1], factor, s.min_pixels, s.max_pixels)
        image = np.asarray(_pil().fromarray(image).resize((w, h), _PIL_BICUBIC))  # Pillow's own
    x = image.transpose(2, 0, 1)  # CHW, as the processor works
    if s.do_rescale:
        x = (x.astype(np.float64) * s.rescale_factor).astype(np.float32)
    x = x.astype(np.float32, copy=False)
    if s.do_normalize:
        mean = np.asarray(s.image_mean, np.float32)[:, None, None]
        std = np.asarray(s.image_std, np.float32)[:, None, None]
        x = (x - mean) / std
    c, height, width = x.shape
    p, m, t = s.patch_size, s.merge_size, s.temporal_patch_size
    if height % (p * m) or width % (p * m):
        raise ValueError(f"image {height}x{width} is not a multiple of {p * m}; enable do_resize")
    # one frame repeated temporal_patch_size times, as the processor tiles it
    frames = np.broadcast_to(x[None], (t, c, height, width))
    return patchify(frames, p, m, t), (1, height // p, width // p)


def patchify(frames: np.ndarray, patch: int, merge: int, temporal: int) -> np.ndarray:
    """float32 [T, C, H, W] (T a multiple of ``temporal``, H and W of ``patch * merge``) ->
    [T/temporal * H/patch * W/patch, C * temporal * patch^2]: temporal groups in order, then
    merge x merge blocks in raster order, then raster order inside a block; each patch's values
    channel-major, then time, then its rows (the processors' patchify)."""
    n, c, height, width = frames.shape
    gt, gh, gw = n // temporal, height // patch, width // patch
    x = frames.reshape(gt, temporal, c, gh // merge, merge, patch, gw // merge, merge, patch)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, c * temporal * patch * patch))


def image_token_count(grid_thw: Sequence[int], merge_size: int) -> int:
    """``<|image_pad|>`` tokens an image gets: its patches over the merge block (t*h*w / m^2)."""
    t, h, w = (int(v) for v in grid_thw)
    return t * h * w // (merge_size * merge_size)
