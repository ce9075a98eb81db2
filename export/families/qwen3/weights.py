"""Qwen3 weight names: our module's parameters follow the checkpoint's, except the LM head."""

from __future__ import annotations

from typing import Any

import torch

from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


def lm_head_name(ckpt: Checkpoint) -> str:
    """Tied checkpoints store no lm_head; the embedding table serves both."""
    if ckpt.has(LM_HEAD) and not ckpt.config.get("tie_word_embeddings", False):
        return LM_HEAD
    return EMBEDDING


def load_weights(module: torch.nn.Module, ckpt: Checkpoint, dtype: torch.dtype) -> None:
    """Fill every parameter of a CausalLM from the checkpoint, checking shapes."""
    state: dict[str, Any] = {}
    for name, param in module.state_dict().items():
        is_head = name == "lm_head_t"  # stored [H, V]: the checkpoint's head, transposed
        tensor = ckpt.tensor(lm_head_name(ckpt)).t() if is_head else ckpt.tensor(name)
        if tuple(tensor.shape) != tuple(param.shape):
            raise CheckpointError(
                f"{ckpt.path}: {name} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
            )
        state[name] = tensor.to(dtype).contiguous()
    module.load_state_dict(state, strict=True)
