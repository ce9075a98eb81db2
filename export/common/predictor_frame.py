"""A code predictor's whole frame as one engine call (the CPU's code predictor).

The code predictor (Qwen3-Omni's, Qwen3-TTS's) completes a codec frame in 15 dependent steps:
[the talker's hidden state, E(code 0)], then each drawn code's embedding, each step read by
its own head. Run as 15 engine calls it pays, each step, a call's setup, a copy of the chosen
head out of the stacked ones (8 MB at Qwen3-TTS 0.6B: a tenth of a CPU step), the host's draw
and an embedding lookup. Here the 15 steps are one graph: the same decoder body (its weights
shared by every step), each step its own head as a plain weight (so int4 covers the heads),
the cache a tensor of the graph that lives for the call, each code drawn and its embedding
looked up in the graph.

The draw is the runtime's (runtime/sampling.py ``candidate_distribution`` and ``_draw``) over
the full vocabulary, so every setting is drawn here, none left to the host: TopK over the whole
vocabulary gives the order a draw walks candidates in (the highest logit first, the lower id
first among equals: ONNX's TopK breaks ties so); with neither top-k nor top-p the walk is in id
order, as the runtime's. One uniform number a row and step, from the request's generator on the
host, in the order the host draws them. The arithmetic is float64 on both sides; only the order
of a sum's terms may differ, so a draw can differ from the host's only where a uniform number
falls within rounding of the boundary between two candidates. Greedy is top-k 1 at
temperature 1 with uniform 0: the lowest id among the best, as ``argmax``.

Inputs: ``talker_hidden`` [B, 1, E], ``first_embeds`` [B, 1, E] (E(code 0), the talker's
table), ``sample_uniform`` [G-1, B] float64, ``sample_temperature`` and ``sample_top_p`` [1]
float64, ``sample_top_k`` [1] int64 (0: off), ``code_tables`` [G-1, V, E] float32 (the
residual groups' embedding tables: the host's own, bound once, so no copy is kept in the
engine). Outputs: ``frame_codes`` [B, G-1] int64, the
residual codes, and ``frame_embeds`` [B, E] float32, the frame's summed code embeddings
(E(code 0) plus each residual's, added in the runtime's order). No row state: nothing
outlives a call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgeomni.export.common.decoder import CausalLM
from edgeomni.export.common.sampler import walk
from edgeomni.graph_schema.state import StateTensor

FRAME_INPUTS = ("talker_hidden", "first_embeds", "sample_uniform", "sample_temperature",
                "sample_top_k", "sample_top_p", "code_tables")  # fmt: skip
FRAME_OUTPUTS = ("frame_codes", "frame_embeds")
# the heads' weights are named so (builder/quantize.py leaves them float under
# --no-quantize-lm-head, as a decoder's lm_head)
HEADS = "frame_heads"


def draw(
    logits: torch.Tensor,
    uniform: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
) -> torch.Tensor:
    """One code a row from ``logits`` [B, V] (float32), as runtime/sampling.py draws it over
    the full logits; ``uniform`` [B] float64. Returns the ids [B]."""
    vocab = logits.shape[-1]
    values, ids = torch.topk(logits, vocab, dim=-1)  # the walk: best first, lower id on ties
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, vocab)
    in_ids = ((top_k <= 0) | (top_k >= vocab)) & (top_p >= 1.0)  # no top-k, no top-p: id order
    order = torch.cumsum(torch.ones_like(ids), -1) - 1  # 0..V-1 made in the graph, not stored
    x = torch.where(in_ids, logits, values).to(torch.float64)
    ids = torch.where(in_ids, order, ids)
    kth = values.to(torch.float64).index_select(1, k - 1)  # [B, 1]; ties with it stay
    return walk(x, ids, kth, uniform, temperature, top_p)


class PredictorFrame(nn.Module):
    """A multi-head decoder (the code predictor, ``lm_heads`` = G - 1) run for a whole frame;
    the tables it reads, [G-1, V, E], are its last input."""

    def __init__(self, decoder: CausalLM) -> None:
        super().__init__()
        cfg = decoder.cfg
        if cfg.lm_heads < 2:
            raise ValueError("a frame engine takes a decoder with a head per residual group")
        self.cfg = cfg
        self.decoder = decoder
        # each head a weight of its own: a step multiplies by it, nothing gathers or copies it;
        # the decoder gives its stacked heads up (it runs up to its final norm only here)
        stacked = decoder.lm_head_t.detach()
        setattr(self, HEADS, nn.ParameterList(
            nn.Parameter(stacked[i].clone()) for i in range(cfg.lm_heads)))  # fmt: skip
        decoder.lm_head_t = nn.Parameter(stacked.new_empty(0))

    def forward(
        self,
        talker_hidden: torch.Tensor,
        first_embeds: torch.Tensor,
        uniform: torch.Tensor,
        temperature: torch.Tensor,
        top_k: torch.Tensor,
        top_p: torch.Tensor,
        tables: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        heads = getattr(self, HEADS)
        b = talker_hidden.shape[0]
        steps = cfg.lm_heads
        dtype = heads[0].dtype
        # the frame's cache: [hidden, E(c0)] then one code a step
        shape = (b, cfg.num_kv_heads, steps + 1, cfg.head_dim)
        cache = [talker_hidden.new_zeros(shape, dtype=dtype) for _ in range(2 * cfg.num_layers)]
        ones = torch.ones_like(uniform[0], dtype=torch.int32)  # [B]
        x = torch.cat([talker_hidden, first_embeds], dim=1).to(dtype)
        past, codes = 0, []
        rows = tables.reshape(-1, tables.shape[-1])
        total = first_embeds[:, 0].to(torch.float32)
        for step in range(steps):
            width = x.shape[1]
            positions = torch.arange(past, past + width).expand(b, width)
            if cfg.mrope_section is not None:
                positions = positions.unsqueeze(0).expand(3, b, width)
            last, _, cache = self.decoder.last_hidden(
                x, positions, ones * past, ones * width, (ones * (width - 1)).long(), None, cache
            )
            code = draw((last @ heads[step]).float(), uniform[step], temperature, top_k, top_p)
            codes.append(code)
            past += width
            # the drawn rows of the flattened tables: only they are read (tables[step] would
            # copy the whole [V, E] table out of the input first)
            embed = rows.index_select(0, code + step * cfg.vocab_size)  # [B, E] float32
            total = total + embed
            x = embed.unsqueeze(1).to(dtype)
        return torch.stack(codes, dim=1), total

    def state_tensors(self) -> list[StateTensor]:
        return []

    def io_names(self) -> tuple[list[str], list[str]]:
        return list(FRAME_INPUTS), list(FRAME_OUTPUTS)


def export_predictor_frame(module: CausalLM, path: Path) -> Path:
    """Export the code predictor ``module`` as a frame engine (dynamic batch)."""
    from torch.export import Dim

    from edgeomni.export.common.onnx_export import export_onnx

    frame = PredictorFrame(module).eval()
    cfg = frame.cfg
    b, f64 = 2, torch.float64
    dtype = module.lm_head_t.dtype
    args: tuple[Any, ...] = (
        torch.zeros(b, 1, cfg.embeds_size, dtype=dtype),
        torch.zeros(b, 1, cfg.embeds_size, dtype=dtype),
        torch.zeros(cfg.lm_heads, b, dtype=f64),
        torch.ones(1, dtype=f64),
        torch.full((1,), 2, dtype=torch.int64),
        torch.ones(1, dtype=f64),
        torch.zeros(cfg.lm_heads, cfg.vocab_size, cfg.embeds_size),
    )
    batch = Dim("batch")
    shapes = ({0: batch}, {0: batch}, {1: batch}, None, None, None, None)
    inputs, outputs = frame.io_names()
    export_onnx(frame, args, path, input_names=inputs, output_names=outputs,
                dynamic_shapes=shapes)  # fmt: skip
    fold_weight_transposes(path)
    return path


def fold_weight_transposes(path: Path) -> None:
    """One weight a Linear, read by a plain MatMul at every step. The exporter folds a
    Linear's transpose into a weight of its own where it folds (small weights: then once per
    step, so a weight is stored 15 times), and leaves a ``Transpose`` node where it does not
    (large ones): the first are merged back into one (equal tensors are one), the second folded,
    so the int4 pass sees each weight once, read by MatMuls."""
    import hashlib

    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    kept = []
    for node in graph.node:
        perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
        source = inits.get(node.input[0]) if node.op_type == "Transpose" else None
        if source is not None and len(source.dims) == 2 and perm in ([], [[1, 0]]):
            value = np.ascontiguousarray(numpy_helper.to_array(source).T)
            graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
            continue
        kept.append(node)
    first: dict[tuple[Any, ...], str] = {}
    renamed: dict[str, str] = {}
    for t in graph.initializer:
        key = (t.data_type, tuple(t.dims), hashlib.sha256(numpy_helper.to_array(t).tobytes()).digest())
        renamed[t.name] = first.setdefault(key, t.name)
    for node in kept:
        node.input[:] = [renamed.get(i, i) for i in node.input]
    del graph.node[:]
    graph.node.extend(kept)
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    keep = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    onnx.save(model, str(path))
