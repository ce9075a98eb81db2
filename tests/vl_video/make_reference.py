"""Writes reference.npz beside this file: transformers' Qwen3VLVideoProcessor (5.24, torchvision
backend, on a CPU) on deterministic frames, for tests/test_video.py, which runs where
torchvision is not installed. Run it where it is (a venv with torch, torchvision, transformers
5.24 and numpy, edgeomni importable):

    python tests/vl_video/make_reference.py

Each case stores its input frames (uint8 [T, H, W, 3]) and the processor's pixel_values_videos
and video_grid_thw for them (frames given, not sampled), and the processor's sample_frames
indices for a few (frame count, source fps, fps) triples.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
# (frames, height, width) of each case: upscaled, downscaled, below the patch size
FRAMES = {"up": (5, 50, 70), "down": (4, 80, 130), "small": (3, 20, 40)}
SAMPLING = [
    (100, 25.0, None),
    (100, 25.0, 1.0),
    (12, 24.0, None),
    (1000, 30.0, 4.0),
    (7, None, None),
]


def frames(name: str) -> np.ndarray:
    t, h, w = FRAMES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    return (rng.random((t, h, w, 3)) * 255).astype(np.uint8)


def main() -> None:
    from transformers import Qwen3VLVideoProcessor
    from transformers.video_utils import VideoMetadata

    from edgeomni.export.tiny_vl import video_processor_config

    settings = video_processor_config()  # the tiny checkpoint's settings
    proc = Qwen3VLVideoProcessor(**{**settings, "do_sample_frames": False,
                                    "cap_pixels_per_frame": False})  # fmt: skip
    out: dict[str, np.ndarray] = {}
    for name in FRAMES:
        video = frames(name)
        got = proc(videos=[video], return_tensors="pt")
        out[f"{name}_frames"] = video
        out[f"{name}_pixels"] = got["pixel_values_videos"].numpy()
        out[f"{name}_grid"] = got["video_grid_thw"].numpy()
    sampler = Qwen3VLVideoProcessor(**settings)
    for i, (total, source, fps) in enumerate(SAMPLING):
        meta = VideoMetadata(total_num_frames=total, fps=source)
        out[f"sample_{i}"] = np.asarray(sampler.sample_frames(meta, fps=fps))
    np.savez_compressed(HERE / "reference.npz", **out)
    print(f"wrote {HERE / 'reference.npz'}")


if __name__ == "__main__":
    main()
