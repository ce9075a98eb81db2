"""Qwen3-TTS's decoder engines at float16 (a GPU build): what each takes at its boundary.

The talker's rows are made on the host (float32, cast inside the engine); the code predictor's
inputs reach it as device buffers in the engine's own dtype (the talker's hidden state, the
embeddings its in-engine sampler drew), so a float32 boundary there fails every request on a
GPU ("a float16 device buffer for a float32 input", found on the H200).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from edgeomni.export.common.checkpoint import open_checkpoint
from edgeomni.export.families.qwen3_tts import build
from edgeomni.export.family import BuildArgs

FLOAT, FLOAT16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16


def input_types(path: Path) -> dict[str, int]:
    model = onnx.load(str(path), load_external_data=False)
    return {i.name: i.type.tensor_type.elem_type for i in model.graph.input}


@pytest.mark.parametrize(
    ("component", "embeds"), [(build.TALKER, FLOAT), (build.CODE_PREDICTOR, FLOAT16)]
)
def test_float16_boundaries(
    qwen_tts_reference: dict, tmp_path: Path, component, embeds: int
) -> None:
    ckpt = open_checkpoint(qwen_tts_reference["checkpoints"]["custom_voice"]["dir"])
    args = BuildArgs(1, 32, 64, device="cuda", dtype="float16")  # cuda: the in-engine sampler
    types = input_types(build.export_component(ckpt, component, tmp_path, args))
    assert types["inputs_embeds"] == embeds
    assert types["past_key_0"] == FLOAT16
    if component is build.CODE_PREDICTOR:
        assert "sample_uniform" in types  # it draws its codes in the engine on a GPU


def test_left_out_decoder_keys_take_upstreams_defaults() -> None:
    """Qwen3TTSTalkerConfig's num_key_value_heads default is 2 and its code predictor's 8 (a None
    count is one per head); the head sizes are hidden / heads and 128 (no reference venv)."""
    from edgeomni.export import tiny_tts
    from edgeomni.export.families.qwen3_tts.config import (
        predictor_decoder_config,
        talker_decoder_config,
    )

    cfg = tiny_tts.tts_config("base", "tiny", dict.fromkeys(tiny_tts.SPECIALS, 0), 300)
    talker, cp = cfg["talker_config"], cfg["talker_config"]["code_predictor_config"]
    for section in (talker, cp):
        del section["num_key_value_heads"], section["head_dim"]
    assert (talker_decoder_config(cfg).num_kv_heads, predictor_decoder_config(cfg).num_kv_heads) == (2, 8)  # fmt: skip
    assert (talker_decoder_config(cfg).head_dim, predictor_decoder_config(cfg).head_dim) == (8, 128)  # fmt: skip
    talker["num_key_value_heads"] = cp["num_key_value_heads"] = None
    assert (talker_decoder_config(cfg).num_kv_heads, predictor_decoder_config(cfg).num_kv_heads) == (4, 2)  # fmt: skip
