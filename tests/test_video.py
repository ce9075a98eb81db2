"""Video input (runtime/media/video.py) equals transformers' Qwen3-VL video path.

- the resize: torch's uint8 bicubic antialiased interpolate (what torchvision's resize runs for
  uint8 frames on a CPU), bit for bit, at many sizes;
- the whole preprocessing (resize, fused normalize, temporal padding, patchify) and the frame
  sampling: the real Qwen3VLVideoProcessor's outputs, recorded in tests/vl_video/reference.npz
  (tests/vl_video/make_reference.py; torchvision is not installed here), and live where
  torchvision imports;
- timestamps: Qwen3VLProcessor._calculate_timestamps;
- video parts in request files, and video files through PyAV (the ``video`` extra: a clear
  error without it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeomni.export.tiny_vl import video_processor_config
from edgeomni.runtime.media import video as vid
from edgeomni.runtime.media.image import torch_resize

REFERENCE = Path(__file__).parent / "vl_video" / "reference.npz"
SETTINGS = vid.VideoSettings.from_config(video_processor_config())


def test_torch_resize_is_torch_uint8_interpolate() -> None:
    import torch

    rng = np.random.default_rng(1)
    sizes = [(64, 96, 32, 64), (100, 80, 64, 64), (50, 70, 96, 128), (17, 300, 64, 64),
             (400, 30, 32, 96)] + [tuple(rng.integers(8, 200, 4)) for _ in range(20)]  # fmt: skip
    for h, w, out_h, out_w in sizes:
        image = (rng.random((h, w, 3)) * 255).astype(np.uint8)
        t = torch.from_numpy(image).permute(2, 0, 1)[None].contiguous()
        want = torch.nn.functional.interpolate(t, size=(int(out_h), int(out_w)), mode="bicubic",
                                               antialias=True)[0].permute(1, 2, 0).numpy()  # fmt: skip
        np.testing.assert_array_equal(torch_resize(image, int(out_h), int(out_w)), want)


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(REFERENCE) as data:
        return dict(data)


@pytest.mark.parametrize("case", ["up", "down", "small"])
def test_preprocess_equals_the_video_processor(reference, case) -> None:
    pixels, grid = vid.preprocess_video(reference[f"{case}_frames"], SETTINGS)
    assert list(grid) == reference[f"{case}_grid"][0].tolist()
    np.testing.assert_array_equal(pixels, reference[f"{case}_pixels"])


def test_preprocess_equals_the_live_video_processor() -> None:
    pytest.importorskip("torchvision", reason="transformers' video processor needs torchvision")
    sys.path.insert(0, str(REFERENCE.parent))
    import make_reference
    from transformers import Qwen3VLVideoProcessor

    proc = Qwen3VLVideoProcessor(**{**video_processor_config(), "do_sample_frames": False,
                                    "cap_pixels_per_frame": False})  # fmt: skip
    for case in make_reference.FRAMES:
        frames = make_reference.frames(case)
        got = proc(videos=[frames], return_tensors="np")
        pixels, grid = vid.preprocess_video(frames, SETTINGS)
        np.testing.assert_array_equal(pixels, got["pixel_values_videos"])
        assert list(grid) == got["video_grid_thw"][0].tolist()


def test_sampling_equals_the_video_processor(reference) -> None:
    sys.path.insert(0, str(REFERENCE.parent))
    import make_reference

    for i, (total, source, fps) in enumerate(make_reference.SAMPLING):
        got = vid.sample_indices(total, source, SETTINGS, fps)
        np.testing.assert_array_equal(got, reference[f"sample_{i}"])


def test_timestamps_equal_the_processor() -> None:
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    for indices, fps in (([0, 1, 2, 3, 4], 2.0), (list(range(0, 100, 12)), 25.0), ([3, 9], 24.0),
                         ([0.0, 0.4, 1.3], 1.0)):  # fmt: skip
        want = Qwen3VLProcessor._calculate_timestamps(None, list(indices), fps, 2)
        assert vid.frame_timestamps(indices, fps, 2) == want


def test_a_single_frame_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2 frames"):
        vid.preprocess_video(np.zeros((1, 64, 64, 3), np.uint8), SETTINGS)


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"video": []}, "non-empty list of frame image paths"),
        ({"video": ["a.png", 3]}, "non-empty list of frame image paths"),
        ({"video": "a.mp4", "fps": 0}, "fps must be a number > 0"),
        ({"video": "a.mp4", "timestamps": [0]}, "timestamps go with frames"),
        ({"video": ["a.png", "b.png"], "timestamps": [0.5]}, "must be 2 numbers"),
        ({"video": ["a.png", "b.png"], "timestamps": [1, 0]}, "in order"),
        ({"video": ["a.png", "b.png"], "fps": 2, "timestamps": [0, 1]}, "not both"),
        ({"video": "a.mp4", "frames": 3}, "keys of a video part"),
    ],
)
def test_bad_video_parts_fail_their_request(part, message) -> None:
    from edgeomni.runtime.requests import BadRequest, parse_request_file

    content = [{"type": "video", **part}, {"type": "text", "text": "hi"}]
    requests, _ = parse_request_file({"requests": [{"messages": [{"role": "user",
                                                                  "content": content}]}]})  # fmt: skip
    assert isinstance(requests[0], BadRequest) and message in requests[0].error


def test_video_file_without_pyav_names_the_extra(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(ImportError, match=r"edgeomni\[video\]"):
        vid.read_video(tmp_path / "clip.mp4", SETTINGS)


def write_clip(path: Path, frames: np.ndarray, rate: int) -> None:
    """An MPEG-4 clip (ffmpeg's own encoder; the container counts its frames, which
    transformers' reader needs)."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for frame in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(stream.encode())


def test_video_file_is_read_and_sampled_as_transformers_does(tmp_path) -> None:
    """read_video's frames and times equal transformers' read_video_pyav with the processor's
    sampling (2 frames a second of a 25 fps clip)."""
    pytest.importorskip("av", reason="video files are read with PyAV (the 'video' extra)")
    from transformers.video_utils import read_video_pyav

    rng = np.random.default_rng(3)
    frames = (rng.random((30, 48, 64, 3)) * 255).astype(np.uint8)
    write_clip(tmp_path / "clip.mp4", frames, 25)
    got = vid.read_video(tmp_path / "clip.mp4", SETTINGS)
    want, meta = read_video_pyav(
        str(tmp_path / "clip.mp4"),
        lambda metadata, **_: vid.sample_indices(metadata.total_num_frames, metadata.fps, SETTINGS),
    )
    assert got.fps == meta.fps == 25.0
    np.testing.assert_array_equal(got.indices, meta.frames_indices)
    assert len(got.indices) == 4  # 30 frames at 25 fps: 2 a second, at least min_frames
    np.testing.assert_array_equal(got.frames, want)


def test_video_file_request_equals_its_frames(vl_engine, tmp_path) -> None:
    """A video file through edge-infer --video gives the tokens of the same sampled frames
    given as image files with their times."""
    pytest.importorskip("av", reason="video files are read with PyAV (the 'video' extra)")
    from PIL import Image

    from edgeomni.runtime import cli

    rng = np.random.default_rng(4)
    frames = (rng.random((30, 48, 64, 3)) * 255).astype(np.uint8)
    write_clip(tmp_path / "clip.mp4", frames, 25)
    decoded = vid.read_video(tmp_path / "clip.mp4", SETTINGS)  # the frames as decoded
    picked = vid.sample_indices(30, 25.0, SETTINGS)
    np.testing.assert_array_equal(decoded.indices, picked)
    paths = []
    for i, frame in zip(picked, decoded.frames, strict=True):
        Image.fromarray(frame).save(tmp_path / f"f{i}.png")
        paths.append(str(tmp_path / f"f{i}.png"))
    part = {"type": "video", "video": paths, "timestamps": [float(i) / 25 for i in picked]}
    body = {
        "max_generate_length": 6,
        "top_k": 1,
        "requests": [
            {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "Hi"}]}]}
        ],
    }
    (tmp_path / "r.json").write_text(json.dumps(body))
    assert cli.main(["--config", str(vl_engine), "--input-file", str(tmp_path / "r.json"),
                     "--output-file", str(tmp_path / "p.json")]) == cli.EXIT_OK  # fmt: skip
    assert cli.main(["--config", str(vl_engine), "--prompt", "Hi", "--video",
                     str(tmp_path / "clip.mp4"), "--max-generate-length", "6", "--sampling",
                     '{"top_k": 1}', "--output-file", str(tmp_path / "q.json")]) == cli.EXIT_OK  # fmt: skip
    a, b = (json.loads((tmp_path / f).read_text())["responses"][0] for f in ("p.json", "q.json"))
    assert a["stages"]["llm"]["output_tokens"] == b["stages"]["llm"]["output_tokens"]
    assert a["stages"]["llm"]["prompt_tokens"] == b["stages"]["llm"]["prompt_tokens"]


