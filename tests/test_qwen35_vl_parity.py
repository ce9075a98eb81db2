"""Qwen3.5 image-text (Qwen3_5ForConditionalGeneration) through edge-infer reproduces transformers
on a tiny random checkpoint (export/families/qwen3_5/tiny.py make_qwen3_5_vl): greedy tokens
identical (CPU, float32) for text alone through the image-text build, one image, a tall image,
two images of different shapes and a video given as frames, each alone and all of them with
requests of other lengths joining and leaving a running batch of fewer rows (rows reused by
later requests); the visual encoder (Qwen3-VL's engine without DeepStack) within 1e-5 of
transformers' Qwen3_5VisionModel; --validate-config on the build."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeomni.runtime import cli

sys.path.insert(0, str(Path(__file__).parent))
import vl_reference as ref  # noqa: E402

MAX_NEW = 12
FPS = 2.0
FEATURE_TOL = 1e-5  # of max|transformers' output|: float32 rounding of a 2-layer ViT
ROWS = 3


@pytest.fixture(scope="module")
def q35vl_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgeomni.export.families.qwen3_5.tiny import make_qwen3_5_vl

    return make_qwen3_5_vl(tmp_path_factory.mktemp("qwen35-vl") / "ckpt")


@pytest.fixture(scope="module")
def q35vl_engine(q35vl_ckpt: Path, exports: Any, tmp_path_factory) -> Path:
    """The checkpoint built for the CPU (the llm and visual/) through the session's exports."""
    from edgeomni.export.family import BuildArgs

    engine = tmp_path_factory.mktemp("qwen35-vl-engine") / "eng"
    assert exports.build(q35vl_ckpt, engine, BuildArgs(ROWS, 256, 384)) is not None
    return engine


@pytest.fixture(scope="module")
def bundle(q35vl_ckpt: Path) -> ref.VLBundle:
    pytest.importorskip("PIL", reason="the image processor reads images with Pillow")
    from transformers import Qwen3_5ForConditionalGeneration

    return ref.load_bundle(q35vl_ckpt, Qwen3_5ForConditionalGeneration)


# an image as (height, width), a video's frames as (count, height, width)
MEDIA = {
    "a": (64, 96),
    "tall": (160, 64),  # 64x160 (width x height): a 10x4 patch grid
    "wide": (96, 128),  # 128x96: 6x8
    "video": (5, 50, 70),  # five frames resized to 64x64, the last repeated to a whole group
}


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """MEDIA as arrays (a video as ref.Video) and as PNG files under ``<name>_path`` (a video's
    frames as a list of them)."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("qwen35-vl-media")
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {}
    for name, shape in MEDIA.items():
        pixels = (rng.random((*shape, 3)) * 255).astype(np.uint8)
        frames = pixels if len(shape) == 3 else pixels[None]
        paths = [str(folder / f"{name}{i}.png") for i in range(len(frames))]
        for frame, path in zip(frames, paths, strict=True):
            Image.fromarray(frame).save(path)
        if len(shape) == 3:
            out[name], out[name + "_path"] = ref.Video(pixels, FPS), paths
        else:
            out[name], out[name + "_path"] = pixels, paths[0]
    return out


# each case's media (keys of MEDIA, in order) and its text
CASES = {
    "text": ((), "Hello! How are you today?"),
    "image": (("a",), "Describe it."),
    "tall": (("tall",), "Describe it."),
    "wide_tall": (("wide", "tall"), "Compare them."),
    "video": (("video",), "What happens?"),
    "text2": ((), "Why is the sky blue? Answer in one sentence please."),
}
# the in-flight batch: (case, max new tokens), more requests than rows, ending at different steps
SCHEDULE = (("image", 12), ("text", 3), ("video", 7), ("tall", 2), ("wide_tall", 10),
            ("text2", 9), ("image", 5))  # fmt: skip


def case_content(name: str, media: dict[str, Any]) -> tuple[list[Any], list[dict[str, Any]]]:
    """(the reference's content, the request's content parts) of a case."""
    keys, text = CASES[name]
    parts = [{"type": "video", "video": media[k + "_path"], "fps": FPS} if len(MEDIA[k]) == 3
             else {"type": "image", "image": media[k + "_path"]} for k in keys]  # fmt: skip
    return [*(media[k] for k in keys), text], [*parts, {"type": "text", "text": text}]


def request(name: str, media: dict[str, Any], max_new: int = MAX_NEW) -> dict[str, Any]:
    content = case_content(name, media)[1]
    return {"messages": [{"role": "user", "content": content}], "max_generate_length": max_new}


@pytest.fixture(scope="module")
def references(bundle: ref.VLBundle, media: dict[str, Any]) -> dict[str, tuple[list[int], int]]:
    """Each case's greedy tokens (MAX_NEW; a shorter greedy run is their prefix) and prompt
    length in transformers."""
    out = {}
    for name in CASES:
        inputs = ref.build_inputs(bundle, case_content(name, media)[0])
        out[name] = (ref.greedy(bundle, inputs, MAX_NEW), inputs["input_ids"].shape[1])
    return out


def run(engine: Path, tmp: Path, requests: list[dict], *flags: str) -> tuple[int, list[dict]]:
    tmp.mkdir(parents=True, exist_ok=True)
    body = {"top_k": 1, "requests": requests}
    (tmp / "r.json").write_text(json.dumps(body))
    code = cli.main(["--config", str(engine), "--input-file", str(tmp / "r.json"),
                     "--output-file", str(tmp / "p.json"), *flags])  # fmt: skip
    return code, json.loads((tmp / "p.json").read_text())["responses"]


def test_the_media_and_their_layout_change_the_reply(bundle, media, references) -> None:
    """The cases' replies differ, and the tall image turned upside down (same pixels and size)
    changes transformers' reply: parity pins where each patch is, not only that images count."""
    assert len({tuple(tokens) for tokens, _ in references.values()}) == len(CASES)
    flipped = ref.greedy(bundle, ref.build_inputs(bundle, [media["tall"][::-1].copy(),
                                                           CASES["tall"][1]]), MAX_NEW)  # fmt: skip
    assert flipped != references["tall"][0]


