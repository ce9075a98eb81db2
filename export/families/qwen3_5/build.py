"""Qwen3.5's build: the llm, as a text family (export/common/text_family.py) whose decoder is
its own module (model.py) with its own declared row state, and, where the checkpoint has the
vision tower (Qwen3_5ForConditionalGeneration's model.visual.*), its visual encoder beside it
(visual.py), which the llm's runner calls. What differs from TextFamily's Qwen3 decoder: the
module and its weights, the state in config.json, MRoPE; the encoder is TextFamily's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edgeomni.export.common import artifacts
from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError
from edgeomni.export.common.checkpoint import position_limits as position_limits_of
from edgeomni.export.common.decoder import DTYPES, decoder_dtype
from edgeomni.export.common.memory_plan import F32, table_rows
from edgeomni.export.common.onnx_export import export_causal_lm
from edgeomni.export.common.text_family import LLM, TextFamily
from edgeomni.export.families.qwen3_5.model import (
    Qwen35CausalLM,
    Qwen35Config,
    config_from,
    load_qwen35,
)
from edgeomni.export.families.qwen3_5.visual import VISUAL, llm_fields
from edgeomni.export.family import BuildArgs, Component, ComponentMemory


def _text(config: dict[str, Any]) -> tuple[str, ...]:
    """Where the text config is: Qwen3_5ForConditionalGeneration's ``text_config``, or the top."""
    return ("text_config",) if isinstance(config.get("text_config"), dict) else ()


def _prefix(ckpt: Checkpoint) -> str:
    """The text model's weights: ConditionalGeneration nests them under model.language_model."""
    return "model.language_model." if _text(ckpt.config) else "model."


@dataclass
class Qwen35Family(TextFamily):
    """TextFamily with Qwen3.5's module in place of decoder.CausalLM."""

    def decoder_config(self, config: dict[str, Any]) -> Qwen35Config:  # type: ignore[override]
        return config_from(config)

    def position_limits(self, ckpt: Checkpoint, components: Any) -> dict[str, tuple[str, int]]:
        return position_limits_of(ckpt.config, {LLM.name: _text(ckpt.config)},
                                  (c.name for c in components))  # fmt: skip

    def load_llm(self, ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> Any:
        head = self.lm_head(ckpt)
        if not ckpt.has(head):
            raise CheckpointError(f"{ckpt.path}: no {head} (the lm_head)")
        return load_qwen35(ckpt, ckpt.config, prefix=_prefix(ckpt), lm_head=head, dtype=dtype,
                           where=str(ckpt.path))  # fmt: skip

    def memory_plan(self, ckpt: Checkpoint, component: Component, args: BuildArgs) -> Any:
        """The module on the meta device, the float32 embedding table, its declared state;
        the visual encoder as TextFamily plans it."""
        if component != LLM:
            return super().memory_plan(ckpt, component, args)
        with torch.device("meta"):
            module = Qwen35CausalLM(self.decoder_config(ckpt.config))
            module = module.to(DTYPES.get(args.dtype, torch.float32))
        return ComponentMemory(module, {"embedding": (table_rows(module), F32)},
                               module.state_tensors())  # fmt: skip

    def export_component(
        self, ckpt: Checkpoint, component: Component, work_dir: Path, args: BuildArgs
    ) -> Path:
        if component != LLM:
            return super().export_component(ckpt, component, work_dir, args)
        module = self.load_llm(ckpt, decoder_dtype(ckpt, args))
        return export_causal_lm(module, work_dir / component.engine,
                                logits_topk=args.logits_topk or 0, float32_embeds=True)  # fmt: skip

    def write_artifacts(
        self, ckpt: Checkpoint, component: Component, out_dir: Path, args: BuildArgs
    ) -> None:
        if component != LLM:
            super().write_artifacts(ckpt, component, out_dir, args)
            return
        dec = self.decoder_config(ckpt.config)
        artifacts.write_embedding(ckpt.tensor(_prefix(ckpt) + "embed_tokens.weight"), out_dir)
        artifacts.write_tokenizer(ckpt, out_dir)
        config = artifacts.text_engine_config(ckpt, component, args, dec, ckpt.config)
        with torch.device("meta"):  # the state the export declares, in the build's dtype
            module = Qwen35CausalLM(dec).to(DTYPES.get(args.dtype, torch.float32))
        config.update(
            state=[t.describe() for t in module.state_tensors()],
            mrope_section=list(dec.mrope_section),
            layer_types=list(dec.layer_types),
            **llm_fields(ckpt),
        )
        artifacts.write_engine_config(out_dir, config)


def lm_head(ckpt: Checkpoint) -> str:
    """The head: the embedding table where the config ties them."""
    if config_from(ckpt.config).tie_word_embeddings:
        return _prefix(ckpt) + "embed_tokens.weight"
    return "lm_head.weight"


HOOKS = Qwen35Family(text=(), prefix="model.", lm_head=lm_head, encoder=VISUAL,
                     fields=llm_fields)  # fmt: skip
