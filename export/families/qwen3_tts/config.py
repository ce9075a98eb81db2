"""Read Qwen3-TTS's config.json (qwen-tts 0.1.1's Qwen3TTSConfig as saved) into what each
component's export and the runtime need.

Keys the release's config.json always holds are required; where upstream's config classes have a
default that a hand-written config may rely on, the same default is used here (named below).
"""

from __future__ import annotations

from typing import Any

from edgeomni.export.common.checkpoint import CheckpointError, section
from edgeomni.export.common.decoder import DecoderConfig
from edgeomni.export.common.text_config import decoder_config

TTS_MODEL_TYPES = ("base", "custom_voice", "voice_design")
TOKENIZER = "speech_tokenizer"  # the 12 Hz codec's folder in the checkpoint
# Qwen3TTSTalkerCodePredictorConfig's head_dim default (the talker's is hidden / heads)
PREDICTOR_HEAD_DIM = 128
# both config classes' num_key_value_heads defaults
TALKER_KV_HEADS, PREDICTOR_KV_HEADS = 2, 8
ROPE_THETA = 10000.0  # both config classes' default
CONTROL_BAND = 1024  # the talker may not emit the top 1024 ids of its vocabulary but EOS


def need(where: dict[str, Any], key: str, path: str, kind: type = int) -> Any:
    value = where.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CheckpointError(f"config.json: {path}{key} is missing or not {kind.__name__}")
    return value


def tts_model_type(cfg: dict[str, Any]) -> str:
    kind = cfg.get("tts_model_type")
    if kind not in TTS_MODEL_TYPES:
        raise CheckpointError(
            f"config.json: tts_model_type {kind!r} is not one of {', '.join(TTS_MODEL_TYPES)}"
        )
    return str(kind)


def talker_decoder_config(cfg: dict[str, Any]) -> DecoderConfig:
    """The talker: its final-norm state at the last position also comes out (the code
    predictor's first input)."""
    talker = section(cfg, "talker_config")
    return decoder_config(talker, ROPE_THETA, "talker_config.", kv_heads=TALKER_KV_HEADS,
                          last_hidden_output=True)  # fmt: skip


def predictor_decoder_config(cfg: dict[str, Any]) -> DecoderConfig:
    """The code predictor: one head per residual group; its inputs are the talker's width,
    mapped by small_to_mtp_projection when the widths differ."""
    talker = section(cfg, "talker_config")
    cp = section(cfg, "talker_config", "code_predictor_config")
    groups = num_code_groups(cfg)
    width = need(talker, "hidden_size", "talker_config.")
    cfg_ = decoder_config(cp, ROPE_THETA, "talker_config.code_predictor_config.",
                          kv_heads=PREDICTOR_KV_HEADS, head_dim=PREDICTOR_HEAD_DIM,
                          lm_heads=groups - 1)  # fmt: skip
    if cfg_.hidden_size != width:
        return DecoderConfig(**{**cfg_.__dict__, "input_size": width})
    return cfg_


def num_code_groups(cfg: dict[str, Any]) -> int:
    talker = section(cfg, "talker_config")
    groups = need(talker, "num_code_groups", "talker_config.")
    cp_groups = section(talker, "code_predictor_config").get("num_code_groups", groups)
    if cp_groups != groups:
        raise CheckpointError(
            f"config.json: talker_config.num_code_groups {groups} and its code predictor's "
            f"{cp_groups} differ"
        )
    return groups


def suppressed_codes(cfg: dict[str, Any]) -> tuple[int, ...]:
    """upstream's suppress_tokens: the top CONTROL_BAND ids of the talker's vocabulary but EOS."""
    talker = section(cfg, "talker_config")
    vocab = need(talker, "vocab_size", "talker_config.")
    eos = need(talker, "codec_eos_token_id", "talker_config.")
    return tuple(i for i in range(max(0, vocab - CONTROL_BAND), vocab) if i != eos)
