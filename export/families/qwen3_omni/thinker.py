"""The thinker (component "llm"): a MoE decoder with MRoPE, DeepStack inputs, and the
accept-layer hidden states the talker reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from edgeomni.export.common import artifacts
from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.decoder import MLP, CausalLM
from edgeomni.export.common.decoder_weights import load_decoder
from edgeomni.export.common.moe import ThinkerSparseMoE
from edgeomni.export.common.onnx_export import export_causal_lm
from edgeomni.export.families.qwen3_omni.config import is_moe_layer, section, thinker_decoder_config
from edgeomni.export.family import BuildArgs

PREFIX = "thinker."
EMBEDDING = "thinker.model.embed_tokens.weight"


def thinker_module(config: dict[str, Any]) -> CausalLM:
    """The thinker's decoder as its config makes it, weights not loaded (on the meta device for
    edge-build --estimate)."""
    text = section(config, "thinker_config", "text_config")
    cfg = thinker_decoder_config(config)

    def mlp(layer: int) -> torch.nn.Module:
        if is_moe_layer(text, layer):
            return ThinkerSparseMoE.from_config(text)
        return MLP(cfg.hidden_size, cfg.intermediate_size)

    return CausalLM(cfg, mlp).eval()


def build_module(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> CausalLM:
    module = thinker_module(ckpt.config)
    tied = section(ckpt.config, "thinker_config").get("tie_word_embeddings") or False
    head = EMBEDDING if tied or not ckpt.has("thinker.lm_head.weight") else "thinker.lm_head.weight"
    load_decoder(
        module, ckpt.tensor, prefix=PREFIX, lm_head=head, dtype=dtype, where=str(ckpt.path)
    )
    return module


def export(ckpt: Checkpoint, path: Path) -> Path:
    return export_causal_lm(build_module(ckpt), path)


def eos_ids(ckpt: Checkpoint) -> list[int]:
    """The thinker stops at <|im_end|> (transformers' generate default) or its configured EOS."""
    text = section(ckpt.config, "thinker_config", "text_config")
    ids = artifacts.eos_token_ids(ckpt, text)
    im_end = ckpt.config.get("im_end_token_id")
    if isinstance(im_end, int) and im_end not in ids:
        ids.append(im_end)
    return ids


def engine_config(ckpt: Checkpoint, engine: str, args: BuildArgs) -> dict[str, Any]:
    cfg = thinker_decoder_config(ckpt.config)
    thinker = section(ckpt.config, "thinker_config")
    return {
        "component": "llm",
        "model_type": ckpt.model_type,
        "engine": engine,
        "backend": args.backend,
        "device": args.device,
        "dtype": args.dtype,
        **artifacts.decoder_fields(cfg, args.dtype),
        "mrope_section": list(cfg.mrope_section or ()),
        "hidden_output_layer": cfg.hidden_output_layer,
        "deepstack_layers": cfg.deepstack_layers,
        "eos_token_id": eos_ids(ckpt),
        "pad_token_id": section(thinker, "text_config").get("pad_token_id"),
        "generation_defaults": artifacts.generation_defaults(ckpt),
        "media_tokens": {
            key: thinker.get(key)
            for key in (
                "audio_token_id",
                "image_token_id",
                "video_token_id",
                "audio_start_token_id",
                "vision_start_token_id",
                "position_id_per_seconds",
            )
        },
        "profiles": artifacts.decoder_profiles(args),
        "builder_config": artifacts.build_limits(args),
    }
