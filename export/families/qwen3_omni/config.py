"""Read Qwen3-Omni's nested config.json into what each component's export needs."""

from __future__ import annotations

from typing import Any

from edgeomni.export.common.checkpoint import CheckpointError, section
from edgeomni.export.common.config_values import integer
from edgeomni.export.common.decoder import DecoderConfig
from edgeomni.export.common.text_config import decoder_config, is_moe_layer, rope

__all__ = ["decoder_config", "is_moe_layer", "rope", "section", "thinker_decoder_config"]


def thinker_decoder_config(cfg: dict[str, Any]) -> DecoderConfig:
    thinker = section(cfg, "thinker_config")
    text = section(cfg, "thinker_config", "text_config")
    where = "thinker_config.text_config."
    _, mrope = rope(text, where=where)
    if mrope is None:
        mrope = (24, 20, 20)  # transformers' default when the config names none
    layers = integer(text, "num_hidden_layers", where)
    accept = integer(section(cfg, "talker_config"), "accept_hidden_layer", "talker_config.",
                     least=0, default=0)  # fmt: skip
    if accept > layers:
        raise CheckpointError(f"config.json: talker_config.accept_hidden_layer {accept} is past "
                              f"{where}num_hidden_layers {layers}")  # fmt: skip
    deepstack = len((thinker.get("vision_config") or {}).get("deepstack_visual_indexes") or [])
    return decoder_config(
        text, where=where, mrope_section=mrope, hidden_output_layer=accept,
        deepstack_layers=deepstack,
    )  # fmt: skip
