"""Qwen3-TTS's components: what each exports and what the runtime needs beside each engine.

The talker's folder holds what its prompt needs: the tokenizer (converted to tokenizer.json when
the release ships only vocab.json + merges.txt), the codec embedding, and the text embedding
already through text_projection (a per-token MLP, so projecting every row once at build time is
the same as projecting each prompt's rows, and the runtime does no matrix work for it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from edgeomni.export.common import artifacts, text_files
from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError, section
from edgeomni.export.common.checkpoint import position_limits as position_limits_of
from edgeomni.export.common.decoder import decoder_dtype
from edgeomni.export.common.onnx_export import export_causal_lm
from edgeomni.export.families.qwen3_tts import (
    CODE2WAV_RUNNER,
    SPEAKER_ENCODER_RUNNER,
    SPEECH_ENCODER_RUNNER,
    TALKER_RUNNER,
    code2wav,
    speaker_encoder,
    speech_encoder,
    talker,
)
from edgeomni.export.families.qwen3_tts.config import (
    TOKENIZER,
    need,
    num_code_groups,
    predictor_decoder_config,
    suppressed_codes,
    talker_decoder_config,
    tts_model_type,
)
from edgeomni.export.families.qwen3_tts.memory import memory_plan  # noqa: F401 (a hook)
from edgeomni.export.families.qwen3_tts.shapes import dim_ranges  # noqa: F401 (a hook)
from edgeomni.export.families.qwen3_tts.topology import (  # noqa: F401 (hooks)
    multistage_topology,
    no_graph_reason,
)
from edgeomni.export.family import BuildArgs, Component
from edgeomni.export.speech import parts
from edgeomni.export.speech.parts import CALIBRATION_FRAMES, left_out  # noqa: F401

SPEECH = parts.components(TALKER_RUNNER, CODE2WAV_RUNNER)
TALKER, CODE_PREDICTOR, CODE2WAV, CODE2WAV_STREAM = SPEECH
# Base checkpoints' clone encoders: stages of their own, planned only for requests with ref_audio
SPEAKER_ENCODER = Component(
    "speaker_encoder", "speaker_encoder", speaker_encoder.ENGINE, SPEAKER_ENCODER_RUNNER
)
SPEECH_ENCODER = Component(
    "speech_tokenizer_encoder", "speech_tokenizer_encoder", speech_encoder.ENGINE,
    SPEECH_ENCODER_RUNNER,
)  # fmt: skip
CLONE = (SPEAKER_ENCODER, SPEECH_ENCODER)
# upstream's hard defaults (Qwen3TTSModel._merge_generate_kwargs), which generation_config.json
# overrides key by key
GENERATION = {
    "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9,
    "repetition_penalty": 1.05, "subtalker_dosample": True, "subtalker_top_k": 50,
    "subtalker_top_p": 1.0, "subtalker_temperature": 0.9, "max_new_tokens": 2048,
}  # fmt: skip
MIN_NEW_TOKENS = 2  # upstream's generate: the talker may not end in its first two frames
PROJECT_ROWS = 8192  # text-embedding rows projected per call at build time


def components(ckpt: Checkpoint) -> tuple[Component, ...]:
    """The speech components; a Base checkpoint's clone encoders too (it has no speakers)."""
    if tts_model_type(ckpt.config) == "base":
        return (*CLONE, *SPEECH)
    return SPEECH


