"""Qwen3 weight names: our module's parameters follow the checkpoint's, except the LM head."""

from __future__ import annotations

from typing import Any

import torch

from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError
from edgeomni.export.common.decoder import PACKED

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


def lm_head_name(ckpt: Checkpoint) -> str:
    """Tied checkpoints store no lm_head; the embedding table serves both."""
    if ckpt.has(LM_HEAD) and not ckpt.config.get("tie_word_embeddings", False):
        return LM_HEAD
    return EMBEDDING


def checkpoint_tensor(ckpt: Checkpoint, name: str) -> torch.Tensor:
    """The checkpoint tensor(s) behind one parameter of our CausalLM."""
    if name == "lm_head_t":  # stored [H, V]: the checkpoint's head, transposed
        return ckpt.tensor(lm_head_name(ckpt)).t()
    for packed, parts in PACKED.items():
        if name.endswith(packed):
            prefix = name[: -len(packed)]
            return torch.cat([ckpt.tensor(prefix + part) for part in parts], dim=0)
    return ckpt.tensor(name)


def load_weights(module: torch.nn.Module, ckpt: Checkpoint, dtype: torch.dtype) -> None:
    """Fill every parameter of a CausalLM from the checkpoint, checking shapes."""
    state: dict[str, Any] = {}
    for name, param in module.state_dict().items():
        tensor = checkpoint_tensor(ckpt, name)
        if tuple(tensor.shape) != tuple(param.shape):
            raise CheckpointError(
                f"{ckpt.path}: {name} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
            )
        state[name] = tensor.to(dtype).contiguous()
    module.load_state_dict(state, strict=True)
