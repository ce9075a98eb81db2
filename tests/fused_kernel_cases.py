"""Calls of plugins/decoder_cuda.py's kernels, as data, each with the check of its results
against the kernel's numpy reference: run on a GPU (tests/test_fused_gpu.py) and, compiled by
g++ with a thread per CUDA thread, on the CPU (tests/test_fused_kernels_host.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeomni.plugins import decoder_cuda as dc
from edgeomni.plugins import decoder_linear_cuda as lc
from edgeomni.plugins.decoder_gemm_cuda import GEMM_ROWS

# an argument: ("buf", name), ("null",), ("i32", v), ("i64", v) or ("f32", v)
Arg = tuple[Any, ...]


@dataclass
class Launch:
    kernel: str
    grid: tuple[int, ...]
    block: int
    args: list[Arg]
    shared: int = 0  # dynamic shared memory, bytes


@dataclass
class KernelCase:
    name: str
    buffers: dict[str, np.ndarray]
    launches: list[Launch]
    check: Callable[[dict[str, np.ndarray]], None] = field(repr=False)


def buf(name: str | None) -> Arg:
    return ("buf", name) if name else ("null",)


LINEAR_MODES = {
    "plain": {}, "norm": {"norm": True}, "swiglu": {"norm": True, "swiglu": True},
    "residual": {"resid": True}, "bias": {"bias": True}, "half_input": {"half_x": True},
    "last_rows": {"rowmap": True, "norm": True}, "heads": {"heads": True},
    # SwiGLU's output stored in float16 (for a down projection on tensor cores)
    "swiglu_half": {"norm": True, "swiglu": True, "half_out": True},
}  # fmt: skip


def linear_case(dtype: str, rows: int, mode: str, n: int = 72, k: int | None = None,
                warps: int | None = None, group: int = 0) -> KernelCase:  # fmt: skip
    """``k`` (default a little over one pass of the lanes) and ``warps`` (default the engine's
    split of K) pick how many warps a block has and how many passes each takes. ``group``:
    the matrix is int4 with one scale a row and ``group`` of K (float16 modules)."""
    m = LINEAR_MODES[mode]
    wt = np.dtype(dtype)
    rng = np.random.default_rng(rows)
    k = k or (136 if wt == np.float16 else 132)
    seq = 3
    heads = 3 if m.get("heads") else 1
    w = (rng.standard_normal((heads, (2 if m.get("swiglu") else 1) * n, k)) * 0.1).astype(wt)
    xrows = rows * seq if m.get("rowmap") else rows
    x = rng.standard_normal((xrows, k)).astype(np.float16 if m.get("half_x") else np.float32)
    g = rng.standard_normal(k).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    last = rng.integers(0, seq, rows).astype(np.int64)
    out0 = rng.standard_normal((rows, n)).astype(np.float16 if m.get("half_out") else np.float32)
    head = np.array([2 if heads > 1 else 0], np.int64)
    wq = None  # int4: the codes and scales the kernel reads, w the matrix they stand for
    if group:
        from edgeomni.plugins.quant_linear import quantize_symmetric

        flat = w.reshape(-1, k)
        packed, scales = quantize_symmetric(flat.astype(np.float32).T, group, np.float16)
        wq = {"w": packed.reshape(len(flat), k // 2), "scales": scales}
        w = lc.int4_weights(wq["w"], scales, group).reshape(w.shape)
    # from GEMM_ROWS rows the GEMM, whether or not its tiles would fill a GPU (gemm_pays)
    plan = lc.linear_launch(dtype, rows, k, n,
                            half_input=bool(m.get("half_x")), swiglu=bool(m.get("swiglu")),
                            warps=warps, int4=bool(group),
                            gemm_way=None if warps else rows >= GEMM_ROWS)  # fmt: skip
    args = [buf("x"), buf("last" if m.get("rowmap") else None), ("i32", seq),
            buf("g" if m.get("norm") else None), ("f32", 1e-6), buf("w"),
            ("i64", w.shape[1] * k), buf("head" if heads > 1 else None),
            buf("bias" if m.get("bias") else None), buf("out"), ("i32", rows), ("i32", k),
            ("i32", n), ("i32", lc.STORE_HALF if m.get("half_out")
                            else lc.STORE_ADD if m.get("resid") else lc.STORE_SET)]  # fmt: skip
    if plan.scales:
        args += [buf("scales" if group else None), ("i32", group)]
    launch = Launch(plan.name, plan.grid, plan.block, args)

    mma = lc.linear_uses_mma(dtype, rows)
    # on tensor cores x is rounded to float16, and int4 weights too once dequantized
    wref = w.astype(np.float16).astype(np.float32) if group and mma else w

    def check(got: dict[str, np.ndarray]) -> None:
        xs = x.reshape(rows, seq, k)[np.arange(rows), last] if m.get("rowmap") else x
        want = lc.linear_reference(
            xs, wref[head[0]], norm_w=g if m.get("norm") else None, eps=1e-6,
            bias=bias if m.get("bias") else None, swiglu=bool(m.get("swiglu")),
            residual=out0 if m.get("resid") else None, half_x=mma,
        )  # fmt: skip
        if m.get("half_out"):  # the float32 result rounded once to float16
            scale = max(1.0, np.abs(want).max())
            assert np.abs(got["out"] - want).max() <= 1e-3 * scale
            assert np.mean(got["out"] == want.astype(np.float16)) > 0.95
            return
        assert np.abs(got["out"] - want).max() <= 1e-5 * max(1.0, np.abs(want).max())

    buffers = {"x": x, "w": w, "g": g, "bias": bias, "last": last, "out": out0, "head": head,
               **(wq or {})}  # fmt: skip
    long_k = f"-k{k}-n{n}-w{plan.block // 32}" if k > 200 else ""
    name = f"linear-{dtype}-{'int4-g' + str(group) + '-' if group else ''}{mode}-{rows}{long_k}"
    return KernelCase(name, buffers, [launch], check)


ROPE_SHAPES = [(4, 2, 16, False), (16, 8, 128, False), (4, 2, 32, True)]


def rope_case(dtype: str, heads: int, kv_heads: int, d: int, mrope: bool, norm: bool,
              warps: int | None = None, gated: bool = False, rotary: int = 0) -> KernelCase:
    """``warps``: heads a block (default the engine's): 3 for 8 heads leaves the last block 2.
    ``gated``: each q head followed by its output gate in the product (Qwen3.5); ``rotary``:
    the rotary on each head's first dims alone (0: all)."""
    at = np.dtype(dtype)
    rng = np.random.default_rng(d)
    t, r = 7, rotary or d
    qkv = rng.standard_normal((t, ((2 if gated else 1) * heads + 2 * kv_heads) * d)
                              ).astype(np.float32)  # fmt: skip
    pos = rng.integers(0, 3000, (3 if mrope else 1, t)).astype(np.int64)
    inv = (1.0 / 1e6 ** (np.arange(0, r, 2) / r)).astype(np.float32)
    axis = (np.arange(r // 2) % 3).astype(np.int32)
    qn, kn = (rng.standard_normal(d).astype(np.float32) for _ in range(2))
    buffers = {"qkv": qkv, "pos": pos, "inv": inv, "axis": axis, "qn": qn, "kn": kn,
               **{name: np.zeros((t, h * d), at)
                  for name, h in (("q", heads), ("k", kv_heads), ("v", kv_heads))}}  # fmt: skip
    grid, block, shared = dc.rope_launch(t, heads + 2 * kv_heads, d, warps)
    args = [buf("qkv"), buf("pos"), ("i32", t), buf("qn" if norm else None),
            buf("kn" if norm else None), ("f32", 1e-6), buf("inv"),
            buf("axis" if mrope else None), buf("q"), buf("k"), buf("v"), ("i32", heads),
            ("i32", kv_heads), ("i32", d), ("i32", int(gated)), ("i32", r)]  # fmt: skip

    def check(got: dict[str, np.ndarray]) -> None:
        want = dc.qk_rope_reference(
            qkv, pos, heads=heads, kv_heads=kv_heads, head_dim=d, inv_freq=inv,
            q_norm=qn if norm else None, k_norm=kn if norm else None,
            freq_axis=axis if mrope else None, gated=gated, rotary_dim=rotary or None,
        )  # fmt: skip
        tol = 2e-3 if at == np.float16 else 2e-5  # cosf of angles up to 3000 rad, then the type
        for name, ref in zip("qkv", want, strict=True):
            err = np.abs(got[name].astype(np.float64) - ref).max()
            assert err <= tol * max(1, np.abs(ref).max()), name

    name = f"rope-{dtype}-{heads}x{d}-{'mrope' if mrope else '1d'}-{'norm' if norm else 'plain'}"
    name += (f"-w{warps}" if warps else "") + ("-gated" if gated else "")
    name += f"-r{rotary}" if rotary else ""
    return KernelCase(name, buffers, [Launch("qk_rope", grid, block, args, shared)], check)


SAMPLE_SETTINGS = [(0.0, 1, 1.0), (1.0, 50, 0.8), (1.3, 10, 1.0), (0.6, 63, 0.3), (0.9, 2, 0.95)]


def topk_case(dtype: str, rows: int, vocab: int, k: int, flat: bool = False,
              draw: tuple[float, int, float] | None = None, half: bool = True,
              spread: bool = False) -> KernelCase:  # fmt: skip
    """``flat``: every logit equal (the top K is the lowest ids); a vocabulary just over a
    chunk leaves the last chunk fewer ids than K (its padding is among its candidates). One
    chunk runs ``topk_one``, more ``topk_chunks`` + ``topk_merge``. ``half``: they also write the
    float16 logits and values, and select among the float16 logits (a float16 build); else
    among the float32 ones. ``spread``: logits float16 cannot hold, so the two differ. ``draw`` (temperature, top_k, top_p; temperature 0: greedy as the engine
    feeds it, top-k 1 at temperature 1 and uniform 0): each row's draw and its embedding too,
    with one row all equal (undecided: -1) and one with its best value repeated."""
    rng = np.random.default_rng(vocab)
    logits = np.round(rng.standard_normal((rows, vocab)) * 4).astype(np.float32)  # many ties
    if flat:
        logits[:] = 1.5
    if spread:  # close values float16 rounds together: its ties are not float32's
        logits = (1.0 + rng.random((rows, vocab)) * 1e-3).astype(np.float32)
    bias = np.zeros(vocab, np.float32)
    if draw is None:
        bias[rng.integers(0, vocab, 20)] = -np.inf
    else:  # float16-valued logits, as a GPU engine gives them: equal values are common
        logits = (rng.standard_normal((rows, vocab)) * 2).astype(np.float16).astype(np.float32)
        logits[1] = 0.5
        logits[2, rng.choice(vocab, 5, replace=False)] = logits[2].max()
    chunks = -(-vocab // dc.TOPK_CHUNK)
    heads, width = 3, 40
    temperature, top_k, top_p = draw or (1.0, 1, 1.0)
    greedy = temperature == 0.0
    t, kk, tp = (1.0, 1, 1.0) if greedy else (temperature, top_k, top_p)
    uniform = np.zeros(rows) if greedy else rng.random(rows)
    tables = rng.standard_normal((heads, vocab, width)).astype(dtype)
    buffers = {"logits": logits, "bias": bias, "logits_h": np.zeros((rows, vocab), np.float16),
               "cand_v": np.zeros((rows, chunks * k), np.float32),
               "cand_i": np.zeros((rows, chunks * k), np.int32),
               "out_v": np.zeros((rows, k), np.float32), "out_i": np.zeros((rows, k), np.int64),
               "out_h": np.zeros((rows, k), np.float16), "u": uniform, "t": np.array([t]),
               "k": np.array([kk], np.int64), "p": np.array([tp]),
               "head": np.array([1], np.int64), "tables": tables,
               "drawn": np.zeros(rows, np.int64), "embeds": np.zeros((rows, width), dtype)}  # fmt: skip
    if draw is None:
        draws: list[Arg] = [buf(None)] * 6 + [("i32", 0), buf(None), buf(None)]
    else:
        draws = [buf("u"), buf("t"), buf("k"), buf("p"), buf("head"), buf("tables"),
                 ("i32", width), buf("drawn"), buf("embeds")]  # fmt: skip
    outs = [buf("out_v"), buf("out_i"), buf("out_h" if half else None)]
    logits_h = buf("logits_h" if half else None)
    if chunks == 1:
        launches = [Launch("topk_one", (1, rows), 512, [buf("logits"), buf("bias"),
                           ("i32", vocab), ("i32", k), logits_h, *outs, *draws])]  # fmt: skip
    else:
        launches = [
            Launch("topk_chunks", (chunks, rows), 512, [buf("logits"), buf("bias"),
                   ("i32", vocab), ("i32", k), logits_h, buf("cand_v"), buf("cand_i")]),
            Launch("topk_merge", (rows,), 512, [buf("cand_v"), buf("cand_i"),
                   ("i32", chunks * k), ("i32", k), *outs, ("i32", vocab), *draws]),
        ]  # fmt: skip

    def check(got: dict[str, np.ndarray]) -> None:
        chosen = logits.astype(np.float16).astype(np.float32) if half else logits
        values, indices = dc.topk_reference(chosen, k, bias)
        np.testing.assert_array_equal(got["out_i"], indices)
        np.testing.assert_array_equal(got["out_v"], values)
        if half:
            np.testing.assert_array_equal(got["out_h"], values.astype(np.float16))
            np.testing.assert_array_equal(got["logits_h"], logits.astype(np.float16))
        else:
            assert not got["out_h"].any() and not got["logits_h"].any()
        if draw is None:
            assert not got["drawn"].any() and not got["embeds"].any()
            return
        want, rows_of = dc.sample_reference(values, indices, uniform, temperature=t, top_k=kk,
                                            top_p=tp, tables=tables, head=1)  # fmt: skip
        assert want[1] == -1 and (want >= 0).sum() >= rows - 2
        np.testing.assert_array_equal(got["drawn"], want)
        np.testing.assert_array_equal(got["embeds"], rows_of)

    name = f"topk-{rows}x{vocab}-{k}{'-flat' if flat else ''}{'' if half else '-f32'}"
    name += "-spread" if spread else ""
    if draw is not None:
        name = f"draw-{dtype}-{vocab}-T{temperature}-k{top_k}-p{top_p}"
    return KernelCase(name, buffers, launches, check)


def cast_case(dtype: str) -> KernelCase:
    """The float16 boundary kernels: embeddings in, outputs out, DeepStack added."""
    rng = np.random.default_rng(7)
    n = 1000
    half = rng.standard_normal(n).astype(np.float16)
    f = rng.standard_normal(n).astype(np.float32)
    h = rng.standard_normal(n).astype(np.float32)
    buffers = {"half": half, "f": f, "to_f": np.zeros(n, np.float32),
               "to_h": np.zeros(n, np.float16), "h": h.copy(), "h2": h.copy()}
    grid = (-(-n // 256),)
    launches = [Launch("half_to_float", grid, 256, [buf("to_f"), buf("half"), ("i64", n)]),
                Launch("float_to_half", grid, 256, [buf("to_h"), buf("f"), ("i64", n)]),
                Launch("add_into", grid, 256, [buf("h"), buf("f"), ("i64", n)]),
                Launch("add_into_h", grid, 256, [buf("h2"), buf("half"), ("i64", n)])]  # fmt: skip

    def check(got: dict[str, np.ndarray]) -> None:
        np.testing.assert_array_equal(got["to_f"], half.astype(np.float32))
        np.testing.assert_array_equal(got["to_h"], f.astype(np.float16))
        np.testing.assert_allclose(got["h"], h + f, rtol=1e-6)
        np.testing.assert_allclose(got["h2"], h + half.astype(np.float32), rtol=1e-6)

    return KernelCase(f"casts-{dtype}", buffers, launches, check)


def rms_rows_case(rows: int = 3, seq: int = 4, hidden: int = 200) -> KernelCase:
    """last_hidden: each row's last position, normed."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((rows * seq, hidden)).astype(np.float32)
    w = rng.standard_normal(hidden).astype(np.float32)
    last = rng.integers(0, seq, rows).astype(np.int64)
    buffers = {"x": x, "w": w, "last": last, "out": np.zeros((rows, hidden), np.float32)}
    args = [buf("x"), buf("last"), ("i32", seq), buf("w"), ("f32", 1e-6), buf("out"),
            ("i32", hidden)]  # fmt: skip

    def check(got: dict[str, np.ndarray]) -> None:
        picked = x.reshape(rows, seq, hidden)[np.arange(rows), last].astype(np.float64)
        want = picked * lc.rms_scale(picked, 1e-6) * w
        np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-6)

    return KernelCase("rms_rows", buffers, [Launch("rms_rows", (rows,), 256, args)], check)


def moe_case(dtype: str, tokens: int, experts: int, top_k: int, hidden: int, inter: int,
             normalize: int, shared: bool = False, grouped: bool = False,
             gemm: bool = False, group: int = 0) -> KernelCase:  # fmt: skip
    """The MoE step's three kernels (plugins/moe_cuda.py) after its router: routing, each
    chosen expert's SwiGLU, the weighted down projections added into h (with ``shared``, a
    shared expert's output times sigmoid of its gate too). ``grouped``: then the grouped
    kernels too, on a copy of h: the same activations and h, bit for bit. ``gemm``: the grouped
    products as tensor-core GEMMs, whose inputs are rounded to float16 (checked against the
    reference with that rounding). ``group``: int4 experts, one float16 scale a row and
    ``group`` of K (float16 modules; the GEMM rounds each dequantized weight to float16)."""
    from edgeomni.plugins import moe_cuda

    wt = np.dtype(dtype)
    rng = np.random.default_rng(tokens * 31 + experts)
    h = rng.standard_normal((tokens, hidden)).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, hidden).astype(np.float32)
    router = (rng.standard_normal((tokens, experts)) * 2).astype(np.float32)
    fc1 = (rng.standard_normal((experts, 2 * inter, hidden)) * 0.1).astype(wt)
    fc2 = (rng.standard_normal((experts, hidden, inter)) * 0.1).astype(wt)
    quant: dict[str, np.ndarray] = {}  # int4: the codes and scales, fc1 and fc2 what they code
    if group:
        from edgeomni.plugins.quant_moe import quantize_experts

        for name, fc in (("fc1", fc1), ("fc2", fc2)):
            quant[name], quant[name + "_s"] = quantize_experts(fc, group, np.float16)
        fc1, fc2 = (lc.int4_weights(quant[n].reshape(-1, f.shape[2] // 2),
                                    quant[n + "_s"].reshape(len(f) * f.shape[1], -1),
                                    group).reshape(f.shape)
                    for n, f in (("fc1", fc1), ("fc2", fc2)))  # fmt: skip
    scale_args = [[buf(n + "_s" if group else None), ("i32", group.bit_length() - 1 if group else 0)]
                  for n in ("fc1", "fc2")]  # fmt: skip
    gemm_scales = [[a, ("i32", group)] for a, _ in scale_args]
    buffers = {"h": h.copy(), "nw": nw, "router": router, "fc1": fc1, "fc2": fc2,
               "ids": np.zeros((tokens, top_k), np.int32),
               "weights": np.zeros((tokens, top_k), np.float32),
               "act": np.zeros((tokens * top_k, inter), np.float32),
               "shared": rng.standard_normal((tokens, hidden)).astype(np.float32),
               "gate": rng.standard_normal((tokens, 1)).astype(np.float32)}  # fmt: skip
    buffers.update(quant)  # int4: the kernels read the codes, "fc1_s" and "fc2_s" their scales
    shapes = moe_cuda.launches(tokens, hidden, inter, top_k)
    args = {
        "moe_route": [buf("router"), ("i32", experts), ("i32", top_k), ("i32", normalize),
                      buf("ids"), buf("weights")],
        "moe_gate_up": [buf("h"), buf("nw"), ("f32", 1e-6), buf("fc1"), buf("ids"),
                        ("i32", top_k), ("i32", hidden), ("i32", inter), buf("act"),
                        *scale_args[0]],
        "moe_down": [buf("act"), buf("fc2"), buf("ids"), buf("weights"), ("i32", top_k),
                     ("i32", hidden), ("i32", inter), buf("shared" if shared else None),
                     buf("gate" if shared else None), buf("h"), *scale_args[1]],
    }  # fmt: skip
    # (the GEMM cases run the routing alone before the grouped kernels: the per-slot kernels'
    # block a slot made their emulation the slowest of the cases)
    launches = [Launch(name, grid, block, args[name], shared)
                for name, (grid, block, shared) in shapes.items()
                if not gemm or name == "moe_route"]  # fmt: skip
    slots = tokens * top_k
    if grouped:
        assert moe_cuda.grouped(tokens, top_k, experts), "a grouped case has more slots"
        assert not gemm or moe_cuda.uses_gemm(True, dtype, hidden, inter), "K the GEMM takes"
        buffers.update(h2=h.copy(), act2=np.zeros_like(buffers["act"]),
                       offsets=np.full(experts + 1, -1, np.int32),
                       order=np.full(slots, -1, np.int32),
                       xn=np.zeros((tokens, hidden), np.float32),
                       d=np.zeros((slots, hidden), np.float32),
                       tiles=np.full(moe_cuda.tiles_size(slots, experts), -1, np.int32))  # fmt: skip
        q4 = "_q4" if group else ""
        products = {
            "moe_gate_up_gemm" + q4: [buf("xn"), buf("fc1"), buf("offsets"), buf("order"),
                                      buf("tiles"), ("i32", top_k), ("i32", hidden),
                                      ("i32", inter), buf("act2"), *gemm_scales[0]],
            "moe_down_gemm" + q4: [buf("act2"), buf("fc2"), buf("offsets"), buf("order"),
                                   buf("tiles"), ("i32", hidden), ("i32", inter), buf("d"),
                                   *gemm_scales[1]],
        }  # fmt: skip
        more = {
            **(products if gemm else {}),
            "moe_group": [buf("ids"), ("i32", slots), ("i32", experts), buf("offsets"),
                          buf("order"), buf("tiles" if gemm else None)],
            "moe_norm": [buf("h2"), buf("nw"), ("f32", 1e-6), ("i32", hidden), buf("xn")],
            "moe_gate_up_grouped": [buf("xn"), buf("fc1"), buf("offsets"), buf("order"),
                                    ("i32", top_k), ("i32", hidden), ("i32", inter),
                                    buf("act2"), *scale_args[0]],
            "moe_down_grouped": [buf("act2"), buf("fc2"), buf("offsets"), buf("order"),
                                 ("i32", hidden), ("i32", inter), buf("d"), *scale_args[1]],
            "moe_combine": [buf("d"), buf("weights"), ("i32", top_k), ("i32", hidden),
                            buf("shared" if shared else None), buf("gate" if shared else None),
                            buf("h2")],
        }  # fmt: skip
        grouped_shapes = moe_cuda.launches(tokens, hidden, inter, top_k, experts, gemm=gemm,
                                           int4=bool(group))  # fmt: skip
        launches += [Launch(name, grid, block, more[name], smem)
                     for name, (grid, block, smem) in grouped_shapes.items()
                     if name in more]  # fmt: skip

    def check(got: dict[str, np.ndarray]) -> None:
        from edgeomni.plugins import moe

        ids, weights = moe.routing(router, top_k=top_k, normalize_routing=normalize)
        np.testing.assert_array_equal(got["ids"], ids)
        np.testing.assert_allclose(got["weights"], weights, rtol=1e-5)
        extra = {"shared": buffers["shared"], "gate": buffers["gate"]} if shared else {}
        want = moe_cuda.reference(h, nw, 1e-6, router, fc1, fc2, top_k=top_k,
                                  normalize=normalize, **extra)  # fmt: skip
        if not gemm:
            np.testing.assert_allclose(got["h"], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        if grouped:  # each expert's slots in order, and the per-slot kernels' very bits
            flat = ids.reshape(-1)
            order = np.argsort(flat, kind="stable")
            counts = np.bincount(flat, minlength=experts)
            np.testing.assert_array_equal(got["offsets"], np.concatenate([[0], np.cumsum(counts)]))
            np.testing.assert_array_equal(got["order"], order)
            if gemm:  # the tile list, and the products of float16-rounded inputs
                tiles = [(e, r) for e in range(experts) for r in range(0, counts[e], 64)]
                assert got["tiles"][0] == len(tiles)
                np.testing.assert_array_equal(got["tiles"][1:1 + 2 * len(tiles)],
                                              np.array(tiles, np.int32).reshape(-1))  # fmt: skip
                rounded = [f.astype(np.float16) if group else f for f in (fc1, fc2)]
                _check_moe_gemm(got, h, nw, ids, weights, *rounded, extra)
                return
            np.testing.assert_array_equal(got["act2"], got["act"])
            np.testing.assert_array_equal(got["h2"], got["h"])

    name = (f"moe-{dtype}-t{tokens}-e{experts}-k{top_k}-n{normalize}{'-shared' * shared}"
            f"{'-grouped' * grouped}{'-gemm' * gemm}{f'-int4-g{group}' if group else ''}")  # fmt: skip
    return KernelCase(name, buffers, launches, check)


def _check_moe_gemm(got: dict[str, np.ndarray], h: np.ndarray, nw: np.ndarray, ids: np.ndarray,
                    weights: np.ndarray, fc1: np.ndarray, fc2: np.ndarray,
                    extra: dict[str, np.ndarray]) -> None:  # fmt: skip
    """The GEMMs' activations and h: each slot's products of float16-rounded inputs (the
    kernels' own normed states and activations, each checked first), float32 sums."""
    half = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    x = h.astype(np.float64)
    xn = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * nw
    np.testing.assert_allclose(got["xn"], xn, rtol=1e-5, atol=1e-6 * np.abs(xn).max())
    top_k, flat = ids.shape[1], ids.reshape(-1)
    act = np.zeros((flat.size, fc2.shape[2]))
    for slot, e in enumerate(flat):
        y = half(got["xn"][slot // top_k]) @ fc1[e].astype(np.float64).T
        gate, up = y[0::2], y[1::2]  # fc1's rows interleaved: gate, up, gate, up, ...
        act[slot] = gate / (1.0 + np.exp(-gate)) * up
    np.testing.assert_allclose(got["act2"], act, rtol=1e-4, atol=1e-5 * np.abs(act).max())
    d = np.stack([half(got["act2"][s]) @ fc2[e].astype(np.float64).T for s, e in enumerate(flat)])
    y = (weights.reshape(-1, 1) * d).reshape(ids.shape[0], top_k, -1).sum(1)
    if extra:
        y = y + extra["shared"] / (1.0 + np.exp(-extra["gate"].astype(np.float64)))
    np.testing.assert_allclose(got["h2"], x + y, rtol=1e-4, atol=1e-5 * np.abs(x + y).max())


def frame_sum_case(dtype: str, rows: int, half_out: bool, text: bool) -> KernelCase:
    """A codec frame's summed embedding (``frame_sum``): the first code's row plus each drawn
    group's table row (one undecided id, -1, adding nothing), plus the next text row; equal to
    the host's float32 sum bit for bit (and its float16 rounding)."""
    wt = np.dtype(dtype)
    rng = np.random.default_rng(rows * 7 + half_out)
    groups, vocab, width = 5, 40, 300  # a width past one block
    base = rng.standard_normal((rows, width)).astype(np.float32)
    add = rng.standard_normal((rows, width)).astype(np.float32)
    tables = rng.standard_normal((groups, vocab, width)).astype(wt)
    codes = rng.integers(0, vocab, (groups, rows)).astype(np.int64)
    codes[2, rows - 1] = -1
    out = np.zeros((rows, width), np.float16 if half_out else np.float32)
    grid, block = dc.frame_sum_launch(rows, width)
    args = [buf("base"), buf("add" if text else None), buf("codes"), buf("tables"),
            ("i32", groups), ("i32", rows), ("i32", vocab), ("i32", width),
            ("i32", int(half_out)), buf("out")]  # fmt: skip

    def check(got: dict[str, np.ndarray]) -> None:
        want = dc.frame_sum_reference(base, codes, tables, add if text else None)
        np.testing.assert_array_equal(got["out"], want.astype(out.dtype))
        # the host's own sum, written as runtime/speech/code_predictor.py adds it
        host = base.copy()
        for g in range(groups):
            host += np.where(codes[g][:, None] >= 0, tables[g][codes[g]].astype(np.float32), 0)
        np.testing.assert_array_equal(want, host + add if text else host)

    buffers = {"base": base, "add": add, "codes": codes, "tables": tables, "out": out}
    name = f"frame_sum-{dtype}-r{rows}{'-half' * half_out}{'-text' * text}"
    return KernelCase(name, buffers, [Launch("frame_sum", grid, block, args)], check)


def first_draw_case(dtype: str, settings: tuple[float, int, float], penalty: float,
                    half_first: bool) -> KernelCase:  # fmt: skip
    """``first_draw``: a talker's top K with bans and a repetition penalty, re-sorted and drawn
    from; one row all equal (undecided), one whose penalised ids fall below the K-th value
    (so its top_k-th may not decide it), one with its best id banned. Checked against the
    numpy reference and against runtime/sampling.py's own draw on the rows the K decides,
    with the same uniform numbers."""
    from edgeomni.plugins import speech_draw_cuda as sdc
    from edgeomni.runtime.sampling import SamplingParams, StepLogits, draw_marks, sample_rows

    rows, vocab, k, width = 6, 300, 64, 600  # width past one block of threads
    rng = np.random.default_rng(int(penalty * 100) + settings[1])
    logits = (rng.standard_normal((rows, vocab)) * 2).astype(np.float16).astype(np.float32)
    logits[1] = 0.5
    values, ids = dc.topk_reference(logits, k)
    seen = [rng.choice(ids[b], 12, replace=False) for b in range(rows)]
    seen[3] = ids[3, :20]  # its best, penalised below the rest
    banned = [np.arange(vocab - 20, vocab) for _ in range(rows)]
    banned[4] = np.append(banned[4], ids[4, 0])  # its best may not be drawn now
    marks = draw_marks(vocab, seen, banned)
    temperature, top_k, top_p = settings
    greedy = temperature == 0.0
    t, kk, tp = (1.0, 1, 1.0) if greedy else settings
    uniform = np.zeros(rows) if greedy else rng.random(rows)
    table = rng.standard_normal((vocab, width)).astype(np.float32)
    # a float16 build's top-K values are float16 (its first inputs too)
    buffers = {"values": values.astype(np.float16) if half_first else values, "ids": ids, "marks": marks, "u": uniform, "t": np.array([t]),
               "k": np.array([kk], np.int64), "p": np.array([tp]), "table": table,
               "drawn": np.zeros(rows, np.int64), "base": np.zeros((rows, width), np.float32),
               "first": np.zeros((rows, width), np.float16 if half_first else np.float32)}
    grid, block = sdc.first_draw_launch(rows)
    args = [buf("values"), ("i32", int(half_first)), buf("ids"), ("i32", k), ("i32", vocab),
            buf("marks"),
            ("f32", penalty), buf("u"), buf("t"), buf("k"), buf("p"), buf("table"),
            ("i32", width), buf("drawn"), buf("base"), buf("first"), ("i32", int(half_first))]

    def check(got: dict[str, np.ndarray]) -> None:
        want, rows_of = sdc.first_draw_reference(values, ids, marks, penalty, uniform,
                                                 temperature=t, top_k=kk, top_p=tp, table=table)
        np.testing.assert_array_equal(got["drawn"], want)
        np.testing.assert_array_equal(got["base"], rows_of)
        np.testing.assert_array_equal(got["first"], rows_of.astype(got["first"].dtype))
        # the all-equal row is undecided; rows decided remain to compare with the host's draw
        assert want[1] == -1 and (want >= 0).sum() >= 2
        assert want[4] != ids[4, 0]

        class Uniform:  # a generator that gives row b's number, as the host would draw it
            def __init__(self, u: float) -> None:
                self.u = u

            def random(self) -> float:
                return self.u

        decided = np.flatnonzero(want >= 0)
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p,
                                repetition_penalty=penalty)  # fmt: skip
        step = StepLogits(len(decided), None, values[decided], ids[decided])
        host, full = sample_rows(step, [params] * len(decided),
                                 [Uniform(uniform[b]) for b in decided],  # type: ignore[misc]
                                 [seen[b] for b in decided], [banned[b] for b in decided])
        assert full == 0
        np.testing.assert_array_equal(host, want[decided])

    name = f"first_draw-{dtype}-T{temperature}-k{top_k}-p{top_p}-pen{penalty}"
    return KernelCase(name + "-half" * half_first, buffers,
                      [Launch("first_draw", grid, block, args)], check)


def conv_state_case(dtype: str, rows: int, seq: int, channels: int, kernel_size: int,
                    silu: bool) -> KernelCase:  # fmt: skip
    """``conv_state``: the depthwise causal conv over each row's past inputs and its tokens,
    the state in place in the cache's type (rows of no tokens, of some, of all S), its input
    the first columns of a wider buffer (the in_proj's mix), against CausalConvState's numpy
    reference."""
    from edgeomni.plugins import gated_delta as gd
    from edgeomni.plugins import gated_delta_cuda as gdc

    rng = np.random.default_rng(rows * 13 + seq + kernel_size)
    width = channels + 24  # the rest of a token's mix: z, beta's and the decay's inputs
    mix = rng.standard_normal((rows, seq, width)).astype(np.float32)
    x = np.ascontiguousarray(mix[..., :channels])
    w = (rng.standard_normal((channels, kernel_size)) * 0.5).astype(dtype)
    state = rng.standard_normal((rows, channels, kernel_size - 1)).astype(dtype)  # the cache's
    lens = np.array([[0, seq, max(1, seq // 2)][r % 3] for r in range(rows)], np.int32)
    grid, block = gdc.conv_launch(rows, channels, kernel_size)
    args = [buf("mix"), buf("w"), buf("state"), buf("lens"), ("i32", seq), ("i32", channels),
            ("i32", width), ("i32", kernel_size), ("i32", int(silu)), buf("y")]  # fmt: skip

    def check(got: dict[str, np.ndarray]) -> None:
        y, present = gd.conv_reference(x, w.astype(np.float32), state.astype(np.float32),
                                       lens, kernel_size=kernel_size,
                                       activation="silu" if silu else "none")  # fmt: skip
        np.testing.assert_allclose(got["y"], y, rtol=1e-5, atol=1e-5)
        # inputs moved, not computed: rounded to the state's type as they are stored
        np.testing.assert_array_equal(got["state"], present.astype(dtype))
        for r in np.flatnonzero(lens == 0):  # no tokens: the state it had, to the bit
            np.testing.assert_array_equal(got["state"][r], state[r])

    buffers = {"mix": mix, "w": w, "state": state.copy(), "lens": lens,
               "y": np.zeros_like(x)}  # fmt: skip
    name = f"conv_state-{dtype}-r{rows}-s{seq}-k{kernel_size}{'-silu' * silu}"
    return KernelCase(name, buffers, [Launch("conv_state", grid, block, args)], check)


def delta_rule_case(rows: int, seq: int, k_heads: int, v_heads: int, dk: int, dv: int,
                    l2: bool, threshold: float | None = 20.0) -> KernelCase:  # fmt: skip
    """``delta_rule``: each value head's state updated token by token (decay, the delta rule's
    correction, the output read with q), q and k L2-normalised or not, rows of no tokens, of
    some and of all S; q, k and v side by side in one buffer (the conv's output), the gates
    computed from the in_proj's columns (softplus past and short of its threshold), against
    the gates' and GatedDeltaRule's numpy references (float64)."""
    from edgeomni.plugins import gated_delta as gd
    from edgeomni.plugins import gated_delta_cuda as gdc

    rng = np.random.default_rng(rows * 17 + seq + dk)
    key, value = k_heads * dk, v_heads * dv
    qkv = rng.standard_normal((rows, seq, 2 * key + value)).astype(np.float32)
    if not l2:  # unnormalised keys keep the recurrence stable only when short
        qkv[..., : 2 * key] /= np.float32(np.sqrt(dk))
    beta_at, width = 5, 5 + 2 * v_heads + 3  # the gates' inputs among other columns
    mix = rng.standard_normal((rows, seq, width)).astype(np.float32)
    mix[..., beta_at + v_heads :] *= 12  # a + dt_bias on both sides of the threshold
    dt_bias = rng.uniform(-1, 1, v_heads).astype(np.float32)
    a_neg = -rng.uniform(0.01, 0.1, v_heads).astype(np.float32)
    state = (rng.standard_normal((rows, v_heads, dv, dk)) * 0.3).astype(np.float32)
    lens = np.array([[seq, 0, max(1, seq // 2)][r % 3] for r in range(rows)], np.int32)
    grid, block = gdc.rule_launch(rows, k_heads, v_heads, dk, dv)
    scale = gdc.rule_scale(0.0, dk)
    args = [buf("qkv"), ("i32", 2 * key + value), buf("mix"), ("i32", width), ("i32", beta_at),
            buf("dt_bias"), buf("a_neg"), ("f32", gdc.rule_threshold(threshold)),
            buf("state"), buf("lens"), ("i32", seq), ("i32", k_heads), ("i32", v_heads),
            ("i32", dk), ("i32", dv), ("i32", int(l2)), ("f32", scale), buf("o")]  # fmt: skip

    def check(got: dict[str, np.ndarray]) -> None:
        g, beta = gdc.gates_reference(mix.reshape(rows * seq, -1), beta_at, v_heads, dt_bias,
                                      a_neg, threshold)  # fmt: skip
        q, k, v = qkv[..., :key], qkv[..., key : 2 * key], qkv[..., 2 * key :]
        o, present = gd.rule_reference(q, k, v, g.reshape(rows, seq, -1),
                                       beta.reshape(rows, seq, -1), state, lens,
                                       num_k_heads=k_heads, num_v_heads=v_heads,
                                       qk_l2norm=int(l2))  # fmt: skip
        np.testing.assert_allclose(got["o"], o, rtol=1e-4, atol=1e-4 * np.abs(o).max())
        np.testing.assert_allclose(got["state"], present, rtol=1e-4,
                                   atol=1e-4 * np.abs(present).max())  # fmt: skip
        for r in np.flatnonzero(lens == 0):  # no tokens: the state it had, to the bit
            np.testing.assert_array_equal(got["state"][r], state[r])

    buffers = {"qkv": qkv, "mix": mix, "dt_bias": dt_bias, "a_neg": a_neg,
               "state": state.copy(), "lens": lens,
               "o": np.full((rows, seq, value), 7.0, np.float32)}  # fmt: skip
    name = (f"delta_rule-r{rows}-s{seq}-h{k_heads}x{v_heads}-d{dk}x{dv}{'-l2' * l2}"
            f"{'-plain-softplus' * (threshold is None)}")  # fmt: skip
    return KernelCase(name, buffers, [Launch("delta_rule", grid, block, args)], check)


def gated_norm_case(dtype: str, tokens: int, v_heads: int, dv: int) -> KernelCase:
    """``gated_norm``: each value head of the rule's output RMS-normed, times its weight and
    silu(z), z among the in_proj's columns, into the attention buffer's type."""
    from edgeomni.plugins import gated_delta_cuda as gdc

    rng = np.random.default_rng(tokens * 7 + dv)
    o = rng.standard_normal((tokens, v_heads * dv)).astype(np.float32)
    z_at, width = 3, 3 + v_heads * dv + 5
    mix = rng.standard_normal((tokens, width)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, dv).astype(np.float32)
    grid, block = gdc.norm_launch(tokens, v_heads, dv)
    args = [buf("o"), buf("mix"), ("i32", width), ("i32", z_at), buf("w"), ("f32", 1e-6),
            ("i32", tokens), ("i32", v_heads), ("i32", dv), buf("attn")]  # fmt: skip

    def check(got: dict[str, np.ndarray]) -> None:
        want = gdc.gated_norm_reference(o, mix[:, z_at : z_at + v_heads * dv], w, dv, 1e-6)
        tol = 2e-3 if dtype == "float16" else 1e-5  # float16: its rounding of the result
        np.testing.assert_allclose(got["attn"].astype(np.float64), want, rtol=tol, atol=tol)

    buffers = {"o": o, "mix": mix, "w": w, "attn": np.zeros((tokens, v_heads * dv), dtype)}
    return KernelCase(f"gated_norm-{dtype}-t{tokens}-h{v_heads}x{dv}", buffers,
                      [Launch("gated_norm", grid, block, args)], check)  # fmt: skip


def attn_gate_case(dtype: str, tokens: int, heads: int, d: int) -> KernelCase:
    """``attn_gate``: the attention's output times sigmoid of each head's gate, read beside
    its q in the gated qkv product, in the attention buffer's type."""
    from edgeomni.plugins import decoder_cuda as dc
    from edgeomni.plugins import gated_delta_cuda as gdc

    rng = np.random.default_rng(tokens * 3 + d)
    width = 2 * heads * d + 2 * d * 2  # gated q, then k and v of 2 kv heads
    qkv = (rng.standard_normal((tokens, width)) * 2).astype(np.float32)
    attn = rng.standard_normal((tokens, heads * d)).astype(dtype)
    grid, block = gdc.gate_launch(tokens, heads, d)
    args = [buf("attn"), buf("qkv"), ("i32", width), ("i32", tokens), ("i32", heads), ("i32", d)]

    def check(got: dict[str, np.ndarray]) -> None:
        want = dc.attn_gate_reference(attn.astype(np.float64), qkv, heads, d)
        tol = 2e-3 if dtype == "float16" else 1e-6
        np.testing.assert_allclose(got["attn"].astype(np.float64), want, rtol=tol, atol=tol)

    return KernelCase(f"attn_gate-{dtype}-t{tokens}-h{heads}x{d}",
                      {"attn": attn.copy(), "qkv": qkv},
                      [Launch("attn_gate", grid, block, args)], check)  # fmt: skip


def all_cases(dtype: str, *, rows: tuple[int, ...] = (1, 2, 3, 8, 17, 40),
              topk: tuple[tuple[int, int, int], ...] = ((1, 384, 64), (3, 151936, 64),
                                                        (2, 3072, 8))) -> list[KernelCase]:  # fmt: skip
    """Every case for one dtype's kernels."""
    cases = [linear_case(dtype, r, mode) for mode in LINEAR_MODES for r in rows]
    # a long K: several warps a block, each one pass (the engine's split) or several (2 warps);
    # N not a multiple of a block's columns
    cases += [linear_case(dtype, r, mode, n=n, k=1096, warps=warps)
              for r, n in ((1, 75), (3, 75), (17, 11))
              for mode in ("norm", "swiglu", "half_input", "residual")
              for warps in (None, 2)]  # fmt: skip
    cases += [rope_case(dtype, *shape, norm) for shape in ROPE_SHAPES for norm in (True, False)]
    cases += [rope_case(dtype, 4, 2, 16, False, True, warps=3),
              rope_case(dtype, 4, 2, 32, True, True, warps=2),
              # Qwen3.5: q beside its gate, rope on a head's first quarter, MRoPE
              rope_case(dtype, 4, 2, 32, True, True, gated=True, rotary=8),
              rope_case(dtype, 4, 2, 16, False, False, gated=True)]  # fmt: skip
    cases += [topk_case(dtype, *t) for t in topk]
    cases += [topk_case(dtype, 2, dc.TOPK_CHUNK + 5, 8), topk_case(dtype, 1, 5000, 64, flat=True),
              topk_case(dtype, 2, 3000, 128)]  # K over 64: the block-wide sort
    # float16 builds select among float16 logits, float32 builds among float32 ones
    cases += [topk_case(dtype, 2, 3000, 64, spread=True, half=half) for half in (True, False)]
    cases += [topk_case(dtype, 2, dc.TOPK_CHUNK + 300, 16, spread=True, half=half)
              for half in (True, False)]
    # the draw after a one-chunk top-K, and after a merge
    cases += [topk_case(dtype, 6, 300, 64, draw=settings) for settings in SAMPLE_SETTINGS]
    cases += [topk_case(dtype, 6, dc.TOPK_CHUNK + 300, 64, draw=SAMPLE_SETTINGS[1])]
    cases += [cast_case(dtype), rms_rows_case()]
    # MoE: a decode token, a few, more slots than a warp's lanes cover, E past one warp pass
    cases += [moe_case(dtype, *shape) for shape in ((1, 8, 2, 64, 48, 1), (5, 70, 8, 136, 40, 0),
                                                    (3, 128, 8, 72, 96, 1),
                                                    (4, 6, 2, 64, 40, 0, True))]
    # grouped by expert: empty experts, a part pass of slots, rows past a block's
    cases += [moe_case(dtype, *shape, grouped=True) for shape in (
        (5, 6, 2, 64, 40, 1), (12, 70, 8, 136, 40, 0), (9, 8, 4, 72, 96, 1, True))]
    cases += [frame_sum_case(dtype, r, half, text) for r, half, text in
              ((1, False, True), (3, True, True), (4, False, False))]  # fmt: skip
    # a speech frame's first code: greedy and sampled, penalty on and off
    # (top-k near K leaves few rows decided where bans and penalty reach into the K)
    cases += [first_draw_case(dtype, settings, pen, half) for settings, pen, half in (
        (SAMPLE_SETTINGS[0], 1.05, True), (SAMPLE_SETTINGS[1], 1.05, False),
        (SAMPLE_SETTINGS[2], 1.3, True), ((0.6, 30, 0.3), 1.0, False),
        (SAMPLE_SETTINGS[4], 1.05, True))]  # fmt: skip
    # Gated DeltaNet: a decode step of 3 rows, a prefill past a block's channels; the rule's
    # heads shared (2 value heads a key head), dk past one lane pass and not a multiple of 32
    cases += [conv_state_case(dtype, 3, 1, 200, 4, True), conv_state_case(dtype, 3, 9, 130, 4, True),
              conv_state_case(dtype, 2, 5, 40, 2, False)]  # fmt: skip
    cases += [delta_rule_case(3, 1, 2, 4, 64, 40, True), delta_rule_case(3, 7, 1, 2, 100, 9, True),
              delta_rule_case(2, 6, 2, 2, 32, 8, False, None)]  # fmt: skip
    # Qwen3.5's per-head norm times silu(z) (dv past a lane pass) and its attention's gate
    cases += [gated_norm_case(dtype, 3, 4, 40), gated_norm_case(dtype, 5, 2, 128),
              attn_gate_case(dtype, 3, 4, 16)]  # fmt: skip
    if dtype == "float16":  # int4 matrices (float16 modules only, last: the lists share indices
        # up to here): SIMT under 8 rows, tensor cores from 8 (each variant), groups of 32, 128
        cases += [linear_case(dtype, r, mode, k=320, group=32)
                  for mode in LINEAR_MODES for r in (1, 3, 8, 12, 17)]
        cases += [linear_case(dtype, r, mode, n=75, k=1152, warps=warps, group=128)
                  for r in (1, 17) for mode in ("swiglu", "residual", "heads")
                  for warps in (None, 2)]  # fmt: skip
        # the prefill GEMM: a part block of rows and of columns, every epilogue, K past the
        # pipeline's stages; int4 in groups of 32 and 128
        cases += [linear_case(dtype, 70, mode, k=160) for mode in LINEAR_MODES]
        cases += [linear_case(dtype, 130, "norm", n=75, k=1024)]
        # (int4 shares the epilogues tested above: the weights' own paths)
        cases += [linear_case(dtype, 70, mode, k=320, group=32)
                  for mode in ("plain", "norm", "swiglu", "half_input", "heads")]  # fmt: skip
        cases += [linear_case(dtype, 65, mode, n=75, k=1152, group=128)
                  for mode in ("swiglu", "half_input", "heads")]  # fmt: skip
        # grouped MoE prefills on the GEMM: an empty expert, experts of more than a tile's
        # slots, the shared expert; N not a multiple of a tile
        cases += [moe_case(dtype, *shape, grouped=True, gemm=True) for shape in (
            (12, 6, 2, 64, 96, 1), (100, 3, 2, 64, 64, 1, True), (40, 5, 4, 96, 64, 0))]
        # int4 experts: per slot and grouped (the same bits), and on the GEMM; groups of 32, 64
        cases += [moe_case(dtype, 5, 6, 2, 64, 96, 1, True, grouped=True, group=32),
                  moe_case(dtype, 12, 6, 2, 64, 96, 1, grouped=True, gemm=True, group=32),
                  moe_case(dtype, 40, 5, 4, 128, 64, 0, grouped=True, gemm=True, group=64)]
    return cases