def preflight(ckpt: Checkpoint, components: Sequence[Component], args: BuildArgs) -> None:
    """config.json's dimensions, ids and speakers, the tokenizer and the codec's config, checked
    before any export: every key each component's export and engine config read, over
    upstream's defaults, so what upstream accepts either builds or is refused here by name."""
    talker_fields(ckpt)
    predictor_decoder_config(ckpt.config)
    check_tokenizer(ckpt)
    settings = code2wav_settings(ckpt)
    code2wav.code2wav_engine_config(settings)
    if CODE2WAV_STREAM in components:
        code2wav.stream_engine_config(settings)
    groups = num_code_groups(ckpt.config)
    frame = code2wav.decoder_settings(settings["decoder_config"])["num_quantizers"]
    if frame != groups:  # upstream's decoder refuses the talker's frames
        raise CheckpointError(
            f"speech_tokenizer/config.json: decoder_config.num_quantizers {frame} is not "
            f"config.json's talker_config.num_code_groups {groups}"
        )
    if SPEECH_ENCODER in components:  # a reference clip's codes are talker frames
        kept = speech_encoder.engine_config(settings)["num_quantizers"]
        if kept != groups:
            raise CheckpointError(
                f"speech_tokenizer/config.json: encoder_valid_num_quantizers {kept} is not "
                f"config.json's talker_config.num_code_groups {groups}"
            )
    if SPEAKER_ENCODER in components:  # its x-vector is one position of the talker's codec track
        speaker = speaker_encoder.check_config(section(ckpt.config, "speaker_encoder_config"))
        hidden = talker_decoder_config(ckpt.config).hidden_size
        if speaker["enc_dim"] != hidden:
            raise CheckpointError(
                f"config.json: speaker_encoder_config.enc_dim {speaker['enc_dim']} is not the "
                f"talker's hidden_size {hidden}"
            )


def position_limits(
    ckpt: Checkpoint, components: Sequence[Component]
) -> dict[str, tuple[str, int]]:
    """The talker's position limit, for edge-build's warning past it (the code predictor's
    cache holds one frame's codes, whatever the flag)."""
    sections = {TALKER.name: ("talker_config",)}
    return position_limits_of(ckpt.config, sections, (c.name for c in components))


def export_component(
    ckpt: Checkpoint, component: Component, work_dir: Path, args: BuildArgs
) -> Path:
    dtype, path = decoder_dtype(ckpt, args), work_dir / component.engine
    topk = args.logits_topk or 0
    if component is TALKER:
        return export_causal_lm(
            talker.build_talker(ckpt, dtype), path, logits_topk=topk,
            topk_exclude=suppressed_codes(ckpt.config), float32_embeds=True,
        )  # fmt: skip
    if component is CODE_PREDICTOR:
        return parts.export_predictor(talker, ckpt, path, args)
    if component is CODE2WAV:
        return code2wav.export_code2wav(code2wav.load_decoder(ckpt.path / TOKENIZER), path)
    if component is CODE2WAV_STREAM:
        return code2wav.export_stream(code2wav.load_decoder(ckpt.path / TOKENIZER), path)
    if component is SPEAKER_ENCODER:
        return speaker_encoder.export_speaker_encoder(
            speaker_encoder.load_speaker_encoder(ckpt.path), path
        )
    if component is SPEECH_ENCODER:
        return speech_encoder.export_speech_encoder(
            speech_encoder.load_speech_encoder(ckpt.path / TOKENIZER), path
        )
    raise CheckpointError(f"qwen3_tts has no component {component.name!r}")


def write_artifacts(ckpt: Checkpoint, component: Component, out_dir: Path, args: BuildArgs) -> None:
    base = artifacts.engine_fields(ckpt, component, args)
    if component is TALKER:
        artifacts.write_embedding(ckpt.tensor(talker.CODEC_EMBEDDING), out_dir)
        artifacts.write_embedding(
            projected_text_embedding(ckpt), out_dir, "text_embedding.safetensors"
        )
        write_tokenizer(ckpt, out_dir)
        artifacts.write_engine_config(
            out_dir, {**base, **talker_fields(ckpt, args.dtype), "builder_config": artifacts.build_limits(args)}
        )
    elif component is CODE_PREDICTOR:
        parts.write_predictor(talker, ckpt, out_dir, base, args)
    elif component is CODE2WAV:
        artifacts.write_engine_config(out_dir, {
            **code2wav.code2wav_engine_config(code2wav_settings(ckpt)),
            "backend": args.backend, "device": args.device,
        })  # fmt: skip
    elif component is CODE2WAV_STREAM:
        artifacts.write_engine_config(out_dir, {
            **code2wav.stream_engine_config(code2wav_settings(ckpt)),
            "backend": args.backend, "device": args.device,
        })  # fmt: skip
    elif component is SPEAKER_ENCODER:
        settings = section(ckpt.config, "speaker_encoder_config")
        artifacts.write_engine_config(
            out_dir, {**base, "dtype": "float32", **speaker_encoder.engine_config(settings)}
        )
    else:
        settings = code2wav_settings(ckpt)
        artifacts.write_engine_config(
            out_dir, {**base, "dtype": "float32", **speech_encoder.engine_config(settings)}
        )