class _Text:
    """A tokenizer stand-in: a timestamp text is one token, 100 + its tenths of a second."""

    def encode(self, text: str) -> list[int]:
        return [100 + round(float(text[1:].split()[0]) * 10)]


class _Visual:
    merge = 2


@pytest.mark.parametrize("wrapped", [True, False])
def test_video_frames_replace_the_templates_wrapper(wrapped) -> None:
    """A video's frames bring their own start and end tokens, so the template's pair around its
    placeholder goes (as Qwen3VLProcessor drops it); a bare placeholder and an image's pair stay."""
    from edgeomni.runtime.media.hook import Encoded
    from edgeomni.runtime.media.vision_hook import VisionMedia
    from edgeomni.runtime.prompt import MediaPart

    start, end, image, video = 1, 2, 3, 4
    tokens = {"image_token_id": image, "video_token_id": video,
              "vision_start_token_id": start, "vision_end_token_id": end}  # fmt: skip
    hook = VisionMedia(Path("."), {"media_tokens": tokens}, threads=1, tokenizer=_Text())
    hook._encoders["visual"] = _Visual()
    # two temporal groups of a 1x(2x2) grid, one row each after merging; an image of one row
    frames = Encoded(np.ones((2, 8), np.float32), None, (2, 2, 2), (0.5, 1.5))
    picture = Encoded(np.ones((1, 8), np.float32), None, (1, 2, 2))
    around = [start, video, end] if wrapped else [video]
    ids = [9, *around, 9, start, image, end]
    parts = [MediaPart("video", "v.mp4"), MediaPart("image", "i.png")]
    prompt = hook._splice(ids, parts, [frames, picture])
    want = [9, 105, start, video, end, 115, start, video, end, 9, start, image, end]
    assert prompt.ids.tolist() == want
    assert [at for at, _ in prompt.spans] == [3, 7, 11]
