"""The talker and its code predictor: two decoders, plus the small tables the runtime applies.

The talker is a MoE decoder with MRoPE whose head (codec_head) gives the first code of a frame
and whose final-norm last hidden state seeds the code predictor. The code predictor is a dense
decoder with one head per residual code group, chosen per call by ``lm_head_index``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError
from edgeomni.export.common.config_values import integer
from edgeomni.export.common.decoder import CausalLM, DecoderConfig, dense_mlp
from edgeomni.export.common.decoder_weights import load_decoder
from edgeomni.export.common.moe import TalkerSparseMoE
from edgeomni.export.common.onnx_export import export_causal_lm
from edgeomni.export.families.qwen3_omni.config import decoder_config, rope, section

TALKER = "talker."
PREDICTOR = "talker.code_predictor."
CODEC_EMBEDDING = "talker.model.codec_embedding.weight"
PREDICTOR_EMBEDDING = "talker.code_predictor.model.codec_embedding.{}.weight"
PROJECTIONS = ("text_projection", "hidden_projection")


def talker_decoder_config(cfg: dict[str, Any]) -> DecoderConfig:
    text = section(cfg, "talker_config", "text_config")
    where = "talker_config.text_config."
    _, mrope = rope(text, where=where)
    return decoder_config(text, where=where, mrope_section=mrope or (24, 20, 20),
                          last_hidden_output=True)  # fmt: skip


def predictor_decoder_config(cfg: dict[str, Any]) -> DecoderConfig:
    cp = section(cfg, "talker_config", "code_predictor_config")
    if any(t != "full_attention" for t in cp.get("layer_types") or []):
        raise CheckpointError(
            "code predictor layers with sliding-window attention are not supported yet"
        )
    if cp.get("num_code_groups"):
        groups = integer(cp, "num_code_groups", "talker_config.code_predictor_config.", least=2)
    else:
        groups = integer(section(cfg, "talker_config"), "num_code_groups", "talker_config.",
                         least=2)  # fmt: skip
    return decoder_config(cp, where="talker_config.code_predictor_config.", lm_heads=groups - 1)


def suppressed_codes(cfg: dict[str, Any]) -> tuple[int, ...]:
    """The codec control band transformers' generate never lets the talker emit (the top 1024
    ids of its vocabulary) except the end of speech; its engine keeps them out of its top-K."""
    vocab = int(section(cfg, "talker_config", "text_config")["vocab_size"])
    eos = int(section(cfg, "talker_config")["codec_eos_token_id"])
    return tuple(i for i in range(max(0, vocab - 1024), vocab) if i != eos)


def talker_module(config: dict[str, Any]) -> CausalLM:
    """The talker's decoder as its config makes it, weights not loaded."""
    text = section(config, "talker_config", "text_config")
    return CausalLM(talker_decoder_config(config), lambda i: TalkerSparseMoE.from_config(text))


def predictor_module(config: dict[str, Any]) -> CausalLM:
    """The code predictor's decoder as its config makes it, weights not loaded."""
    cfg = predictor_decoder_config(config)
    return CausalLM(cfg, dense_mlp(cfg)).eval()


def build_talker(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> CausalLM:
    module = talker_module(ckpt.config)
    load_decoder(
        module.eval(), ckpt.tensor, prefix=TALKER, lm_head="talker.codec_head.weight",
        dtype=dtype, where=str(ckpt.path),
    )  # fmt: skip
    return module


def build_predictor(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> CausalLM:
    module = predictor_module(ckpt.config)
    load_decoder(
        module, ckpt.tensor, prefix=PREDICTOR, lm_head=PREDICTOR + "lm_head.{}.weight",
        dtype=dtype, where=str(ckpt.path),
    )  # fmt: skip
    return module


def export_talker(ckpt: Checkpoint, path: Path) -> Path:
    return export_causal_lm(build_talker(ckpt), path)


def export_predictor(ckpt: Checkpoint, path: Path) -> Path:
    return export_causal_lm(build_predictor(ckpt), path)


def projection_tensors_names() -> list[str]:
    """The projections' tensors, as the talker's projections.safetensors names them (under
    ``talker.`` in the checkpoint)."""
    return [f"{proj}.{layer}.{kind}" for proj in PROJECTIONS
            for layer in ("linear_fc1", "linear_fc2") for kind in ("weight", "bias")]  # fmt: skip


def projection_tensors(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """text_projection and hidden_projection (fc1, SiLU, fc2, with biases): run by the runtime
    while it assembles the talker's prefill, so they need no engine of their own."""
    return {name: ckpt.tensor(TALKER + name).float() for name in projection_tensors_names()}


def predictor_embeddings(ckpt: Checkpoint, groups: int) -> dict[str, torch.Tensor]:
    """The code predictor's input tables for residual groups 1..G-1 (embedding_0 .. G-2)."""
    return {
        f"embedding_{i}": ckpt.tensor(PREDICTOR_EMBEDDING.format(i)).float()
        for i in range(groups - 1)
    }
