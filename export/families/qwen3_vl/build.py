"""Qwen3-VL's components: the llm (at the engine dir's root) and its visual encoder
(``visual/``), what each exports and what the runtime needs beside each engine."""

from __future__ import annotations

from collections.abc import Sequence
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
from edgeomni.export.families.qwen3_vl.config import (
    EMBEDDING,
    TEXT_PREFIX,
    VISUAL_PREFIX,
    lm_head_name,
    media_tokens,
    text_decoder_config,
    vision_spec,
)
from edgeomni.export.family import BuildArgs, Component, ComponentMemory
from edgeomni.export.media import vision_encoder as visual
from edgeomni.export.registry import LLM_RUNNER

LLM = Component("llm", ".", "llm.onnx", LLM_RUNNER)
# no stage of its own: the llm's runner calls it (the stage config names where it is)
VISUAL = Component("visual", "visual", visual.ENGINE, LLM_RUNNER)
DTYPES = {"float32": torch.float32, "float16": torch.float16}
# attention rows (frames) one visual call may hold beside what the prompt limit allows: a
# video's frames each take at least a timestamp, two brackets and one merged token
MIN_SEGMENTS = 16
TOKENS_PER_FRAME = 4


def components(ckpt: Checkpoint) -> tuple[Component, ...]:
    """The llm always; the visual encoder when the checkpoint has it (with its config files
    alone, for edge-build --estimate: when its config has a vision_config)."""
    try:
        has_visual = any(ckpt.names(VISUAL_PREFIX))
    except CheckpointError:  # no weight files: what the config describes
        has_visual = isinstance(ckpt.config.get("vision_config"), dict)
    return (LLM, VISUAL) if has_visual else (LLM,)


def preflight(ckpt: Checkpoint, components: Sequence[Component], args: BuildArgs) -> None:
    """What the build reads of config.json and the small files (tokenizer, token ids, the image
    and video processor settings), checked before any export."""
    text_decoder_config(ckpt.config)
    media_tokens(ckpt.config)
    if LLM in components:
        artifacts.require_tokenizer(ckpt)
    if VISUAL in components:
        processor_settings(ckpt)


def position_limits(
    ckpt: Checkpoint, components: Sequence[Component]
) -> dict[str, tuple[str, int]]:
    """The llm's position limit, for edge-build's warning past it."""
    return position_limits_of(
        ckpt.config, {LLM.name: ("text_config",)}, (c.name for c in components)
    )


def llm_module(config: dict[str, Any]) -> CausalLM:
    """The llm's decoder as its config makes it, weights not loaded (on the meta device for
    edge-build --estimate)."""
    return CausalLM(text_decoder_config(config)).eval()


def build_llm(ckpt: Checkpoint, dtype: torch.dtype = torch.float32) -> CausalLM:
    module = llm_module(ckpt.config)

    def get(name: str) -> torch.Tensor:  # our "model.X" is the checkpoint's language_model's;
        # the head (lm_head_name) is named as the checkpoint stores it (a tied one's embedding)
        ours = name.startswith("model.") and not name.startswith(TEXT_PREFIX)
        return ckpt.tensor(TEXT_PREFIX + name[len("model.") :] if ours else name)

    load_decoder(module, get, prefix="", lm_head=lm_head_name(ckpt), dtype=dtype,
                 where=str(ckpt.path))  # fmt: skip
    return module


def export_component(
    ckpt: Checkpoint, component: Component, work_dir: Path, args: BuildArgs
) -> Path:
    if args.dtype not in DTYPES:
        raise CheckpointError(f"dtype {args.dtype!r} is not supported for qwen3_vl")
    path = work_dir / component.engine
    if component is LLM:
        # the runner looks its inputs up in a float32 table (artifacts.write_embedding)
        return export_causal_lm(build_llm(ckpt, DTYPES[args.dtype]), path,
                                logits_topk=args.logits_topk or 0, float32_embeds=True)  # fmt: skip
    spec = vision_spec()  # the encoder stays float32
    return visual.export_visual(visual.load_visual(ckpt.tensor, ckpt.config, spec), path, spec)


def processor_settings(ckpt: Checkpoint) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The image processor settings (required) and the video processor's (None: the build
    reads no video), as the checkpoint ships them."""
    image = visual.processor_settings(ckpt.path, "image", required=True)
    return image, visual.processor_settings(ckpt.path, "video")


def eos_ids(ckpt: Checkpoint) -> list[int]:
    """The configs' and generation_config.json's end-of-sequence ids."""
    return artifacts.eos_token_ids(ckpt, ckpt.config, section(ckpt.config, "text_config"))


def write_artifacts(ckpt: Checkpoint, component: Component, out_dir: Path, args: BuildArgs) -> None:
    if component is VISUAL:
        image, video = processor_settings(ckpt)
        artifacts.write_engine_config(out_dir, visual.visual_engine_config(
            ckpt.config, args.backend, args.device, image_processor=image,
            video_processor=video, spec=vision_spec(),
        ))  # fmt: skip
        return
    dec = text_decoder_config(ckpt.config)
    artifacts.write_embedding(ckpt.tensor(EMBEDDING), out_dir)
    artifacts.write_tokenizer(ckpt, out_dir)
    text = section(ckpt.config, "text_config")
    artifacts.write_engine_config(out_dir, {
        **artifacts.engine_fields(ckpt, component, args),
        **artifacts.decoder_fields(dec),
        "mrope_section": list(dec.mrope_section or ()),
        "deepstack_layers": dec.deepstack_layers,
        "eos_token_id": eos_ids(ckpt),
        "pad_token_id": text.get("pad_token_id", ckpt.generation_config.get("pad_token_id")),
        "generation_defaults": artifacts.generation_defaults(ckpt),
        "media_tokens": media_tokens(ckpt.config),
        "profiles": artifacts.decoder_profiles(args),
        "builder_config": artifacts.build_limits(args),
    })  # fmt: skip


def dim_ranges(ckpt: Checkpoint, component: Component, args: BuildArgs) -> DimRanges:
    """The sizes the runtime calls each component with (export/common/shapes.py): the llm as
    any decoder; the visual encoder with one request's image or video (a frame a segment)."""
    prompt = args.max_input_len
    if component is LLM:
        return decoder_ranges(args.max_batch_size, prompt, args.max_kv_cache_capacity)
    segments = max(MIN_SEGMENTS, prompt // TOKENS_PER_FRAME)
    return visual.visual_ranges(ckpt.config, prompt, segments, vision_spec())


def memory_plan(ckpt: Checkpoint, component: Component, args: BuildArgs) -> ComponentMemory:
    """What edge-build --estimate counts: the modules on the meta device, the float32
    embedding table, the KV cache."""
    with torch.device("meta"):
        if component is VISUAL:
            spec = vision_spec()
            return float_memory(spec.module(visual.vision_config(ckpt.config, spec)))
        module = llm_module(ckpt.config).to(DTYPES.get(args.dtype, torch.float32))
    return decoder_memory(module, {"embedding": (table_rows(module), F32)})
