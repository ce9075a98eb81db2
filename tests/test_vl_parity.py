"""Qwen3-VL through edge-infer reproduces transformers on a tiny random checkpoint: greedy tokens
identical (CPU, float32) for text alone, one image, two images, a video given as frames, and
the layouts where a mix-up of height and width or of one image's attention block with the next
would show (a tall image, two of one shape, a wide one then a tall or a flat one, a video of
tall frames), all of them in one in-flight batch; the visual encoder's features within 1e-5 of
transformers' (relative to their largest magnitude) for each layout; --validate-config and
--graph-only on the engine dir."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeomni.runtime import cli

sys.path.insert(0, str(Path(__file__).parent))
import vl_reference as ref  # noqa: E402

MAX_NEW = 12
FPS = 2.0
FEATURE_TOL = 1e-5  # of max|transformers' output|: float32 rounding of a 2-layer ViT


@pytest.fixture(scope="module")
def bundle(vl_ckpt: Path) -> ref.VLBundle:
    pytest.importorskip("PIL", reason="the image processor reads images with Pillow")
    return ref.load_bundle(vl_ckpt)


# the media, in the order they are drawn: an image as (height, width), a video's frames as
# (count, height, width). "a" (64x96 kept), "b" (100x80, resized to 96x64) and "video" (five
# 50x70 frames resized to 64x64, the last repeated to a whole temporal patch) come first; the
# others keep their sizes (multiples of 32), named below as width x height
MEDIA = {
    "a": (64, 96),
    "b": (100, 80),
    "video": (5, 50, 70),
    "tall": (160, 64),  # 64x160: a 10x4 patch grid
    "wide": (96, 128),  # 128x96: 6x8
    "wide2": (96, 128),  # another of that shape
    "flat": (64, 160),  # 160x64: 4x10
    "tall_video": (4, 160, 64),  # four 64x160 frames: two 10x4 groups
}


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """MEDIA as arrays (a video as ref.Video) and as PNG files under ``<name>_path`` (a video's
    frames as a list of them)."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("vl-media")
    rng = np.random.default_rng(0)
    out: dict = {}
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
LAYOUTS = {
    "text": ((), "Hello! How are you today?"),
    "image": (("a",), "Describe it."),
    "two_images": (("a", "b"), "Compare them."),
    "video": (("video",), "What happens?"),
    "video_and_image": (("video", "b"), "Which?"),
    "tall": (("tall",), "Describe it."),
    "same_shape": (("wide", "wide2"), "Compare them."),
    "wide_tall": (("wide", "tall"), "Compare them."),
    "wide_flat": (("wide", "flat"), "Compare them."),
    "tall_video": (("tall_video",), "What happens?"),
}
CASES = tuple(LAYOUTS)
# the cases whose images are taller than wide, of one shape, or of mixed shapes
SHAPES = ("tall", "same_shape", "wide_tall", "wide_flat", "tall_video")


def case_content(name: str, media: dict) -> tuple[list, list]:
    """(the reference's content, the request's content parts) of a case."""
    keys, text = LAYOUTS[name]
    parts = [{"type": "video", "video": media[k + "_path"], "fps": FPS} if len(MEDIA[k]) == 3
             else {"type": "image", "image": media[k + "_path"]} for k in keys]  # fmt: skip
    return [*(media[k] for k in keys), text], [*parts, {"type": "text", "text": text}]


@pytest.fixture(scope="module")
def references(bundle: ref.VLBundle, media: dict) -> dict[str, tuple[list[int], int]]:
    """Each case's greedy tokens and prompt length in transformers."""
    out = {}
    for name in CASES:
        inputs = ref.build_inputs(bundle, case_content(name, media)[0])
        out[name] = (ref.greedy(bundle, inputs, MAX_NEW), inputs["input_ids"].shape[1])
    return out


def run(engine: Path, tmp: Path, requests: list[dict], *flags: str) -> tuple[int, list[dict]]:
    tmp.mkdir(parents=True, exist_ok=True)
    body = {"max_generate_length": MAX_NEW, "top_k": 1, "requests": requests}
    (tmp / "r.json").write_text(json.dumps(body))
    code = cli.main(["--config", str(engine), "--input-file", str(tmp / "r.json"),
                     "--output-file", str(tmp / "p.json"), *flags])  # fmt: skip
    return code, json.loads((tmp / "p.json").read_text())["responses"]


def request(name: str, media: dict) -> dict:
    return {"messages": [{"role": "user", "content": case_content(name, media)[1]}]}


def test_references_differ(references) -> None:
    """The media change the reply: a runtime that dropped them could not pass."""
    assert len({tuple(tokens) for tokens, _ in references.values()}) == len(CASES)


def test_layout_within_each_image_changes_the_reply(bundle, media, references) -> None:
    """Each image (each video frame) of the shape cases turned upside down, the same pixels
    and sizes, changes transformers' reply: parity there pins where each patch is (position
    embeddings, 2-D rotary, text positions), not only which pixels an image holds."""
    for name in SHAPES:
        content = [ref.Video(item.frames[:, ::-1].copy(), item.fps) if isinstance(item, ref.Video)
                   else item[::-1].copy() if isinstance(item, np.ndarray) else item
                   for item in case_content(name, media)[0]]  # fmt: skip
        flipped = ref.greedy(bundle, ref.build_inputs(bundle, content), MAX_NEW)
        assert flipped != references[name][0], name


