"""Qwen3's one component: the llm backbone, exported with its KV cache."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from edgeomni.export.common import artifacts
from edgeomni.export.common.checkpoint import Checkpoint, CheckpointError
from edgeomni.export.common.checkpoint import position_limits as position_limits_of
from edgeomni.export.common.decoder import CausalLM
from edgeomni.export.common.memory_plan import F32, decoder_memory, table_rows
from edgeomni.export.common.onnx_export import export_causal_lm
from edgeomni.export.common.shapes import DimRanges, decoder_ranges
from edgeomni.export.families.qwen3.config import decoder_config
from edgeomni.export.families.qwen3.weights import EMBEDDING, load_weights
from edgeomni.export.family import BuildArgs, Component, ComponentMemory
from edgeomni.export.registry import LLM_RUNNER

LLM = Component(name="llm", subdir=".", engine="llm.onnx", runner=LLM_RUNNER)
_DTYPES = {"float32": torch.float32, "float16": torch.float16}


def components(ckpt: Checkpoint) -> tuple[Component, ...]:
    return (LLM,)


def preflight(ckpt: Checkpoint, components: Sequence[Component], args: BuildArgs) -> None:
    """What the build reads of config.json and the tokenizer, checked before any export."""
    decoder_config(ckpt.config)
    artifacts.require_tokenizer(ckpt)


def position_limits(
    ckpt: Checkpoint, components: Sequence[Component]
) -> dict[str, tuple[str, int]]:
    """The llm's position limit, for edge-build's warning past it."""
    return position_limits_of(ckpt.config, {LLM.name: ()}, (c.name for c in components))


def dim_ranges(ckpt: Checkpoint, component: Component, args: BuildArgs) -> DimRanges:
    """The sizes the llm is called with (export/common/shapes.py)."""
    return decoder_ranges(args.max_batch_size, args.max_input_len, args.max_kv_cache_capacity)


def memory_plan(ckpt: Checkpoint, component: Component, args: BuildArgs) -> ComponentMemory:
    """The llm as edge-build --estimate counts it: the exported module on the meta device, the
    float32 embedding table, the KV cache."""
    with torch.device("meta"):
        module = CausalLM(decoder_config(ckpt.config)).to(_DTYPES.get(args.dtype, torch.float32))
    return decoder_memory(module, {"embedding": (table_rows(module), F32)})


def export_component(
    ckpt: Checkpoint, component: Component, work_dir: Path, args: BuildArgs
) -> Path:
    if args.dtype not in _DTYPES:
        raise CheckpointError(f"dtype {args.dtype!r} is not supported for qwen3 on this path yet")
    module = CausalLM(decoder_config(ckpt.config)).eval()
    load_weights(module, ckpt, _DTYPES[args.dtype])
    return export_causal_lm(
        module,
        work_dir / component.engine,
        logits_topk=args.logits_topk or 0,
        float32_embeds=True,  # the runner's float32 table (artifacts.write_embedding)
    )


def write_artifacts(ckpt: Checkpoint, component: Component, out_dir: Path, args: BuildArgs) -> None:
    cfg = ckpt.config
    artifacts.write_embedding(ckpt.tensor(EMBEDDING), out_dir)
    artifacts.write_tokenizer(ckpt, out_dir)
    artifacts.write_engine_config(
        out_dir, artifacts.text_engine_config(ckpt, component, args, decoder_config(cfg), cfg)
    )
