"""The symbolic values builder/fused_plan.py's walk gives a graph's tensors: what each one
is in terms of the kernels' steps (a buffer a step wrote, a norm or product not yet stored, a
part of a split product, ...), so that the plain ops around a plugin op can fold into it."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Buf:  # a buffer a step wrote: "h" (the residual stream), "attn", "logits", "embeds"
    name: str
    version: int = 0  # which write of it (a step reads the buffer as it is then)


@dataclasses.dataclass
class Norm:  # RMSNormalization of the residual stream, not yet applied
    weight: str
    version: int  # of h


@dataclasses.dataclass
class Rows:  # the last positions' rows of a normed residual stream
    norm: str
    version: int  # of h


@dataclasses.dataclass
class Lin:  # x @ W not yet stored
    x: str  # "h", "attn", "act", "embeds"
    weight: str
    k: int
    n: int
    norm: str | None = None
    rows: str = "all"  # or "last": the rows of last_indices
    bias: str | None = None
    heads: bool = False  # W is one of stacked heads, picked by lm_head_index
    version: int = 0  # of x
    axes: tuple[int, ...] = (-1, 2)  # its last axis, two ways (matmul() sets it)


@dataclasses.dataclass
class Part:  # one output of a Split of a product
    lin: Lin
    index: int
    sizes: tuple[int, ...]
    norm: str | None = None  # a per-head RMSNormalization (q or k)
    rope: bool = False
    silu: bool = False
    sig: bool = False
    gated: bool = False  # q: each head's q beside its output gate (Qwen3.5's q_proj)
    rotary: int = 0  # rope on each head's first ``rotary`` dims alone (0: all of them)


@dataclasses.dataclass
class HeadSlice:  # a normed q or k part's first ``dims`` of each head (or the rest)
    part: Part
    dims: int
    first: bool
    rope: bool = False


@dataclasses.dataclass
class AttnGate:  # the output gates beside q in a gated q projection (sigmoid once taken)
    lin: Lin
    sig: bool = False


@dataclasses.dataclass
class Act:  # SwiGLU of a product's two halves
    lin: Lin


@dataclasses.dataclass
class Gate:  # sigmoid of a one-column product (a shared expert's gate)
    lin: Lin


@dataclasses.dataclass
class Shared:  # a shared expert's down projection times its gate
    down: Lin
    gate: Lin


@dataclasses.dataclass
class Moe:  # an edgeomni::MoE of the normed residual stream, not yet added into it
    router: Lin
    fc1: str
    fc2: str
    top_k: int
    normalize: int
    shared: Shared | None = None  # Qwen3-Omni's talker: + sigmoid(gate) * shared expert


@dataclasses.dataclass
class Const:  # a value of shapes and constants only, or an index path the kernels take
    what: str  # "", "position", "last", "head", "stacked:<weight>", "deep:<n>", "bias:<weight>"
