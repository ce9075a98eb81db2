"""The tiny Qwen3-VL's builds beside the float one: edge-build --estimate from config.json
alone matches what the build holds, and an int4 (int4_rtn) build answers image, video and text
requests."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_estimate import assert_close, compare  # noqa: E402

from edgeomni.export.family import BuildArgs  # noqa: E402

ARGS = {"max_batch_size": 3, "max_input_len": 256, "max_kv_cache_capacity": 384}


def test_estimate_matches_the_build(vl_engine: Path, vl_ckpt: Path, tmp_path: Path) -> None:
    rows = compare(vl_ckpt, vl_engine, BuildArgs(**ARGS), tmp_path)
    assert set(rows) == {"llm", "visual"}
    assert_close(rows, list(rows))


def test_int4_build_answers_media_requests(vl_ckpt: Path, exports, tmp_path: Path) -> None:
    """int4_rtn stores the llm's linear weights as int4 (the visual encoder stays float) and
    the build answers an image, a video and text in one batch."""
    import json

    from PIL import Image

    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    pytest.importorskip("PIL")
    eng = tmp_path / "int4"
    assert exports.build(vl_ckpt, eng, BuildArgs(**ARGS, quantization="int4_rtn"))
    cfg = json.loads((eng / "config.json").read_text())
    assert cfg["quantization"]["method"] == "int4_rtn"
    assert json.loads((eng / "visual" / "config.json").read_text())["quantization"] is None
    rng = np.random.default_rng(8)
    Image.fromarray((rng.random((64, 64, 3)) * 255).astype(np.uint8)).save(tmp_path / "i.png")
    frames = []
    for i in range(3):
        Image.fromarray((rng.random((32, 64, 3)) * 255).astype(np.uint8)).save(
            tmp_path / f"{i}.png"
        )
        frames.append(str(tmp_path / f"{i}.png"))
    parts = [[{"type": "image", "image": str(tmp_path / "i.png")}],
             [{"type": "video", "video": frames}], []]  # fmt: skip
    body = {"top_k": 1, "max_generate_length": 6, "requests": [
        {"messages": [{"role": "user", "content": [*p, {"type": "text", "text": "Hi"}]}]}
        for p in parts]}  # fmt: skip
    requests, _ = parse_request_file(body)
    for outcome in Pipeline(eng).run(requests, batch_size=3):
        assert outcome.entry["ok"], outcome.entry["error"]
        assert len(outcome.entry["stages"]["llm"]["output_tokens"]) == 6


def test_a_tied_checkpoint_builds_its_head_from_the_embedding(vl_ckpt: Path, tmp_path: Path):
    """Qwen3-VL-2B ties its lm_head to the embedding and stores no lm_head: the llm's head is
    the checkpoint's language-model embedding (its name was once prefixed twice, failing every
    tied build)."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from edgeomni.export.common.checkpoint import open_checkpoint
    from edgeomni.export.families.qwen3_vl.build import HOOKS

    tied = tmp_path / "tied"
    shutil.copytree(vl_ckpt, tied)
    weights = load_file(str(tied / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(tied / "model.safetensors"))
    config = json.loads((tied / "config.json").read_text())
    config["tie_word_embeddings"] = config["text_config"]["tie_word_embeddings"] = True
    (tied / "config.json").write_text(json.dumps(config))
    llm = HOOKS.load_llm(open_checkpoint(tied))
    head = dict(llm.named_parameters())["lm_head_t"].detach()  # [H, V]
    assert torch.equal(head, weights["model.language_model.embed_tokens.weight"].t())


def test_tying_is_the_top_levels_as_transformers_reads_it(vl_ckpt: Path, tmp_path: Path):
    """text_config alone saying tied does not tie (transformers reads the top level): the
    stored head is used; untied without a head is an error naming both."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from edgeomni.export.common.checkpoint import CheckpointError, open_checkpoint
    from edgeomni.export.families.qwen3_vl.config import lm_head_name

    ckpt = tmp_path / "ckpt"
    shutil.copytree(vl_ckpt, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["tie_word_embeddings"] = False
    config["text_config"]["tie_word_embeddings"] = True
    (ckpt / "config.json").write_text(json.dumps(config))
    assert lm_head_name(open_checkpoint(ckpt)) == "lm_head.weight"
    weights = load_file(str(ckpt / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match="tie_word_embeddings.*lm_head"):
        lm_head_name(open_checkpoint(ckpt))
