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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from edgeomni.export.common import artifacts
from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError, section
from edgeomni.export.common.checkpoint import position_limits as position_limits_of
from edgeomni.export.common.decoder import CausalLM
from edgeomni.export.common.decoder_weights import load_decoder
from edgeomni.export.common.memory_plan import F32, decoder_memory, float_memory, table_rows
from edgeomni.export.common.onnx_export import export_causal_lm
from edgeomni.export.common.shapes import DimRanges, decoder_ranges
from edgeomni.export.families.qwen3.config import decoder_config
from edgeomni.export.family import BuildArgs, Component, ComponentMemory
from edgeomni.export.media import audio_encoder as audio
from edgeomni.export.registry import LLM_RUNNER

LLM = Component("llm", ".", "llm.onnx", LLM_RUNNER)
# the encoder is no stage of its own: the llm's runner finds it beside the llm and calls it
AUDIO = Component("audio", "audio", audio.ENGINE, LLM_RUNNER)
DTYPES = {"float32": torch.float32, "float16": torch.float16}
TEXT = "model.language_model."  # the decoder's weights; ours are named model.<...>
EMBEDDING = TEXT + "embed_tokens.weight"
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


def components(ckpt: Checkpoint) -> tuple[Component, ...]:
    """The llm always; the audio encoder when the checkpoint has it (with its config files
    alone, for edge-build --estimate: when its config has the section)."""
    try:
        has_audio = any(ckpt.names("model.audio_tower."))
    except CheckpointError:  # no weight files: what the config describes
        has_audio = isinstance(ckpt.config.get("audio_config"), dict)
    return (LLM, AUDIO) if has_audio else (LLM,)


def text_config(cfg: Mapping[str, Any]) -> Any:
    """The llm's dimensions (its text_config, a Qwen3 config)."""
    return decoder_config(section(dict(cfg), "text_config"), where="text_config.")


def preflight(ckpt: Checkpoint, components: Sequence[Component], args: BuildArgs) -> None:
    """What write_artifacts reads of config.json and the small files (tokenizer, chat
    template, the feature extractor's settings, the audio token id), before any export."""
    text_config(ckpt.config)
    if LLM in components:
        artifacts.require_tokenizer(ckpt)
        media_tokens(ckpt)
    if AUDIO in components:
        feature_settings(ckpt)


def position_limits(
    ckpt: Checkpoint, components: Sequence[Component]
) -> dict[str, tuple[str, int]]:
    """The llm's position limit, for edge-build's warning past it."""
    return position_limits_of(
        ckpt.config, {LLM.name: ("text_config",)}, (c.name for c in components)
    )


def dim_ranges(ckpt: Checkpoint, component: Component, args: BuildArgs) -> DimRanges:
    """The sizes each component is called with (export/common/shapes.py)."""
    if component.name == AUDIO.name:
        return audio.audio_dim_ranges(audio.audio_config(ckpt.config, _tower()))
    return decoder_ranges(args.max_batch_size, args.max_input_len, args.max_kv_cache_capacity)


def llm_module(ckpt: Checkpoint) -> CausalLM:
    """The llm as the export builds it, weights not loaded."""
    return CausalLM(text_config(ckpt.config)).eval()


def memory_plan(ckpt: Checkpoint, component: Component, args: BuildArgs) -> ComponentMemory:
    """edge-build --estimate's view: the exported modules on the meta device, the float32
    embedding table, the llm's KV cache."""
    with torch.device("meta"):
        if component.name == AUDIO.name:
            tower = _tower()
            encoder = tower.encoder(audio.audio_config(ckpt.config, tower))
            return float_memory(audio.AudioEncoderGraph(encoder, _projector(ckpt.config)))
        module = llm_module(ckpt).to(DTYPES.get(args.dtype, torch.float32))
    return decoder_memory(module, {"embedding": (table_rows(module), F32)})


def load_llm(ckpt: Checkpoint, dtype: torch.dtype) -> CausalLM:
    """The llm with the checkpoint's language-model weights (lm_head tied to the embeddings
    unless the checkpoint stores its own)."""
    module = llm_module(ckpt)
    tied = ckpt.config.get("tie_word_embeddings", True) or not ckpt.has(LM_HEAD)

    def get(name: str) -> Any:  # our model.<x> is the checkpoint's model.language_model.<x>
        return ckpt.tensor(TEXT + name[len("model.") :] if name.startswith("model.") else name)

    head = "model.embed_tokens.weight" if tied else LM_HEAD
    load_decoder(module, get, prefix="", lm_head=head, dtype=dtype, where=str(ckpt.path))
    return module


def export_component(
    ckpt: Checkpoint, component: Component, work_dir: Path, args: BuildArgs
) -> Path:
    if args.dtype not in DTYPES:
        raise CheckpointError(f"dtype {args.dtype!r} is not supported for qwen3_asr")
    path = work_dir / component.engine
    if component.name == AUDIO.name:  # float32, as the other families' encoders
        tower = _tower()
        encoder = audio.load_audio_tower(ckpt.tensor, ckpt.config, tower)
        head = audio.load_head(ckpt.tensor, ckpt.config, tower)
        return audio.export_audio_encoder(encoder, path, head)
    return export_causal_lm(
        load_llm(ckpt, DTYPES[args.dtype]),
        path,
        logits_topk=args.logits_topk or 0,
        float32_embeds=True,  # the runner's float32 table, audio rows spliced in
    )


def write_artifacts(ckpt: Checkpoint, component: Component, out_dir: Path, args: BuildArgs) -> None:
    if component.name == AUDIO.name:
        artifacts.write_engine_config(
            out_dir,
            audio.audio_engine_config(
                ckpt.config, backend=args.backend, device=args.device, tower=_tower(),
                min_samples=feature_settings(ckpt)["min_length"],
            ),
        )  # fmt: skip
        return
    cfg = ckpt.config
    artifacts.write_embedding(ckpt.tensor(EMBEDDING), out_dir)
    artifacts.write_tokenizer(ckpt, out_dir)
    config = artifacts.text_engine_config(ckpt, component, args, text_config(cfg), cfg)
    # the runtime's media hook for this model type opens on these
    artifacts.write_engine_config(out_dir, {**config, "media_tokens": media_tokens(ckpt)})


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