@pytest.mark.parametrize("name", tuple(CASES)[:5])
def test_request_matches_transformers(q35vl_engine, media, references, tmp_path, name) -> None:
    code, entries = run(q35vl_engine, tmp_path, [request(name, media)])
    assert code == cli.EXIT_OK, entries[0].get("error")
    tokens, prompt_len = references[name]
    stage = entries[0]["stages"]["llm"]
    assert stage["prompt_tokens"] == prompt_len
    assert stage["output_tokens"] == tokens


@pytest.mark.parametrize("batching", ("inflight", "cohort"))
def test_requests_joining_and_leaving_match_transformers(q35vl_engine, media, references,
                                                         tmp_path, batching) -> None:  # fmt: skip
    """Seven requests, with and without images and a video, of different prompt and reply
    lengths, through three rows: each gives its tokens alone (rows join, leave and are reused
    by later requests, which never see an earlier one's recurrent or convolution state)."""
    requests = [request(name, media, n) for name, n in SCHEDULE]
    code, entries = run(q35vl_engine, tmp_path, requests, "--batch-size", str(ROWS),
                        "--batching", batching)  # fmt: skip
    assert code == cli.EXIT_OK, [e.get("error") for e in entries]
    assert max(e["stages"]["llm"]["cohort_size"] for e in entries) == ROWS
    for (name, n), entry in zip(SCHEDULE, entries, strict=True):
        assert entry["stages"]["llm"]["output_tokens"] == references[name][0][:n], name


def test_visual_features_match_transformers(q35vl_engine, bundle, media) -> None:
    """The visual engine (no DeepStack output) on two images of different shapes in one call,
    and on a video, equals transformers' Qwen3_5VisionModel on the same patches."""
    import torch

    from edgeomni.runtime.media.visual_encoder import VisualEncoder

    encoder = VisualEncoder(q35vl_engine / "visual", threads=1)
    for name in ("wide_tall", "video"):
        inputs = ref.build_inputs(bundle, case_content(name, media)[0])
        image = "pixel_values" in inputs
        pixels = inputs["pixel_values" if image else "pixel_values_videos"]
        grid = inputs["image_grid_thw" if image else "video_grid_thw"]
        with torch.no_grad():
            want = bundle.model.model.visual(pixels, grid_thw=grid).pooler_output.numpy()
        got, deep = encoder.encode(pixels.numpy(), grid.numpy())
        assert deep is None and got.shape == want.shape
        assert np.abs(got - want).max() <= FEATURE_TOL * np.abs(want).max(), name


def test_the_build_declares_the_media_and_validates(q35vl_engine) -> None:
    """The llm's config names the ids its media hook expands (read from config.json's top
    level); the visual engine declares no DeepStack; --validate-config passes."""
    llm = json.loads((q35vl_engine / "config.json").read_text())
    visual = json.loads((q35vl_engine / "visual" / "config.json").read_text())
    assert llm["model_type"] == "qwen3_5" and set(llm["media_tokens"]) == {
        "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"}
    assert visual["deepstack_visual_indexes"] == [] and list(visual["outputs"]) == ["image_embeds"]
    assert cli.main(["--config", str(q35vl_engine), "--validate-config"]) == cli.EXIT_OK
