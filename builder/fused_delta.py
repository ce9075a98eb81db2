"""Qwen3.5's Gated DeltaNet layers in the fused plan (builder/fused_plan.py hands this module
the nodes whose inputs are a DeltaNet layer's values).

A layer as export/families/qwen3_5/model.py writes it, and the plan steps it becomes:

- the input norm and ``in_proj``, split four ways (the conv's channels, z, beta's and the decay's
  inputs): one ``linear`` into the ``mix`` buffer;
- ``CausalConvState`` of the first part: ``delta_conv`` (the layer's conv state in place) into
  ``conv``, whose q, k and v the rule reads by column;
- beta = sigmoid(mix's beta columns) and the decay g = a_neg * softplus(mix's a columns +
  dt_bias) (a_neg = -exp(A_log), folded by the export; torch's softplus returns x itself above
  its threshold, a ``Where`` the plan keeps), then ``GatedDeltaRule``: one ``delta_rule`` step
  computing both gates and the rule (the layer's recurrent state in place) into ``attn``;
- the output's per-head RMSNorm times silu(z): ``gated_norm`` of ``attn`` in place;
- ``out_proj`` and the residual: the ``linear`` any layer's o projection is.

The plan's numpy reference (tests/fused_reference.py) pins what the kernels compute; the
engine's calls equal it on a GPU (tests/test_fused_gpu.py)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from edgeomni.builder.fused_proofs import Unfused
from edgeomni.builder.fused_values import Buf, Part

if TYPE_CHECKING:
    from edgeomni.builder.fused_plan import Compiler


@dataclasses.dataclass
class Conv:  # the conv's output (q, k and v side by side), or its part ``index``
    layer: int
    index: int = -1
    sizes: tuple[int, ...] = ()


@dataclasses.dataclass
class Decay:  # the decay gate as far as built: "biased" (a + dt_bias), "above" (its
    stage: str  # Greater than the threshold), "softplus", "g" (times a_neg)
    dt_bias: str
    threshold: float | None = None  # softplus returns x itself above it (None: never)
    a_neg: str | None = None


@dataclasses.dataclass
class Out:  # the rule's output in attn (as of ``version``), with its per-head norm once taken
    layer: int
    version: int
    norm: str | None = None


VALUES = (Conv, Decay, Out)


def claims(c: Compiler, op: str, args: list[Any]) -> bool:
    """Whether the node is a DeltaNet layer's: its state ops, or an input of its values."""
    if op in ("CausalConvState", "GatedDeltaRule"):
        return True
    if op == "Sigmoid" and isinstance(args[0], Part):
        return False  # beta's, and silu(z)'s: the walk's own sigmoid of a part
    lin = c.delta.get("lin")
    return any(isinstance(a, VALUES) or isinstance(a, Part) and lin is not None and a.lin is lin
               for a in args)  # fmt: skip


def visit(c: Compiler, op: str, args: list[Any], ins: list[str], outs: list[str],
          attrs: dict[str, Any], where: str) -> None:  # fmt: skip
    n = c.layers
    init = [a[1] if isinstance(a, tuple) and a[0] == "init" else None for a in args]
    if op == "CausalConvState":
        conv(c, args, ins, outs, attrs, where)
    elif op == "Split" and isinstance(args[0], Conv) and args[0].index < 0:
        sizes = tuple(int(s) for s in c.array(ins[1])) if len(ins) > 1 else ()
        if len(sizes) != 3 or sizes[0] != sizes[1] or attrs.get("axis") not in (-1, 2):
            raise Unfused(f"{where}: a split of the conv into {sizes}, not q, k and v")
        for i, out in enumerate(outs):
            c.env[out] = Conv(args[0].layer, i, sizes)
    elif op == "Add" and _part(c, args[0], 3) and init[1]:
        c.env[outs[0]] = Decay("biased", c.vec(init[1], f"layers.{n}.dt_bias"))
    elif op == "Softplus" and _decay(args[0], "biased"):
        c.env[outs[0]] = dataclasses.replace(args[0], stage="softplus")
    elif op == "Greater" and _decay(args[0], "biased") and init[1]:
        threshold = np.asarray(c.array(init[1])).reshape(-1)
        if threshold.size != 1:
            raise Unfused(f"{where}: a softplus threshold of {threshold.size} values")
        c.env[outs[0]] = dataclasses.replace(args[0], stage="above", threshold=float(threshold[0]))
    elif op == "Where" and _decay(args[0], "above") and _decay(args[1], "biased") and \
            _decay(args[2], "softplus") and args[2].threshold is None:  # fmt: skip
        c.env[outs[0]] = dataclasses.replace(args[2], threshold=args[0].threshold)
    elif op == "Mul" and any(_decay(a, "softplus") for a in args) and any(init):
        gate = next(a for a in args if _decay(a, "softplus"))
        c.env[outs[0]] = dataclasses.replace(gate, stage="g", a_neg=c.vec(
            next(i for i in init if i), f"layers.{n}.a_neg"))  # fmt: skip
    elif op == "Mul" and all(_part(c, a, 1) for a in args) and sum(a.sig for a in args) == 1:
        z = next(a for a in args if not a.sig)
        c.env[outs[0]] = dataclasses.replace(z, silu=True)  # z * sigmoid(z)
    elif op == "GatedDeltaRule":
        rule(c, args, ins, outs, attrs, where)
    elif op == "RMSNormalization" and isinstance(args[0], Out) and args[0].norm is None and \
            init[1]:  # fmt: skip
        c.same_eps(attrs, where)
        c.env[outs[0]] = dataclasses.replace(args[0], norm=c.vec(init[1], f"layers.{n}.delta_norm"))
    elif op == "Mul" and any(isinstance(a, Out) and a.norm for a in args) and \
            any(_part(c, a, 1) and a.silu for a in args):  # fmt: skip
        out = next(a for a in args if isinstance(a, Out))
        c.current("attn", out.version, where)
        c.current("mix", c.delta["mix"], where)
        c.steps.append({"op": "gated_norm", "layer": out.layer, "weight": out.norm})
        c.layers += 1
        c.delta.pop("lin")
        c.env[outs[0]] = Buf("attn", c.wrote("attn"))
    else:
        raise Unfused(f"{where} is not something a Gated DeltaNet layer's steps compute")


