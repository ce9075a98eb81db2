"""Qwen3-Omni's build hooks (the registry's module for it): its components, what each exports
and what the runtime needs beside each engine; the speech components' shared parts are
export/speech/'s."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeomni.export.common import artifacts
from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError
from edgeomni.export.common.checkpoint import position_limits as position_limits_of
from edgeomni.export.common.decoder import decoder_dtype
from edgeomni.export.common.onnx_export import export_causal_lm
from edgeomni.export.families.qwen3_omni import (
    CODE2WAV_RUNNER,
    TALKER_RUNNER,
    code2wav,
    talker,
    thinker,
)
from edgeomni.export.families.qwen3_omni.config import section
from edgeomni.export.families.qwen3_omni.memory import memory_plan  # noqa: F401 (a hook)
from edgeomni.export.families.qwen3_omni.shapes import dim_ranges  # noqa: F401 (a hook)
from edgeomni.export.families.qwen3_omni.topology import multistage_topology  # noqa: F401
from edgeomni.export.family import BuildArgs, Component
from edgeomni.export.media import audio_encoder as audio
from edgeomni.export.media import vision_encoder as visual
from edgeomni.export.registry import LLM_RUNNER
from edgeomni.export.speech import parts
from edgeomni.export.speech.parts import CALIBRATION_FRAMES, left_out  # noqa: F401

LLM = Component("llm", ".", "llm.onnx", LLM_RUNNER)
# the encoders are no stages of their own: the thinker's runner calls them
AUDIO = Component("audio", "audio", audio.ENGINE, LLM_RUNNER)
VISUAL = Component("visual", "visual", visual.ENGINE, LLM_RUNNER)
SPEECH = parts.components(TALKER_RUNNER, CODE2WAV_RUNNER)
TALKER, CODE_PREDICTOR, CODE2WAV, CODE2WAV_STREAM = SPEECH


def components(ckpt: Checkpoint) -> tuple[Component, ...]:
    """The thinker always, its encoders and the speech components when the checkpoint has them
    (with its config files alone, for edge-build --estimate: when its config has their
    sections)."""
    out = [LLM]
    if _has(ckpt, "thinker.audio_tower.", ("thinker_config", "audio_config")):
        out.append(AUDIO)
    if _has(ckpt, "thinker.visual.", ("thinker_config", "vision_config")):
        out.append(VISUAL)
    if ckpt.config.get("enable_audio_output", True) and _has(ckpt, "talker.", ("talker_config",)):
        out.extend(SPEECH)
    return tuple(out)


def _has(ckpt: Checkpoint, prefix: str, config_section: tuple[str, ...]) -> bool:
    try:
        return any(ckpt.names(prefix))
    except CheckpointError:  # no weight files: what the config describes
        try:
            section(ckpt.config, *config_section)
        except CheckpointError:
            return False
        return True


def preflight(ckpt: Checkpoint, components: Sequence[Component], args: BuildArgs) -> None:
    """What write_artifacts reads of config.json and the small files (tokenizer, speakers and
    ids, image processor settings, a code2wav the step can stream), checked before any
    export."""
    if LLM in components:
        artifacts.require_tokenizer(ckpt)
    if TALKER in components:
        talker_fields(ckpt)
    if VISUAL in components:
        image_processor_settings(ckpt)
    if CODE2WAV_STREAM in components:
        stream_config(ckpt, args)


def stream_config(ckpt: Checkpoint, args: BuildArgs) -> dict[str, Any]:
    """The step engine's config.json fields; a CheckpointError for a code2wav it cannot step."""
    try:
        return code2wav.omni_engine_config(
            ckpt.config, backend=args.backend, device=args.device
        )
    except ValueError as e:
        raise CheckpointError(f"config.json: code2wav_config: {e}") from None


def position_limits(
    ckpt: Checkpoint, components: Sequence[Component]
) -> dict[str, tuple[str, int]]:
    """The thinker's and talker's position limits, for edge-build's warning past them (the
    code predictor's cache holds one frame's codes, whatever the flag)."""
    sections = {
        LLM.name: ("thinker_config", "text_config"),
        TALKER.name: ("talker_config", "text_config"),
    }
    return position_limits_of(ckpt.config, sections, (c.name for c in components))


def export_component(
    ckpt: Checkpoint, component: Component, work_dir: Path, args: BuildArgs
) -> Path:
    dtype, path = decoder_dtype(ckpt, args), work_dir / component.engine
    if component in (CODE2WAV, CODE2WAV_STREAM):  # reads no other flag: the same for any device
        model = code2wav.load_code2wav(ckpt.tensor, ckpt.config)
        if component is CODE2WAV_STREAM:
            return code2wav.export_omni(model, path)
        return code2wav.export_code2wav(model, path)
    topk = args.logits_topk or 0
    if component is LLM:
        # the runner looks its inputs up in a float32 table (artifacts.write_embedding)
        return export_causal_lm(
            thinker.build_module(ckpt, dtype), path, logits_topk=topk, float32_embeds=True
        )
    if component is TALKER:
        return export_causal_lm(
            talker.build_talker(ckpt, dtype),
            path,
            logits_topk=topk,
            topk_exclude=talker.suppressed_codes(ckpt.config),
        )
    if component is CODE_PREDICTOR:
        return parts.export_predictor(talker, ckpt, path, args)
    if component is AUDIO:
        return audio.export_audio_encoder(audio.load_audio_tower(ckpt.tensor, ckpt.config), path)
    if component is VISUAL:
        return visual.export_visual(visual.load_visual(ckpt.tensor, ckpt.config), path)
    raise CheckpointError(f"qwen3_omni_moe has no component {component.name!r}")


