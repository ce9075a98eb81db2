"""Export a torch module to ONNX with the plugin ops, as the builder needs it."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Above this many parameter bytes the model goes to ONNX external data (protobuf stops at 2 GB).
EXTERNAL_DATA_BYTES = 1 << 30


def param_bytes(module: Any) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def export_onnx(
    module: Any,
    args: tuple[Any, ...],
    path: Path,
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_shapes: Any,
    opset: int = 23,
) -> Path:
    """torch.onnx.export (dynamo) with the plugin translations; returns the model path.

    The exporter's own chatter goes to the debug log; errors propagate.
    """
    import torch

    from edgeomni.plugins import attention, gated_delta, moe, rotary

    external = param_bytes(module) > EXTERNAL_DATA_BYTES
    path.parent.mkdir(parents=True, exist_ok=True)
    chatter = io.StringIO()
    for name in ("torch.onnx", "onnx_ir", "onnxscript"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with torch.no_grad(), contextlib.redirect_stdout(chatter), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=True,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_shapes=dynamic_shapes,
            custom_translation_table={
                **attention.onnx_translation(),
                **gated_delta.onnx_translation(),
                **moe.onnx_translation(),
                **rotary.onnx_translation(),
            },
            opset_version=opset,
            external_data=external,
        )
    logging.getLogger(__name__).debug("torch.onnx.export said:\n%s", chatter.getvalue())
    return path


def export_causal_lm(
    module: Any,
    path: Path,
    *,
    logits_topk: int = 0,
    topk_exclude: Sequence[int] = (),
    sampler_tables: Any = None,
    float32_embeds: bool = False,
    guidance: bool = False,
) -> Path:
    """Export a decoder (decoder.CausalLM, or a family's own with the same inputs, outputs and
    ``state_tensors``) with dynamic batch, sequence and cache capacity; with
    ``logits_topk`` the engine also outputs each row's top-K (decoder.WithTopK); with
    ``guidance`` it combines classifier-free guidance's row pairs first (decoder.WithGuidance:
    its logits and top-K are a guided row's). With
    ``sampler_tables`` [heads, V, H] (a multi-head decoder) it also draws each row's next id
    from a top-K of ``logits_topk`` or 64 and outputs its embedding (sampler.WithSampler).

    Example sizes are at least 2 on every dynamic axis: torch.export specialises axes of size 1.
    """
    import torch
    from torch.export import Dim

    from edgeomni.export.common.decoder import Float32Embeds, WithGuidance, WithTopK
    from edgeomni.export.common.sampler import WithSampler

    sampled = sampler_tables is not None
    # a sampler draws from a top-K of its own (64 unless asked)
    topk = min(logits_topk or (64 if sampled else 0), module.cfg.vocab_size)
    if guidance:
        if sampled or module.cfg.lm_heads > 1:
            raise ValueError("guidance takes a one-head decoder without an in-engine sampler")
        module = WithGuidance(module)
    if sampled:
        if topk_exclude:
            raise ValueError("an in-engine sampler takes no excluded ids")
        module = WithSampler(module, topk, sampler_tables)
    elif logits_topk:
        module = WithTopK(module, min(logits_topk, module.cfg.vocab_size), tuple(topk_exclude))
    cfg = module.cfg
    dtype = next(module.parameters()).dtype
    embeds_dtype = dtype
    if float32_embeds and dtype != torch.float32:
        module, embeds_dtype = Float32Embeds(module), torch.float32
    b, s, c = 2, 3, 8
    positions = torch.arange(s).repeat(b, 1)
    if cfg.mrope_section is not None:
        positions = positions[None].repeat(3, 1, 1)
    args = (
        torch.zeros(b, s, cfg.embeds_size, dtype=embeds_dtype),
        positions,
        torch.zeros(b, dtype=torch.int32),
        torch.full((b,), s, dtype=torch.int32),
        torch.full((b,), s - 1, dtype=torch.int64),
    )
    # the module's declared state, each tensor of b rows (a kv tensor's capacity c)
    state = module.state_tensors()
    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    rest: tuple[Any, ...] = tuple(
        torch.zeros(b, *t.row_shape(c), dtype=dtypes[t.dtype]) for t in state
    )
    batch, seq, capacity = Dim("batch"), Dim("seq"), Dim("capacity")
    rest_shapes: tuple[Any, ...] = tuple(
        {0: batch} if t.capacity_axis is None else {0: batch, t.capacity_axis + 1: capacity}
        for t in state
    )
    if cfg.deepstack_layers:
        deep = torch.zeros(cfg.deepstack_layers, b, s, cfg.hidden_size, dtype=embeds_dtype)
        rest = (deep, *rest)
        rest_shapes = ({1: batch, 2: seq}, *rest_shapes)
    if sampler_tables is not None:  # uniform [B] (float64), temperature, top_k, top_p [1]
        f64 = torch.float64
        draw = (torch.zeros(b, dtype=f64), torch.ones(1, dtype=f64),
                torch.full((1,), 2, dtype=torch.int64), torch.ones(1, dtype=f64))  # fmt: skip
        rest = (*draw, *rest)
        rest_shapes = ({0: batch}, None, None, None, *rest_shapes)
    if cfg.lm_heads > 1:
        rest = (torch.zeros(1, dtype=torch.int64), *rest)
        rest_shapes = (None, *rest_shapes)
    if guidance:  # guidance_rows [B] (each row its own), guidance_scale [B]
        rest = (torch.arange(b), torch.ones(b), *rest)
        rest_shapes = ({0: batch}, {0: batch}, *rest_shapes)
    position_shape = {1: batch, 2: seq} if cfg.mrope_section is not None else {0: batch, 1: seq}
    shapes = (
        {0: batch, 1: seq},
        position_shape,
        {0: batch},
        {0: batch},
        {0: batch},
        rest_shapes,
    )
    inputs, outputs = module.io_names()
    return export_onnx(
        module,
        (*args, *rest),
        path,
        input_names=inputs,
        output_names=outputs,
        dynamic_shapes=shapes,
    )