def conv(c: Compiler, args: list[Any], ins: list[str], outs: list[str], attrs: dict[str, Any],
         where: str) -> None:  # fmt: skip
    """The layer's in_proj stored into mix, then its conv of mix's first columns."""
    x, n = args[0], c.layers
    if not (isinstance(x, Part) and x.index == 0 and len(x.sizes) == 4 and x.lin.rows == "all"
            and not (x.norm or x.rope or x.sig or x.silu or x.gated)):  # fmt: skip
        raise Unfused(f"{where}: a conv of {type(x).__name__}, not of in_proj's first part")
    if ins[2:4] != [f"past_conv_{n}", "query_lens"] or outs[1] != f"present_conv_{n}":
        raise Unfused(f"{where}: layer {n} reads {ins[2:4]} and writes {outs[1:]}")
    weight = ins[1]
    kernel = int(attrs.get("kernel_size", 0))
    channels = x.sizes[0]
    if weight not in c.inits or list(c.inits[weight].dims) != [channels, kernel]:
        raise Unfused(f"{where}: conv weights of no [{channels}, {kernel}] initializer")
    activation = attrs.get("activation", b"silu")
    activation = activation.decode() if isinstance(activation, bytes) else str(activation)
    if activation not in ("silu", "none"):
        raise Unfused(f"{where}: a conv activation {activation!r}")
    lin = x.lin
    lin.weight = c.rename(lin.weight, f"layers.{n}.in_proj")
    if lin.norm is not None:
        lin.norm = c.rename(lin.norm, f"layers.{n}.input_norm")
    if lin.bias is not None:
        raise Unfused(f"{where}: an in_proj with a bias")
    c.versions.setdefault("mix", 0)
    c.store(lin, "mix")
    c.delta.update(lin=lin, mix=c.versions["mix"])
    c.steps.append({"op": "delta_conv", "layer": n, "weight": c.weight(
        weight, f"layers.{n}.conv", lambda a: a), "kernel": kernel,  # the matrices' type
        "silu": activation == "silu"})  # fmt: skip
    c.env[outs[0]] = Conv(n)
    c.produced.add(outs[1])


def rule(c: Compiler, args: list[Any], ins: list[str], outs: list[str], attrs: dict[str, Any],
         where: str) -> None:  # fmt: skip
    """The decay and beta gates and the rule, one step into attn."""
    q, k, v, g, beta = args[:5]
    n = c.layers
    if not all(isinstance(p, Conv) and p.layer == n for p in (q, k, v)) or \
            [p.index for p in (q, k, v)] != [0, 1, 2]:  # fmt: skip
        raise Unfused(f"{where}: q, k and v are not the layer's conv in thirds")
    if not _decay(g, "g") or not (_part(c, beta, 2) and beta.sig):
        raise Unfused(f"{where}: its gates are not a_neg * softplus(a + dt_bias) and "
                      "sigmoid(b) of the layer's in_proj")  # fmt: skip
    if ins[5:7] != [f"past_recurrent_{n}", "query_lens"] or outs[1] != f"present_recurrent_{n}":
        raise Unfused(f"{where}: layer {n} reads {ins[5:7]} and writes {outs[1:]}")
    hk, hv = int(attrs["num_k_heads"]), int(attrs["num_v_heads"])
    key, value = q.sizes[0], q.sizes[2]
    sizes = beta.sizes
    if key % hk or value % hv or hv % hk or sizes != (2 * key + value, value, hv, hv):
        raise Unfused(f"{where}: in_proj parts {sizes} for {hk} key and {hv} value heads")
    dims = {"k_heads": hk, "v_heads": hv, "k_dim": key // hk, "v_dim": value // hv,
            "conv_kernel": c.steps[-1]["kernel"] if c.steps[-1]["op"] == "delta_conv" else 0}
    if dims["conv_kernel"] == 0:
        raise Unfused(f"{where}: the rule does not follow its layer's conv")
    if c.spec.setdefault("delta", dims) != dims:
        raise Unfused(f"{where}: Gated DeltaNet dimensions {dims}, not the model's "
                      f"{c.spec['delta']}")  # fmt: skip
    c.current("mix", c.delta["mix"], where)
    c.steps.append({"op": "delta_rule", "layer": n, "dt_bias": g.dt_bias, "a_neg": g.a_neg,
                    "softplus_threshold": g.threshold, "l2": int(attrs.get("qk_l2norm", 1)),
                    "scale": float(attrs.get("scale", 0.0))})  # fmt: skip
    c.env[outs[0]] = Out(n, c.wrote("attn"))
    c.produced.add(outs[1])


def _part(c: Compiler, x: Any, index: int) -> bool:
    """``x`` is part ``index`` of the layer's in_proj (z: 1, beta: 2, the decay's a: 3)."""
    return isinstance(x, Part) and x.lin is c.delta.get("lin") and x.index == index


def _decay(x: Any, stage: str) -> bool:
    return isinstance(x, Decay) and x.stage == stage
