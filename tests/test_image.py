"""Qwen3-Omni's image.py == transformers' Qwen2-VL image processor (PIL backend)."""

from __future__ import annotations

import builtins
import dataclasses
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeomni.runtime.media import MediaError
from edgeomni.runtime.media import image as im

Image = pytest.importorskip("PIL.Image", reason="the parity tests compare against Pillow")

# processor_config.json style (size in pixels), as the tiny Qwen3-Omni checkpoint ships it
TINY = {
    "image_processor": {
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_size": 2,
        "patch_size": 16,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": 32 * 32 * 64, "shortest_edge": 32 * 32 * 4},
        "temporal_patch_size": 2,
        "image_processor_type": "Qwen2VLImageProcessor",
    }
}
# preprocessor_config.json style (flat min/max_pixels), Qwen2.5/3-Omni's real numbers
REAL = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "image_processor_type": "Qwen2VLImageProcessor",
}
SIZES = [(60, 90), (224, 224), (333, 517), (900, 120), (17, 400)]


def picture(height: int, width: int, seed: int) -> np.ndarray:
    """Half noise (stresses the clipping), half smooth gradients (typical photos)."""
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    yy, xx = np.mgrid[:height, :width]
    smooth = np.stack([yy * 255 // height, xx * 255 // width, (yy + xx) % 256], -1)
    noise[:, width // 2 :] = smooth[:, width // 2 :]
    return noise


def hf_processor(config: dict[str, Any]) -> Any:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    cfg = dict(config.get("image_processor", config))
    cfg.pop("image_processor_type", None)
    return Qwen2VLImageProcessorPil(**cfg)


@pytest.mark.parametrize("config", [TINY, REAL, {}], ids=["tiny", "real", "defaults"])
@pytest.mark.parametrize("size", SIZES, ids=[f"{h}x{w}" for h, w in SIZES])
def test_preprocess_matches_transformers(config: dict[str, Any], size: tuple[int, int]) -> None:
    array = picture(*size, seed=size[0])
    settings = im.ImageSettings.from_config(config)
    pixel_values, grid = im.preprocess(array, settings)
    ref = hf_processor(config)(Image.fromarray(array), return_tensors="np")
    assert grid == tuple(int(v) for v in ref["image_grid_thw"][0])
    assert pixel_values.dtype == np.float32 and pixel_values.shape == ref["pixel_values"].shape
    assert pixel_values.shape[1] == settings.patch_dim
    np.testing.assert_allclose(pixel_values, ref["pixel_values"], rtol=0, atol=1e-5)
    assert np.abs(pixel_values - ref["pixel_values"]).max() == 0.0  # in fact bit-exact
    patches = hf_processor(config).get_number_of_image_patches(*size)
    assert im.image_token_count(grid, settings.merge_size) == patches // settings.merge_size**2


def test_settings_from_either_config_file() -> None:
    tiny, real = im.ImageSettings.from_config(TINY), im.ImageSettings.from_config(REAL)
    assert (tiny.min_pixels, tiny.max_pixels, tiny.patch_size) == (4096, 65536, 16)
    assert (real.min_pixels, real.max_pixels, real.patch_dim) == (3136, 12845056, 1536)
    assert im.ImageSettings.from_config({}).patch_size == 14  # the processor's own default
    with pytest.raises(ValueError, match="BICUBIC"):
        im.ImageSettings.from_config({"resample": 2})


def test_load_image(tmp_path: Path) -> None:
    array = picture(40, 50, seed=1)
    Image.fromarray(array).save(tmp_path / "a.png")
    Image.fromarray(np.concatenate([array, np.full((40, 50, 1), 128, np.uint8)], -1)).save(
        tmp_path / "rgba.png"
    )
    np.testing.assert_array_equal(im.load_image(tmp_path / "a.png"), array)
    rgba = im.load_image(tmp_path / "rgba.png")  # alpha dropped, as transformers' load_image
    assert rgba.shape == (40, 50, 3) and rgba.dtype == np.uint8
    np.testing.assert_array_equal(rgba, array)


def png_header(path: Path, width: int, height: int) -> Path:
    """A PNG whose header says ``width`` x ``height`` and whose pixel data is cut short: only
    a reader that decodes it finds it broken, so a refusal for its size came from the header."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                     + chunk(b"IDAT", zlib.compress(b"\0" * 10)) + chunk(b"IEND", b""))  # fmt: skip
    return path


@pytest.mark.parametrize(("width", "height"), [(9800, 9800), (20000, 20000)])
def test_an_image_over_the_cap_is_refused_from_its_header(
    tmp_path: Path, width: int, height: int
) -> None:
    """96 Mpx (over the cap) and 400 Mpx (over Pillow's decompression-bomb limit too): one
    message naming the file, its size and the cap, before any decoding (the data is cut
    short, so a decode would say "truncated")."""
    path = png_header(tmp_path / "big.png", width, height)
    for read in (im.load_image, im.image_size):
        with pytest.raises(MediaError) as got:
            read(path)
        size = f"{width}x{height} pixels" if width < 10000 else f"{width * height} pixels"
        assert str(got.value) == (
            f"image {path}: {size}, over the cap of {im.MAX_IMAGE_PIXELS} (--max-image-pixels "
            f"raises it, up to {im.PIL_PIXEL_LIMIT})"
        )
    with pytest.raises(MediaError, match="over the cap of 1000 "):
        im.load_image(png_header(tmp_path / "small.png", 40, 30), max_pixels=1000)
    with pytest.raises(MediaError, match="image file is truncated"):  # under the cap: decoded
        im.load_image(png_header(tmp_path / "small.png", 40, 30))


def test_a_file_that_is_no_image_is_named(tmp_path: Path) -> None:
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not an image at all")
    with pytest.raises(MediaError) as got:
        im.load_image(junk)
    assert str(got.value) == f"image {junk}: not an image: cannot identify image file"
    with pytest.raises(FileNotFoundError):  # the file itself: an OSError, as open() says it
        im.load_image(tmp_path / "missing.png")


def test_without_pillow_reading_and_resizing_name_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_pil(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pil)
    with pytest.raises(ImportError, match=r"edgeomni\[image\]"):
        im.load_image(tmp_path / "missing.png")
    settings = im.ImageSettings.from_config(TINY)
    with pytest.raises(ImportError, match=r"resizing images needs Pillow.*edgeomni\[image\]"):
        im.preprocess(picture(60, 90, seed=0), settings)  # resized by Pillow, as upstream
    unresized = dataclasses.replace(settings, do_resize=False)
    assert im.preprocess(picture(64, 64, seed=0), unresized)[1] == (1, 4, 4)  # numpy only


def test_rejects_what_the_processor_would_not_see() -> None:
    settings = im.ImageSettings.from_config(TINY)
    with pytest.raises(ValueError, match="uint8"):
        im.preprocess(np.zeros((32, 32, 3), np.float32), settings)
    with pytest.raises(ValueError, match="aspect ratio"):
        im.preprocess(np.zeros((1, 300, 3), np.uint8), settings)
