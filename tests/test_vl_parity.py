"""Qwen3-VL through edge-infer reproduces transformers on a tiny random checkpoint: greedy tokens
identical (CPU, float32) for text alone, one image, two images, a video given as frames, and
all of them in one in-flight batch; the visual encoder's features within 1e-5 of transformers'
(relative to their largest magnitude); --validate-config and --graph-only on the engine dir."""

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


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two images (64x96 kept, 100x80 resized to 96x64) and five 50x70 frames (resized to
    64x64, the last one repeated to a whole temporal patch), as PNG files and arrays."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("vl-media")
    rng = np.random.default_rng(0)
    arrays = {"a": (64, 96), "b": (100, 80)}
    out: dict = {}
    for name, (h, w) in arrays.items():
        out[name] = (rng.random((h, w, 3)) * 255).astype(np.uint8)
        Image.fromarray(out[name]).save(folder / f"{name}.png")
        out[name + "_path"] = str(folder / f"{name}.png")
    frames = (rng.random((5, 50, 70, 3)) * 255).astype(np.uint8)
    out["frames"] = []
    for i, frame in enumerate(frames):
        Image.fromarray(frame).save(folder / f"f{i}.png")
        out["frames"].append(str(folder / f"f{i}.png"))
    out["video"] = ref.Video(frames, FPS)
    return out


def case_content(name: str, media: dict) -> tuple[list, list]:
    """(the reference's content, the request's content parts) of a case."""
    video = {"type": "video", "video": media["frames"], "fps": FPS}
    image = {"a": {"type": "image", "image": media["a_path"]},
             "b": {"type": "image", "image": media["b_path"]}}  # fmt: skip
    cases = {
        "text": (["Hello! How are you today?"], []),
        "image": ([media["a"], "Describe it."], [image["a"]]),
        "two_images": ([media["a"], media["b"], "Compare them."], [image["a"], image["b"]]),
        "video": ([media["video"], "What happens?"], [video]),
        "video_and_image": ([media["video"], media["b"], "Which?"], [video, image["b"]]),
    }
    content, parts = cases[name]
    texts = [{"type": "text", "text": t} for t in content if isinstance(t, str)]
    return content, parts + texts


CASES = ("text", "image", "two_images", "video", "video_and_image")


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


@pytest.mark.parametrize("name", CASES[:4])
def test_request_matches_transformers(vl_engine, media, references, tmp_path, name) -> None:
    code, entries = run(vl_engine, tmp_path, [request(name, media)])
    assert code == cli.EXIT_OK, entries[0].get("error")
    tokens, prompt_len = references[name]
    stage = entries[0]["stages"]["llm"]
    assert stage["prompt_tokens"] == prompt_len
    assert stage["output_tokens"] == tokens


def test_mixed_batch_in_flight_matches_transformers(vl_engine, media, references, tmp_path):
    """Text-only and media requests share one running batch (3 rows, 5 requests: rows join and
    leave), each giving its tokens alone."""
    code, entries = run(vl_engine, tmp_path, [request(n, media) for n in CASES],
                        "--batch-size", "3")  # fmt: skip
    assert code == cli.EXIT_OK, [e.get("error") for e in entries]
    assert max(e["stages"]["llm"]["cohort_size"] for e in entries) == 3
    for name, entry in zip(CASES, entries, strict=True):
        assert entry["stages"]["llm"]["output_tokens"] == references[name][0], name


def test_visual_features_match_transformers(vl_engine, bundle, media) -> None:
    """The visual engine's embeddings and DeepStack features for an image and a video equal
    transformers' Qwen3VLVisionModel on the same patches."""
    import torch

    from edgeomni.runtime.media.visual_encoder import VisualEncoder

    encoder = VisualEncoder(vl_engine / "visual", threads=1)
    inputs = ref.build_inputs(bundle, case_content("video_and_image", media)[0])
    for pixels, grid in ((inputs["pixel_values"], inputs["image_grid_thw"]),
                         (inputs["pixel_values_videos"], inputs["video_grid_thw"])):  # fmt: skip
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
