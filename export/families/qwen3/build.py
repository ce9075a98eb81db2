"""Qwen3's build: one component, the llm backbone, exported with its KV cache; its head is the
embedding table where the checkpoint ties them or stores none."""

from __future__ import annotations

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.text_family import TextFamily

EMBEDDING, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"


def lm_head(ckpt: Checkpoint) -> str:
    """Tied checkpoints store no lm_head; the embedding table serves both."""
    if ckpt.has(LM_HEAD) and not ckpt.config.get("tie_word_embeddings", False):
        return LM_HEAD
    return EMBEDDING


HOOKS = TextFamily(text=(), prefix="model.", lm_head=lm_head)
