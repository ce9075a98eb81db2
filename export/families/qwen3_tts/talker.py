"""Qwen3-TTS's talker and code predictor: two dense Qwen3 decoders, plus the tables the runtime
applies itself while it assembles the talker's prompt.

The talker's head (codec_head) gives each frame's first code, and its final-norm state at the
last position seeds the code predictor. The code predictor has one head per residual group,
chosen per call by ``lm_head_index``; its inputs are the talker's width, so a 1.7B talker's
(2048 wide) go through small_to_mtp_projection first, inside its engine.
"""

from __future__ import annotations

import torch

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.decoder import CausalLM, dense_mlp
from edgeomni.export.common.decoder_weights import load_decoder
from edgeomni.export.families.qwen3_tts.config import (
    predictor_decoder_config,
    talker_decoder_config,
)

TALKER = "talker."
PREDICTOR = "talker.code_predictor."
CODEC_EMBEDDING = "talker.model.codec_embedding.weight"
TEXT_EMBEDDING = "talker.model.text_embedding.weight"
PREDICTOR_EMBEDDING = "talker.code_predictor.model.codec_embedding.{}.weight"
INPUT_PROJECTION = "talker.code_predictor.small_to_mtp_projection.{}"


def build_talker(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> CausalLM:
    cfg = talker_decoder_config(ckpt.config)
    module = CausalLM(cfg, dense_mlp(cfg)).eval()
    load_decoder(
        module, ckpt.tensor, prefix=TALKER, lm_head="talker.codec_head.weight", dtype=dtype,
        where=str(ckpt.path),
    )  # fmt: skip
    return module


def build_predictor(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> CausalLM:
    cfg = predictor_decoder_config(ckpt.config)
    module = CausalLM(cfg, dense_mlp(cfg)).eval()
    renames = (
        {f"input_proj.{k}": INPUT_PROJECTION.format(k) for k in ("weight", "bias")}
        if cfg.input_size is not None
        else {}
    )
    load_decoder(
        module, ckpt.tensor, prefix=PREDICTOR, lm_head=PREDICTOR + "lm_head.{}.weight",
        dtype=dtype, where=str(ckpt.path), renames=renames,
    )  # fmt: skip
    return module


def text_projection(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """text_projection (fc1, SiLU, fc2, with biases): the runtime projects each text token's
    embedding as it builds the prompt, so it needs no engine of its own."""
    return {
        f"text_projection.{layer}.{kind}": ckpt.tensor(
            f"{TALKER}text_projection.{layer}.{kind}"
        ).float()
        for layer in ("linear_fc1", "linear_fc2")
        for kind in ("weight", "bias")
    }


def predictor_embeddings(ckpt: Checkpoint, groups: int) -> dict[str, torch.Tensor]:
    """The code predictor's input tables for residual groups 1..G-1 (embedding_0 .. G-2), at
    the talker's width."""
    return {
        f"embedding_{i}": ckpt.tensor(PREDICTOR_EMBEDDING.format(i)).float()
        for i in range(groups - 1)
    }