@pytest.mark.parametrize("name", CASES[:4] + SHAPES)
def test_request_matches_transformers(vl_engine, media, references, tmp_path, name) -> None:
    code, entries = run(vl_engine, tmp_path, [request(name, media)])
    assert code == cli.EXIT_OK, entries[0].get("error")
    tokens, prompt_len = references[name]
    stage = entries[0]["stages"]["llm"]
    assert stage["prompt_tokens"] == prompt_len
    assert stage["output_tokens"] == tokens


def test_mixed_batch_in_flight_matches_transformers(vl_engine, media, references, tmp_path):
    """Text-only and media requests share one running batch (3 rows, 10 requests: rows join and
    leave), each giving its tokens alone."""
    code, entries = run(vl_engine, tmp_path, [request(n, media) for n in CASES],
                        "--batch-size", "3")  # fmt: skip
    assert code == cli.EXIT_OK, [e.get("error") for e in entries]
    assert max(e["stages"]["llm"]["cohort_size"] for e in entries) == 3
    for name, entry in zip(CASES, entries, strict=True):
        assert entry["stages"]["llm"]["output_tokens"] == references[name][0], name


@pytest.mark.parametrize("name", ("video_and_image", *SHAPES))
def test_visual_features_match_transformers(vl_engine, bundle, media, name) -> None:
    """The visual engine's embeddings and DeepStack features for a case's images (in one call,
    as a request's are encoded) and for its video equal transformers' Qwen3VLVisionModel on
    the same patches."""
    import torch

    from edgeomni.runtime.media.visual_encoder import VisualEncoder

    encoder = VisualEncoder(vl_engine / "visual", threads=1)
    inputs = ref.build_inputs(bundle, case_content(name, media)[0])
    kinds = [(p, g) for p, g in (("pixel_values", "image_grid_thw"),
                                 ("pixel_values_videos", "video_grid_thw")) if p in inputs]  # fmt: skip
    assert kinds
    for pixels, grid in ((inputs[p], inputs[g]) for p, g in kinds):
        with torch.no_grad():
            out = bundle.model.model.visual(pixels, grid_thw=grid)
        expected = [out.pooler_output.numpy(), *(d.numpy() for d in out.deepstack_features)]
        embeds, deep = encoder.encode(pixels.numpy(), grid.numpy())
        assert deep.shape[0] == len(expected) - 1 == 2
        for got, want in zip([embeds, *deep], expected, strict=True):
            assert got.shape == want.shape
            assert np.abs(got - want).max() <= FEATURE_TOL * np.abs(want).max()


def test_validate_config_and_graph_only(vl_engine, vl_ckpt, tmp_path, capsys) -> None:
    """--validate-config passes on the build; --graph-only rebuilds its one-stage graph from the
    engines on disk (the visual encoder found beside the llm), which validates too."""
    from edgeomni.builder import cli as build_cli
    from edgeomni.builder.build import GRAPH_FILE

    assert cli.main(["--config", str(vl_engine), "--validate-config"]) == cli.EXIT_OK
    eng = tmp_path / "eng"
    shutil.copytree(vl_engine, eng, ignore=shutil.ignore_patterns(GRAPH_FILE))
    code = build_cli.main(["--graph-only", "--model-dir", str(vl_ckpt), "--engine-dir", str(eng)])
    assert code == build_cli.EXIT_OK, capsys.readouterr().err
    got = json.loads((eng / GRAPH_FILE).read_text())
    assert got == json.loads((vl_engine / GRAPH_FILE).read_text())
    assert cli.main(["--config", str(eng), "--validate-config"]) == cli.EXIT_OK
    # without its visual encoder the graph reads text only, and a media request fails alone
    shutil.rmtree(eng / "visual")
    (eng / GRAPH_FILE).unlink()
    assert build_cli.main(["--graph-only", "--model-dir", str(vl_ckpt),
                           "--engine-dir", str(eng)]) == build_cli.EXIT_OK  # fmt: skip
    stage = json.loads((eng / GRAPH_FILE).read_text())["stages"][0]
    assert [i["name"] for i in stage["inputs"]] == ["prompt"] and "encoders" not in stage.get(
        "config", {}
    )


def test_do_resize_false_takes_an_image_of_the_target_size(vl_engine, media, references,
                                                           tmp_path) -> None:  # fmt: skip
    """Upstream's ``do_resize: false``: an image already at the model's target size (64x96)
    gives the resized request's tokens; one that is not (80x100) fails alone, naming its size."""
    parts = [[{"type": "image", "image": media["a_path"], "do_resize": False}],
             [{"type": "image", "image": media["b_path"], "do_resize": False}]]  # fmt: skip
    requests = [{"messages": [{"role": "user", "content": [*p, {"type": "text", "text": t}]}]}
                for p, t in zip(parts, ("Describe it.", "Describe it."), strict=True)]  # fmt: skip
    code, entries = run(vl_engine, tmp_path, requests, "--batch-size", "2")
    assert code == cli.EXIT_REQUESTS_FAILED
    assert entries[0]["stages"]["llm"]["output_tokens"] == references["image"][0]
    assert not entries[1]["ok"] and "must be the model's target size" in entries[1]["error"]
    assert "64x96 (width x height); it is 80x100" in entries[1]["error"]
