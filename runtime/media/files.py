"""A media file checked whole before anything is loaded: what edge-infer does to the files its
flags name (--audio, --image, --video, --ref-audio), so that one which is no audio, image or
video, or one the run would refuse (no samples, NaN samples, over the image cap), is bad usage
(exit 2) found at once rather than a failed request after the engines have loaded. The checks
are the readers' own (runtime/audio.py, image.py, video.py), so the request's preparation
would refuse the file with the same line."""

from __future__ import annotations

import os

from edgeomni.runtime.media import MediaError
from edgeomni.runtime.media.image import MAX_IMAGE_PIXELS

__all__ = ["check_file", "media_problem"]


def check_file(kind: str, path: str | os.PathLike[str], max_pixels: int = MAX_IMAGE_PIXELS) -> None:
    """A ``MediaError`` naming ``path`` unless it is a ``kind`` ("audio", "image" or "video")
    file the run can read: audio decoded whole (its samples checked), an image decoded whole
    within ``max_pixels``, a video's container opened and its first frame decoded. A reader
    whose extra is missing (Pillow, PyAV) checks nothing here: the request says so."""
    try:
        if kind == "audio":
            from edgeomni.runtime.audio import read_wav

            read_wav(path)
        elif kind == "image":
            from edgeomni.runtime.media.image import load_image

            load_image(path, max_pixels)
        elif kind == "video":
            _first_frame(path)
        else:
            raise ValueError(f"no check for media of kind {kind!r}")
    except ImportError:
        return


def media_problem(
    kind: str, path: str | os.PathLike[str], max_pixels: int = MAX_IMAGE_PIXELS
) -> str | None:
    """Why ``check_file`` refuses the file (its ``reason``: the caller names the file), or
    None."""
    try:
        check_file(kind, path, max_pixels)
    except MediaError as e:
        return e.reason
    return None


def _first_frame(path: str | os.PathLike[str]) -> None:
    """A video file's container and first frame, decoded with PyAV (the ``video`` extra)."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise MediaError("video", path, "holds no video stream")
            if next(container.decode(video=0), None) is None:
                raise MediaError("video", path, "holds no frame")
    except av.FFmpegError as e:
        said = e.strerror or str(e).replace(repr(str(path)), "").replace(str(path), "")
        raise MediaError("video", path, f"not a video FFmpeg decodes ({said})") from None