def write_artifacts(ckpt: Checkpoint, component: Component, out_dir: Path, args: BuildArgs) -> None:
    from safetensors.torch import save_file

    base = artifacts.engine_fields(ckpt, component, args)
    if component is LLM:
        artifacts.write_embedding(ckpt.tensor(thinker.EMBEDDING), out_dir)
        artifacts.write_tokenizer(ckpt, out_dir)
        artifacts.write_engine_config(out_dir, thinker.engine_config(ckpt, component.engine, args))
    elif component is TALKER:
        artifacts.write_embedding(ckpt.tensor(talker.CODEC_EMBEDDING), out_dir)
        tables = talker.projection_tensors(ckpt)
        special = [ckpt.config[f"tts_{k}_token_id"] for k in ("bos", "eos", "pad")]
        tables["tts_special"] = ckpt.tensor(thinker.EMBEDDING)[special].float().contiguous()
        save_file(tables, str(out_dir / "projections.safetensors"))
        artifacts.write_engine_config(
            out_dir, {**base, **talker_fields(ckpt, args.dtype), "builder_config": artifacts.build_limits(args)}
        )
    elif component is AUDIO:
        artifacts.write_engine_config(
            out_dir,
            audio.audio_engine_config(ckpt.config, backend=args.backend, device=args.device),
        )
    elif component is VISUAL:
        settings = image_processor_settings(ckpt)
        artifacts.write_engine_config(
            out_dir,
            visual.visual_engine_config(
                ckpt.config, args.backend, args.device, image_processor=settings
            ),
        )
    elif component is CODE_PREDICTOR:
        parts.write_predictor(talker, ckpt, out_dir, base, args)
    elif component is CODE2WAV_STREAM:
        artifacts.write_engine_config(out_dir, stream_config(ckpt, args))
    else:
        artifacts.write_engine_config(
            out_dir,
            code2wav.code2wav_engine_config(ckpt.config, backend=args.backend, device=args.device),
        )


def image_processor_settings(ckpt: Checkpoint) -> dict[str, Any]:
    """The checkpoint's image processor settings (preprocessor_config.json, or the
    "image_processor" section of processor_config.json), which the visual engine folder keeps."""
    return visual.processor_settings(ckpt.path, "image", required=True)


def calibration_fields(ckpt: Checkpoint) -> dict[str, Any]:
    """int4_awq's calibration requests speak at most CALIBRATION_FRAMES frames."""
    return {"talker_max_new_tokens": CALIBRATION_FRAMES}


def talker_fields(ckpt: Checkpoint, dtype: str = "float32") -> dict[str, Any]:
    """What the talker runner needs: dimensions, the token and codec ids, the speakers."""
    cfg = ckpt.config
    tk = section(cfg, "talker_config")
    th = section(cfg, "thinker_config")
    speakers = {str(k).lower(): int(v) for k, v in (tk.get("speaker_id") or {}).items()}
    if not speakers:
        raise CheckpointError("config.json: talker_config.speaker_id lists no speakers")
    dec = talker.talker_decoder_config(cfg)

    def need(where: dict[str, Any], key: str) -> int:
        if not isinstance(where.get(key), int):
            raise CheckpointError(f"config.json: {key} is missing")
        return int(where[key])

    return {
        **artifacts.decoder_fields(dec, dtype),
        "mrope_section": list(dec.mrope_section or ()),
        "num_code_groups": need(tk, "num_code_groups"),
        "code_predictor": "../code_predictor",
        "ids": {
            "im_start": need(cfg, "im_start_token_id"),
            "user": need(cfg, "user_token_id"),
            "assistant": need(cfg, "assistant_token_id"),
            "audio": need(th, "audio_token_id"),
            "image": need(th, "image_token_id"),
            "video": need(th, "video_token_id"),
            "codec_nothink": need(tk, "codec_nothink_id"),
            "codec_think_bos": need(tk, "codec_think_bos_id"),
            "codec_think_eos": need(tk, "codec_think_eos_id"),
            "codec_pad": need(tk, "codec_pad_id"),
            "codec_bos": need(tk, "codec_bos_id"),
            "codec_eos": need(tk, "codec_eos_token_id"),
        },
        # the talker's own 3-D positions when a user turn holds an image (get_rope_index)
        "mrope_ids": {
            "image_token_id": need(tk, "image_token_id"),
            "video_token_id": need(tk, "video_token_id"),
            "audio_token_id": need(tk, "audio_token_id"),
            "vision_start_token_id": need(tk, "vision_start_token_id"),
            "audio_start_token_id": need(tk, "audio_start_token_id"),
            "spatial_merge_size": int(tk.get("spatial_merge_size") or 2),
            "position_id_per_seconds": int(tk.get("position_id_per_seconds") or 25),
            "audio_n_window": int((th.get("audio_config") or {}).get("n_window") or 50),
        },
        "tts_pad_token_id": need(cfg, "tts_pad_token_id"),
        "speakers": speakers,
        "default_speaker": "ethan" if "ethan" in speakers else sorted(speakers)[0],
    }
