"""Qwen3 weight names: our module's parameters follow the checkpoint's, except the LM head."""

from __future__ import annotations

import torch

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.decoder import CausalLM
from edgeomni.export.common.decoder_weights import load_decoder

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


def lm_head_name(ckpt: Checkpoint) -> str:
    """Tied checkpoints store no lm_head; the embedding table serves both."""
    if ckpt.has(LM_HEAD) and not ckpt.config.get("tie_word_embeddings", False):
        return LM_HEAD
    return EMBEDDING


def load_weights(module: CausalLM, ckpt: Checkpoint, dtype: torch.dtype) -> None:
    load_decoder(
        module,
        ckpt.tensor,
        prefix="",
        lm_head=lm_head_name(ckpt),
        dtype=dtype,
        where=str(ckpt.path),
    )