def projected_text_embedding(ckpt: Checkpoint) -> torch.Tensor:
    """text_projection(text_embedding) for every text token, float32 [text_vocab, talker H],
    in blocks of PROJECT_ROWS rows."""
    table = ckpt.tensor(talker.TEXT_EMBEDDING).float()
    w = talker.text_projection(ckpt)
    out = []
    with torch.no_grad():
        for lo in range(0, len(table), PROJECT_ROWS):
            x = table[lo : lo + PROJECT_ROWS]
            x = torch.nn.functional.linear(
                x, w["text_projection.linear_fc1.weight"], w["text_projection.linear_fc1.bias"]
            )
            x = torch.nn.functional.linear(
                torch.nn.functional.silu(x),
                w["text_projection.linear_fc2.weight"],
                w["text_projection.linear_fc2.bias"],
            )
            out.append(x)
    return torch.cat(out).contiguous()


def _tokenizer_source(ckpt: Checkpoint) -> str:
    """tokenizer.json, or the slow files transformers converts into one."""
    if (ckpt.path / "tokenizer.json").is_file():
        return "tokenizer.json"
    if (ckpt.path / "vocab.json").is_file() and (ckpt.path / "merges.txt").is_file():
        return "vocab.json + merges.txt"
    raise CheckpointError(f"{ckpt.path}: no tokenizer (tokenizer.json, or vocab.json + merges.txt)")


def check_tokenizer(ckpt: Checkpoint) -> None:
    """What the talker's tokenizer will be, opened as edge-infer opens it: tokenizer.json (and
    a chat template) as every family's; vocab.json + merges.txt converted, here into a scratch
    folder, as write_tokenizer converts them. A CheckpointError naming the file otherwise."""
    import tempfile

    if _tokenizer_source(ckpt) == "tokenizer.json":
        artifacts.require_tokenizer(ckpt)
        return
    text_files.tokenizer_config(ckpt.path)
    try:
        json.loads((ckpt.path / "vocab.json").read_text(encoding="utf-8"))
        (ckpt.path / "merges.txt").read_text(encoding="utf-8")
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"{ckpt.path / 'vocab.json'}: not valid JSON ({e.msg} at line {e.lineno})"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{ckpt.path}: the tokenizer cannot be read ({e})") from None
    with tempfile.TemporaryDirectory(prefix="edgeomni-tokenizer-") as scratch:
        _convert_tokenizer(ckpt, Path(scratch))
        text_files.load_tokenizer(Path(scratch) / "tokenizer.json")


def _convert_tokenizer(ckpt: Checkpoint, out_dir: Path) -> None:
    """vocab.json + merges.txt -> out_dir/tokenizer.json through transformers (the release
    ships only those); what it cannot convert is a CheckpointError naming the files."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    # it reads config.json on the way and warns that qwen3_tts is no transformers model type
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tok = AutoTokenizer.from_pretrained(str(ckpt.path))
        tok.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    except Exception as e:  # the tokenizer classes raise what their parsers raise
        raise CheckpointError(
            f"{ckpt.path}: vocab.json + merges.txt do not make a tokenizer "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    finally:
        hf_logging.set_verbosity(level)


def write_tokenizer(ckpt: Checkpoint, out_dir: Path) -> None:
    """tokenizer.json for the runtime's `tokenizers`: copied, or converted from vocab.json and
    merges.txt through transformers (the release ships only those)."""
    if _tokenizer_source(ckpt) == "tokenizer.json":
        artifacts.write_tokenizer(ckpt, out_dir)
        return
    _convert_tokenizer(ckpt, out_dir)
    if (ckpt.path / "tokenizer_config.json").is_file():
        (out_dir / "tokenizer_config.json").write_bytes(
            (ckpt.path / "tokenizer_config.json").read_bytes()
        )


def code2wav_settings(ckpt: Checkpoint) -> dict[str, Any]:
    """speech_tokenizer/config.json, which the codec's engine configs read."""
    path = ckpt.path / TOKENIZER / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{ckpt.path}: no {TOKENIZER}/config.json (the 12 Hz codec)")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e.msg})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    if not isinstance(cfg.get("decoder_config"), dict):
        raise CheckpointError(f"{path}: no decoder_config")
    return cfg


