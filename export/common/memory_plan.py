"""Pieces of the families' memory_plan hooks (edge-build --estimate): a component's module is
built as its export builds it, on torch's meta device (shapes only, no weights, no memory)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgeomni.export.family import ComponentMemory

F32 = "float32"
Tables = dict[str, tuple[tuple[int, ...], str]]


def module_shapes(module: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
    """name -> (shape, dtype) of every entry of a (meta) module's state dict."""
    return {n: (tuple(t.shape), t.dtype) for n, t in module.state_dict().items()}


def decoder_memory(module: Any, tables: Tables, dtype: str) -> ComponentMemory:
    """A decoders.CausalLM with its host tables; its KV cache (in ``dtype``) from its config."""
    from edgeomni.graph_schema.state import kv_tensors

    cfg = module.cfg
    return ComponentMemory(module, tables, kv_tensors(cfg.num_layers, cfg.num_kv_heads,
                                                    cfg.head_dim, dtype))  # fmt: skip


def float_memory(module: Any) -> ComponentMemory:
    """An encoder or vocoder: float32 as built, no tables, no KV cache."""
    import torch

    return ComponentMemory(module.to(torch.float32), {}, None)


def table_rows(module: Any) -> tuple[int, int]:
    """A decoder's input table: a row of its input width per token of its vocabulary."""
    return (module.cfg.vocab_size, module.cfg.embeds_size)


def fold(owner: Any, stored: Mapping[str, tuple[int, ...]]) -> None:
    """Count ``owner``'s own tensors (a meta module's, not its children's) as the float32 tables
    ``stored`` (name -> shape) instead: for a forward that computes tables from these weights
    alone (a codebook as a sum over usage counts, what a distance search multiplies by), which
    the backend's constant folding stores in their place (ONNX Runtime's graph optimisation of
    a CPU build)."""
    import torch

    for name in [*owner._parameters, *owner._buffers]:
        delattr(owner, name)
    for name, shape in stored.items():
        owner.register_buffer(name, torch.empty(shape, dtype=torch.float32, device="meta"))
