"""Qwen3-ASR's components: the llm (its Qwen3 text decoder) and the audio encoder with the
model's projector, and what the runtime needs beside each.

transformers' ``Qwen3ASRForConditionalGeneration`` holds ``model.audio_tower`` (the AuT encoder
of Qwen3-Omni without its projection, a 13-row positional table), ``model.multi_modal_projector``
(linear_1, GELU, linear_2) and ``model.language_model`` (a Qwen3 decoder whose lm_head is tied
to its embeddings). The audio rows replace the prompt's ``audio_token_id`` placeholders
(``masked_scatter``), so the llm takes float32 input embeddings and the runtime splices the
encoder's rows over those positions (runtime/media/hook.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError
from edgeomni.export.common.text_family import Encoder, TextFamily
from edgeomni.export.family import BuildArgs, Component
from edgeomni.export.media import audio_encoder as audio
from edgeomni.export.registry import LLM_RUNNER
from edgeomni.graph_schema import Input

TEXT = "model.language_model."  # the decoder's weights; ours are named model.<...>
LM_HEAD = "lm_head.weight"


def _projector(config: Mapping[str, Any]) -> torch.nn.Module:
    from transformers.models.qwen3_asr.configuration_qwen3_asr import Qwen3ASRConfig
    from transformers.models.qwen3_asr.modeling_qwen3_asr import Qwen3ASRMultiModalProjector

    return Qwen3ASRMultiModalProjector(Qwen3ASRConfig.from_dict(dict(config)))


def _tower() -> audio.AudioTower:
    from transformers.models.qwen3_asr import modeling_qwen3_asr as hf
    from transformers.models.qwen3_asr.configuration_qwen3_asr import Qwen3ASREncoderConfig

    return audio.AudioTower(
        encoder=hf.Qwen3ASREncoder,
        config_class=Qwen3ASREncoderConfig,
        prefix="model.audio_tower.",
        sections=("audio_config",),
        model_type="qwen3_asr",
        head=(_projector, "model.multi_modal_projector."),
        chunk_padding="full",  # the feature extractor pads the mel to whole chunks
    )


def lm_head(ckpt: Checkpoint) -> str:
    """Tied to the embeddings unless the checkpoint stores its own head."""
    tied = ckpt.config.get("tie_word_embeddings", True) or not ckpt.has(LM_HEAD)
    return TEXT + "embed_tokens.weight" if tied else LM_HEAD


def _export(ckpt: Checkpoint, path: Any) -> Any:
    tower = _tower()
    encoder = audio.load_audio_tower(ckpt.tensor, ckpt.config, tower)
    head = audio.load_head(ckpt.tensor, ckpt.config, tower)
    return audio.export_audio_encoder(encoder, path, head)


def _engine_config(ckpt: Checkpoint, args: BuildArgs) -> dict[str, Any]:
    return audio.audio_engine_config(
        ckpt.config, backend=args.backend, device=args.device, tower=_tower(),
        min_samples=feature_settings(ckpt)["min_length"],
    )  # fmt: skip


def _module(ckpt: Checkpoint) -> torch.nn.Module:
    tower = _tower()
    encoder = tower.encoder(audio.audio_config(ckpt.config, tower))
    return audio.AudioEncoderGraph(encoder, _projector(ckpt.config))


# the encoder is no stage of its own: the llm's runner finds it beside the llm and calls it
AUDIO = Encoder(
    component=Component("audio", "audio", audio.ENGINE, LLM_RUNNER),
    weights="model.audio_tower.", config="audio_config", inputs=(), export=_export,
    engine_config=_engine_config, module=_module, check=lambda ckpt: feature_settings(ckpt),
    ranges=lambda ckpt, args: audio.audio_dim_ranges(audio.audio_config(ckpt.config, _tower())),
)  # fmt: skip
# the stage hears a request's audio; ``language`` (a forced transcript language) is the
# family's request control, which the stage reads
HOOKS = TextFamily(
    text=("text_config",), prefix=TEXT, lm_head=lm_head, encoder=AUDIO,
    inputs=(Input("audio", "request:audio", "skip"), Input("language", "request:language", "skip")),
    fields=lambda ckpt, dec: {"media_tokens": media_tokens(ckpt)},
)  # fmt: skip


def media_tokens(ckpt: Checkpoint) -> dict[str, int]:
    """The placeholder the encoder's rows replace (config.json's audio_token_id)."""
    value = ckpt.config.get("audio_token_id")
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{ckpt.path / 'config.json'}: audio_token_id is missing")
    return {"audio_token_id": value}


# The feature extractor's settings the runtime's log-mel implements (runtime/media/
# audio_input.py: Whisper-style, 128 bins of 16 kHz audio, n_fft 400, hop 160, no dither).
FEATURES = {"feature_size": 128, "sampling_rate": 16000, "n_fft": 400, "hop_length": 160,
            "dither": 0.0}  # fmt: skip
EXTRACTOR = "Qwen3ASRFeatureExtractor"
MIN_LENGTH = 8000  # its default min_length (samples)


def feature_settings(ckpt: Checkpoint) -> dict[str, Any]:
    """The checkpoint's ``Qwen3ASRFeatureExtractor`` settings (processor_config.json's
    ``feature_extractor``, or preprocessor_config.json), checked against what the runtime's
    log-mel computes; ``min_length`` (samples a short clip is zero-padded to) goes to the audio
    engine's config. Unset keys take the extractor's defaults, as transformers does."""
    found = None
    for name, key in (("processor_config.json", "feature_extractor"),
                      ("preprocessor_config.json", None)):  # fmt: skip
        path = ckpt.path / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            data = data.get(key) if key else data
            if isinstance(data, dict) and data:
                found = (path, data)
                break
    if found is None:
        raise CheckpointError(
            f"{ckpt.path}: no feature extractor settings (processor_config.json's "
            "feature_extractor, or preprocessor_config.json)"
        )
    path, data = found
    kind = data.get("feature_extractor_type", EXTRACTOR)
    if kind != EXTRACTOR:
        raise CheckpointError(
            f"{path}: feature_extractor_type is {kind!r}; Qwen3-ASR's is {EXTRACTOR}"
        )
    n_window = audio.audio_config(ckpt.config, _tower()).n_window
    want = {**FEATURES, "n_window": n_window}
    for key, value in want.items():
        if data.get(key, value) != value:
            raise CheckpointError(
                f"{path}: {key} is {data[key]!r}; edgeomni's log-mel takes {value!r} (the "
                f"audio encoder's n_window is {n_window})"
            )
    min_length = data.get("min_length", MIN_LENGTH)
    if isinstance(min_length, bool) or not isinstance(min_length, int) or min_length < 0:
        raise CheckpointError(f"{path}: min_length must be an integer >= 0, got {min_length!r}")
    return {**want, "min_length": min_length}
