"""edge-build --estimate: the memory a build will need, from the checkpoint's config alone.

Each family's optional ``memory_plan(ckpt, component, args)`` hook gives, per component, the
torch module its export starts from, built on the meta device (shapes, no weights, no memory),
the host tables its artifacts hold and its declared row state. This file turns that into bytes
by the rules the build follows: weights at the build's dtype, the linear layers the quantization
pass takes (builder/quantize.py) at plugins/quant_linear.py's packed size and the MoE experts it
takes at plugins/quant_moe.py's, tables as written, the row state of --max-batch-size rows (a
KV cache at --max-kv-cache-capacity, a linear-attention layer's fixed-size state). Not counted: activations and the backend's
workspace (small for decode at batch sizes an edge device runs; a long prefill adds its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgeomni.builder.errors import BuildError
from edgeomni.export.family import BuildArgs, Component, ComponentMemory

GB = 1e9
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# memory of the edge devices users place models on (Jetson modules' unified memory)
DEVICES = (("Jetson Orin Nano", 8), ("Orin NX", 16), ("AGX Orin", 32), ("AGX Orin", 64),
           ("AGX Thor", 128))  # fmt: skip


@dataclass(frozen=True)
class Estimate:
    component: str
    engine_bytes: int  # the engine's weights as stored
    quantized_bytes: int  # of which int4 codes, scales
    float_params: int  # parameters left float
    table_bytes: int  # host tables (embeddings the runtime memory-maps)
    kv_bytes: int

    @property
    def total(self) -> int:
        return self.engine_bytes + self.table_bytes + self.kv_bytes


def estimate_component(
    mem: ComponentMemory, args: BuildArgs, stored: tuple[int, bool] | None = None
) -> tuple[int, int, int]:
    """(engine bytes, of which quantized, float parameters) of one component's module.
    ``stored``: an int4 checkpoint's (group size, zero points): its decoders' linear layers
    are counted at that layout (builder/prequant.py), what it leaves float as --quantization
    says."""
    import torch

    from edgeomni.builder.prequant import block_for
    from edgeomni.plugins import quant_linear, quant_moe

    decoder = mem.state is not None
    quantize = args.quantization is not None and (decoder or args.quantize_encoders)
    held = stored is not None and decoder
    experts, routers = _moe_weights(mem.module, args.group_size)
    linear = {id(m.weight) for m in mem.module.modules()
              if isinstance(m, torch.nn.Linear) and id(m.weight) not in routers}  # fmt: skip
    total = quantized = floats = 0
    seen: set[int] = set()
    tensors = [*mem.module.named_parameters(), *mem.module.named_buffers()]
    for name, t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        shape = None  # (K, N) of a MatMul weight the pass would quantize
        size = None  # its bytes packed
        if quantize and id(t) in experts:  # [E, N, K]: the pass packs each expert's [K, N]
            size = quant_moe.packed_bytes(*(int(d) for d in t.shape), args.group_size,
                                          t.element_size())  # fmt: skip
        elif held and id(t) in linear:  # the checkpoint's own int4
            k, n = int(t.shape[1]), int(t.shape[0])
            block = block_for(k if stored[0] == -1 else stored[0])  # type: ignore[index]
            if block and k % block == 0:
                size = quant_linear.packed_bytes(k, n, block, t.element_size(), stored[1])  # type: ignore[index]
        elif quantize and id(t) in linear:
            shape = (int(t.shape[1]), int(t.shape[0]))  # nn.Linear stores [N, K]
        elif (quantize and args.quantize_lm_head and t.dim() == 2
              and mem.lm_head and (name == mem.lm_head or name.startswith(mem.lm_head + "."))):  # fmt: skip
            shape = (int(t.shape[0]), int(t.shape[1]))  # stored [H, V]: already [K, N]
        if shape and shape[0] % args.group_size == 0:
            size = quant_linear.packed_bytes(*shape, args.group_size, t.element_size(), False)
        if size is not None:
            total += size
            quantized += size
            continue
        total += t.numel() * t.element_size()
        floats += t.numel()
    return total, quantized, floats


def _moe_weights(module: Any, group_size: int) -> tuple[set[int], set[int]]:
    """ids of (the expert weights, fc1 [E, 2I, H] and fc2 [E, H, I], of the MoE blocks the pass
    packs: those whose H and I are both multiples of the group size; every block's router
    weight, which the pass leaves float)."""
    from edgeomni.export.common.moe import ThinkerSparseMoE

    experts: set[int] = set()
    routers: set[int] = set()
    for m in module.modules():
        if not isinstance(m, ThinkerSparseMoE):
            continue
        routers.add(id(m.gate.weight))
        if not (m.fc1.shape[2] % group_size or m.fc2.shape[2] % group_size):
            experts.update((id(m.fc1), id(m.fc2)))
    return experts, routers


def estimate(
    ckpt: Any, hooks: Any, selected: Sequence[Component], args: BuildArgs
) -> list[Estimate]:
    plan = getattr(hooks, "memory_plan", None)
    if not callable(plan):
        raise BuildError(f"--estimate: the {ckpt.model_type} family gives no memory plan yet")
    from edgeomni.export.common.prequantized import stored_layout

    stored = stored_layout(ckpt.config)
    out = []
    for comp in selected:
        mem = plan(ckpt, comp, args)
        engine, quantized, floats = estimate_component(mem, args, stored)
        tables = sum(_numel(shape) * DTYPE_BYTES[dtype] for shape, dtype in mem.tables.values())
        # the declared row state: every tensor of max batch rows, a KV row at the capacity
        kv = args.max_batch_size * sum(t.row_bytes(args.max_kv_cache_capacity)
                                       for t in mem.state or ())  # fmt: skip
        out.append(Estimate(comp.name, engine, quantized, floats, tables, kv))
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def report(model_dir: Any, rows: Sequence[Estimate], args: BuildArgs, ckpt: Any = None) -> str:
    """The table edge-build --estimate prints."""
    weights = (
        f"{args.quantization} group {args.group_size} "
        f"(lm_head {'int4' if args.quantize_lm_head else 'float'})"
        if args.quantization
        else args.dtype
    )
    scheme = getattr(ckpt, "quantization", None)
    if scheme is not None and scheme.int4:
        weights = f"the checkpoint's {scheme.describe()} linears as stored, the rest " + weights
    lines = [
        f"memory estimate for {model_dir}: decoder weights {weights}, {args.dtype} KV cache "
        f"{args.max_batch_size} x {args.max_kv_cache_capacity} slots",
    ]
    total = sum(r.total for r in rows)
    unit, scale = ("GB", GB) if total >= GB else ("MB", 1e6)
    lines.append(f"{'component':<16}" + "".join(f"{h + ' ' + unit:>16}" for h in
                 ("engine", "tables", "row state", "total")))  # fmt: skip
    sums = [sum(r.engine_bytes for r in rows), sum(r.table_bytes for r in rows),
            sum(r.kv_bytes for r in rows), total]  # fmt: skip
    for name, values in [*((r.component, [r.engine_bytes, r.table_bytes, r.kv_bytes, r.total])
                           for r in rows), ("total", sums)]:  # fmt: skip
        lines.append(f"{name:<16}" + "".join(f"{v / scale:>16.3f}" for v in values))
    fits = [f"{name} {gb} GB {'yes' if total < gb * GB else 'no'}" for name, gb in DEVICES]
    lines.append("fits (before the OS and activations): " + ", ".join(fits))
    lines.append("GB = 1e9 bytes; engine = its weights as stored; tables = host embedding tables; "
                 "row state = every request row's KV cache at the capacity and, for a "
                 "linear-attention model, its recurrent and convolution state; not counted: "
                 "activations and the backend's workspace")  # fmt: skip
    return "\n".join(lines)