def calibration_fields(ckpt: Checkpoint) -> dict[str, Any]:
    """int4_awq's calibration requests speak at most CALIBRATION_FRAMES frames; a CustomVoice
    checkpoint's in its first speaker's voice. A Base checkpoint needs a reference clip and a
    VoiceDesign one an instruction, which only the user's --calibration request file gives."""
    fields: dict[str, Any] = {"talker_max_new_tokens": CALIBRATION_FRAMES}
    speakers = section(ckpt.config, "talker_config").get("spk_id") or {}
    if tts_model_type(ckpt.config) == "custom_voice" and speakers:
        fields["voice"] = sorted(str(k).lower() for k in speakers)[0]
    return fields


def calibration_needs(ckpt: Checkpoint, components: Sequence[Component]) -> dict[str, str]:
    """The request keys int4_awq's calibration requests must set to run through the graph: a
    Base checkpoint's talker speaks only in a voice cloned from each request's clip, which the
    shipped text cannot give."""
    if tts_model_type(ckpt.config) != "base":
        return {}
    if not {c.name for c in components} & {TALKER.name, CODE_PREDICTOR.name}:
        return {}
    return {"ref_audio": "a clip (any WAV) whose voice the Base checkpoint's talker clones; "
                         "ref_text, its transcript, is optional"}  # fmt: skip


def talker_fields(ckpt: Checkpoint, dtype: str = "float32") -> dict[str, Any]:
    """What the talker runner needs: dimensions, the text and codec ids, languages, speakers,
    and the sampling defaults (generation_config.json over upstream's)."""
    cfg = ckpt.config
    tk = section(cfg, "talker_config")
    dec = talker_decoder_config(cfg)
    kind = tts_model_type(cfg)
    speakers = {str(k).lower(): int(v) for k, v in (tk.get("spk_id") or {}).items()}
    if kind == "custom_voice" and not speakers:
        raise CheckpointError("config.json: talker_config.spk_id lists no speakers")
    languages = {str(k).lower(): int(v) for k, v in (tk.get("codec_language_id") or {}).items()}
    dialects = {
        str(k).lower(): str(v).lower()
        for k, v in (tk.get("spk_is_dialect") or {}).items()
        if v not in (False, None, "")
    }
    for speaker, dialect in dialects.items():
        if dialect not in languages:
            raise CheckpointError(
                f"config.json: talker_config.spk_is_dialect gives {speaker} the dialect "
                f"{dialect!r}, which codec_language_id does not list"
            )
    gen = ckpt.generation_config
    generation = {k: gen.get(k, v) for k, v in GENERATION.items()}
    return {
        **artifacts.decoder_fields(dec, dtype),
        "num_code_groups": num_code_groups(cfg),
        "code_predictor": "../code_predictor",
        "tts_model_type": kind,
        "tts_model_size": str(cfg.get("tts_model_size", "")),
        "ids": {
            **{f"tts_{k}": need(cfg, f"tts_{k}_token_id", "") for k in ("bos", "eos", "pad")},
            **{
                k: need(tk, f"{k}_id", "talker_config.")
                for k in (
                    "codec_pad",
                    "codec_bos",
                    "codec_think",
                    "codec_nothink",
                    "codec_think_bos",
                    "codec_think_eos",
                )
            },  # fmt: skip
            "codec_eos": need(tk, "codec_eos_token_id", "talker_config."),
        },
        "languages": languages,
        "speakers": speakers,
        "dialects": dialects,
        "generation": generation,
        "min_new_tokens": MIN_NEW_TOKENS,
    }
