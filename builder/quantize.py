"""Weight-only int4: the builder's pass from an exported float graph to one with QuantMatMul.

It runs between a family's export and the backend's lowering, on the ONNX graph, so a family
declares nothing for it and every backend gets its own lowering of the same quantized graph
(plugins/quant_linear.py). What it quantizes:

- every MatMul whose weight is a 2-D float initializer [K, N] with K a multiple of the group
  size (and every Gemm that is one: torch exports a Linear over 2-D inputs so), in a decoder
  (an engine with a KV cache: the LLM or thinker, talkers, code predictors);
- the lm_head (the MatMul that makes ``logits``; a code predictor frame engine's heads) unless
  asked not to: on the trained tiny Qwen3 it adds 0.8% to int4's held-out perplexity, and it
  is a quarter of Qwen3-0.6B's weights (docs/quantization.md);
- the routed experts of each mixture-of-experts block (an edgeomni::MoE node becomes an
  edgeomni::QuantMoE, plugins/quant_moe.py: ONNX Runtime's QMoE), grouped along each expert
  matrix's input axis (H for fc1, the MoE intermediate size for fc2); a block where either is
  not a multiple of the group size stays float, with the reason in the report and a warning;
- with ``--quantize-encoders``, the same MatMuls of the components without a KV cache (audio
  and vision encoders, voice-clone encoders, code2wav's transformer), rounded plainly;
- nothing else: norms, embeddings (host tables), convolutions and other components stay float.

Methods: ``int4_rtn`` rounds each group of K to the nearest of 15 levels around 0 (symmetric,
scale = the group's largest magnitude / 7). ``int4_awq`` first scales each input channel by a
calibrated factor (builder/awq.py), then rounds the same way; it rounds MoE experts plainly (as
int4_rtn: they are not calibrated yet), and the report's ``moe_method`` says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.builder.errors import BuildError

log = logging.getLogger("edge-build")
METHODS = ("int4_rtn", "int4_awq")
GROUP_SIZES = (32, 64, 128)
# what every decoder takes (the cache lengths its state is read and advanced by): a decoder's
# linears are quantized, an encoder's only on request
DECODER_INPUT = "past_lens"
LOGITS = "logits"
# export/common/predictor_frame.py's output and heads (the builder does not import torch code)
FRAME_OUTPUT, FRAME_HEADS = "frame_codes", "frame_heads"
# A quantized graph is saved with its weights inline below this size (protobuf stops at 2 GB).
INLINE_BYTES = 1 << 30


@dataclass(frozen=True)
class Quantization:
    """What --quantization asked for."""

    method: str
    group_size: int
    lm_head: bool = True
    calibration: Path | None = None  # int4_awq: a request file (None: the shipped text)
    encoders: bool = False  # components without a KV cache too (rounded plainly)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise BuildError(f"--quantization {self.method!r}: choose {', '.join(METHODS)}")
        if self.group_size not in GROUP_SIZES:
            raise BuildError(
                f"--group-size {self.group_size}: choose {', '.join(map(str, GROUP_SIZES))}"
            )


def is_decoder(model: Any) -> bool:
    """A decoder: a component whose calls continue from a row state (``past_lens``), whatever
    its state is (a KV cache, a linear-attention layer's), or a code predictor's whole-frame
    engine (its steps' cache lives inside the call)."""
    return any(i.name == DECODER_INPUT for i in model.graph.input) or any(
        o.name == FRAME_OUTPUT for o in model.graph.output
    )


def lm_head_weights(model: Any) -> set[str]:
    """The heads' weights: that of the MatMul making ``logits`` (walking back from the output
    through single-input-path ops, a Reshape, a Cast, to the first MatMul), or a frame
    engine's, one a step (export/common/predictor_frame.py names them)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    head = _weight_behind(producer, LOGITS)
    frame = {t.name for t in model.graph.initializer if t.name.startswith(FRAME_HEADS + ".")}
    return frame | ({head} if head else set())


def router_weights(model: Any) -> set[str]:
    """The weights of the MatMuls (or Gemms) making each MoE block's router logits. They stay
    float: E x H parameters, negligible memory, and rounding them moves tokens between experts
    (on the tiny Qwen3-Omni it changed the thinker's logits by a third of their range)."""
    from edgeomni.plugins import moe

    producer = {o: n for n in model.graph.node for o in n.output}
    found = (_weight_behind(producer, n.input[1], "Gemm") for n in model.graph.node
             if n.op_type == moe.OP_TYPE and n.domain == moe.DOMAIN)  # fmt: skip
    return {w for w in found if w}


def _weight_behind(producer: dict[str, Any], name: str, *linear: str) -> str | None:
    """Walk back from ``name`` through single-input-path ops to the first MatMul (or one of
    ``linear``'s op types) and return its weight input."""
    for _ in range(16):
        node = producer.get(name)
        if node is None:
            return None
        if node.op_type in ("MatMul", *linear):
            return node.input[1]
        name = node.input[0]
    return None


def quantize_file(
    raw: Path,
    out: Path,
    q: Quantization,
    artifacts: Path | None = None,
    rows: dict[str, np.ndarray] | None = None,
) -> dict[str, Any] | None:
    """Quantize the exported graph at ``raw`` into ``out``; returns what was done, for the
    engine's config.json, or None for a component the pass leaves float (``out`` unwritten).
    ``artifacts``: the folder of a text model as write_artifacts left it (int4_awq embeds its
    calibration text with the tokenizer and table there); None for any other component.
    ``rows``: int4_awq's calibration rows by MatMul input, recorded elsewhere (builder/
    awq_graph.py runs the built graph for a talker's or code predictor's)."""
    import onnx

    model = onnx.load(str(raw), load_external_data=False)
    decoder = is_decoder(model)
    if not decoder and not q.encoders:
        return None
    scales, awq_report = None, None
    if q.method == "int4_awq" and not decoder:  # nothing calibrates an encoder's inputs yet
        awq_report = {"calibrated": False, "why": "encoders are rounded plainly"}
    elif q.method == "int4_awq":
        scales, awq_report = _calibrate(model, raw, artifacts, q, rows)
    report = quantize_model(model, q, base_dir=raw.parent, scales=scales)
    if awq_report is not None:
        report["awq"] = awq_report
        if scales is None:
            report["method"] = "int4_rtn"
    save(model, raw, out)
    return report


def save(model: Any, raw: Path, out: Path) -> None:
    """The rewritten graph at ``out``: one file when small enough, else with one data file."""
    import onnx

    inline = sum(t.ByteSize() for t in model.graph.initializer) < INLINE_BYTES
    if inline:
        _load_remaining(model, raw.parent)
    onnx.save_model(
        model,
        str(out),
        save_as_external_data=not inline,
        all_tensors_to_one_file=True,
        location=out.name + ".data",
        size_threshold=1024,
    )


def _load_remaining(model: Any, base_dir: Path) -> None:
    """Bring the float tensors still external (norms, biases) inline, so the saved graph is one
    file that no longer points at the raw export's data."""
    from onnx.external_data_helper import load_external_data_for_model

    load_external_data_for_model(model, str(base_dir))


def _calibrate(
    model: Any,
    raw: Path,
    artifacts: Path | None,
    q: Quantization,
    recorded: dict[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray] | None, dict[str, Any]]:
    """int4_awq's per-input scales (input name -> s [K]), or None with a warning when this
    component cannot be calibrated; and what to record of it."""
    from onnx import numpy_helper

    from edgeomni.builder import awq

    groups = _groups(model, q)
    texts = awq.calibration_texts(q.calibration)
    if recorded is not None:
        rows: dict[str, np.ndarray] | str = recorded
        missing = [x for x in groups if x not in recorded]
        if missing:
            rows = f"no calibration rows of {', '.join(missing[:3])}"
    elif artifacts is None:
        rows = "no artifacts"
    else:
        rows = awq.calibration_rows(raw, artifacts, list(groups), texts)
    if isinstance(rows, str):
        log.warning("%s: int4_awq cannot calibrate it (%s); its weights are rounded plainly "
                    "(int4_rtn)", raw.stem, rows)  # fmt: skip
        return None, {"calibrated": False, "why": rows}
    inits = {t.name: t for t in model.graph.initializer}
    scales, ratios = {}, []
    for x, members in groups.items():
        weights = []
        for w, transposed in members:
            value = numpy_helper.to_array(inits[w], str(raw.parent))
            weights.append(np.ascontiguousarray(value.T) if transposed else value)
        s, alpha, ratio = awq.search_scale(rows[x], weights, q.group_size)
        ratios.append(ratio)
        if alpha > 0:
            scales[x] = s
    return scales, {
        "calibrated": True,
        "calibration": str(q.calibration) if q.calibration else "shipped",
        "inputs_from": "the built graph's run" if recorded is not None else "text",
        "inputs": len(groups),
        "scaled_inputs": len(scales),
        "error_vs_rtn": round(float(np.mean(ratios)), 4) if ratios else None,
    }


def _groups(model: Any, q: Quantization) -> dict[str, list[tuple[str, bool]]]:
    """The weights the pass will quantize, by the input they read: only inputs whose every
    reader is such a weight, read by no other input (so one scale per input can be folded)."""
    from onnx import TensorProto

    inits = {t.name: t for t in model.graph.initializer}
    heads = lm_head_weights(model)
    routers = router_weights(model)
    floats = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}
    readers: dict[str, int] = {}
    weight_readers: dict[str, int] = {}
    groups: dict[str, list[tuple[str, bool]]] = {}
    for node in model.graph.node:
        for i in set(node.input):
            readers[i] = readers.get(i, 0) + 1
        linear = _linear(node, inits)
        if linear is None:
            continue
        x, w, transposed, _ = linear
        weight_readers[w] = weight_readers.get(w, 0) + 1
        if _why_not(inits[w], transposed, q, w in heads, floats, w in routers) is None:
            groups.setdefault(x, []).append((w, transposed))
    return {
        x: ws for x, ws in groups.items()
        if readers[x] == len(ws) and all(weight_readers[w] == 1 for w, _ in ws)
    }  # fmt: skip


def _apply_input_scales(model: Any, scales: dict[str, np.ndarray], consumers: set[str]) -> int:
    """x -> x / s for each scaled input: folded into the RMSNormalization that makes x (a copy
    of its weight, divided by s) when x is no graph output; else one Mul before its readers.
    Returns how many were folded. ``consumers``: the names of the QuantMatMul nodes reading
    a scaled input."""
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    outputs = {o.name for o in graph.output}
    folded = 0
    for x, s in scales.items():
        norm = producer.get(x)
        if (
            norm is not None
            and norm.op_type == "RMSNormalization"
            and len(norm.input) > 1
            and norm.input[1] in inits
            and x not in outputs
        ):
            # a weight of its own (the exporter shares equal initializers between norms)
            value = numpy_helper.to_array(inits[norm.input[1]])
            own = numpy_helper.from_array((value / s).astype(value.dtype), x + "_awq_norm_weight")
            graph.initializer.append(own)
            norm.input[1] = own.name
            folded += 1
            continue
        w_dtype = next(
            numpy_helper.to_array(inits[n.input[2]]).dtype
            for n in graph.node if n.name in consumers and n.input[0] == x
        )  # fmt: skip
        inv = numpy_helper.from_array((1.0 / s).astype(w_dtype), x + "_awq_inv_scale")
        graph.initializer.append(inv)
        scaled = x + "_awq"
        nodes = []
        placed = False
        for n in graph.node:
            if not placed and x in n.input:
                nodes.append(helper.make_node("Mul", [x, inv.name], [scaled], name=scaled))
                placed = True
            if n.name in consumers and n.input[0] == x:
                n.input[0] = scaled
            nodes.append(n)
        del graph.node[:]
        graph.node.extend(nodes)
    return folded


def weight_name(node: Any, initializer: str) -> str:
    """The weight a MatMul reads, as the checkpoint's module path names it where the exporter
    gave its initializer a name of its own (``val_6``: a transposed copy), from the node's
    ``pkg.torch.onnx.name_scopes`` (the innermost module); else the initializer's name."""
    import ast

    if "." in initializer:  # a parameter's own name (model.layers.0.mlp.down_proj.weight)
        return initializer
    scopes = next((p.value for p in node.metadata_props
                   if p.key == "pkg.torch.onnx.name_scopes"), None)  # fmt: skip
    try:
        names = ast.literal_eval(scopes) if scopes else []
    except (ValueError, SyntaxError):
        return initializer
    modules = [n for n in names[:-1] if isinstance(n, str) and n]  # the last is the op itself
    return f"{modules[-1]}.weight" if modules else initializer


def quantize_model(
    model: Any,
    q: Quantization,
    base_dir: Path | str = "",
    scales: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Replace the model's eligible MatMuls with QuantMatMul (in place); returns the summary.
    ``scales``: int4_awq's per-channel factors by input name (the weights reading one are
    scaled before rounding and the input divided by it)."""
    from onnx import TensorProto, helper, numpy_helper

    from edgeomni.plugins import moe, quant_linear

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    heads = lm_head_weights(model)
    routers = router_weights(model)
    floats = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}
    # (weight, stored [N, K]) -> packed and scales names, K, N
    done: dict[tuple[str, bool], tuple[str, str, int, int]] = {}
    skipped: dict[str, str] = {}
    float_bytes = quant_bytes = 0
    scales = scales or {}
    scaled_readers: set[str] = set()
    nodes = []
    experts: set[str] = set()  # the float fc1/fc2 of the MoE blocks made QuantMoE
    moe_blocks, float_moe = 0, []
    for index, node in enumerate(graph.node):
        if node.op_type == moe.OP_TYPE and node.domain == moe.DOMAIN:
            quantized = _quantize_moe(node, index, inits, q, base_dir, skipped)
            if quantized is None:
                float_moe.append(f"{node.name or index}: {skipped[node.input[2]]}")
                nodes.append(node)
                continue
            new, tensors, sizes = quantized
            nodes.append(new)
            graph.initializer.extend(tensors)
            experts.update(node.input[2:4])
            moe_blocks += 1
            float_bytes, quant_bytes = float_bytes + sizes[0], quant_bytes + sizes[1]
            continue
        linear = _linear(node, inits)
        if linear is None:
            nodes.append(node)
            continue
        x, w, transposed, bias = linear
        t = inits[w]
        why = _why_not(t, transposed, q, w in heads, floats, w in routers)
        if why:
            skipped[weight_name(node, w)] = why
            nodes.append(node)
            continue
        if (w, transposed) not in done:
            value = numpy_helper.to_array(t, str(base_dir))
            value = np.ascontiguousarray(value.T) if transposed else value  # [K, N]
            float_bytes += value.nbytes
            if x in scales:
                value = (value.astype(np.float32) * scales[x][:, None]).astype(value.dtype)
            packed, block_scales = quant_linear.quantize_symmetric(value, q.group_size, value.dtype)
            stem = w + ("_t" if transposed else "") + "_q4"
            names = (stem, stem + "_scales")
            graph.initializer.extend(
                [
                    numpy_helper.from_array(packed, names[0]),
                    numpy_helper.from_array(block_scales, names[1]),
                ]
            )
            done[w, transposed] = (*names, *value.shape)
            quant_bytes += packed.nbytes + block_scales.nbytes
        packed_name, scales_name, k, n = done[w, transposed]
        y = node.output[0] if bias is None else node.output[0] + "_nobias"
        nodes.append(
            quant_linear.make_node(
                x,
                packed_name,
                scales_name,
                None,
                y,
                k=k,
                n=n,
                block_size=q.group_size,
                name=node.name or f"quant_matmul_{index}",
            )
        )
        if x in scales:
            scaled_readers.add(nodes[-1].name)
        if bias is not None:
            nodes.append(helper.make_node("Add", [y, bias], [node.output[0]]))
    del graph.node[:]
    graph.node.extend(nodes)
    _drop(graph, {w for w, _ in done} | experts)
    folded = _apply_input_scales(model, scales, scaled_readers) if scales else 0
    if not any(o.domain == quant_linear.DOMAIN for o in model.opset_import):
        model.opset_import.add(domain=quant_linear.DOMAIN, version=quant_linear.VERSION)
    if skipped:
        log.info("left float: %s", "; ".join(f"{k} ({v})" for k, v in skipped.items()))
    if float_moe:
        log.warning("%d mixture-of-experts blocks keep float experts (%s)", len(float_moe),
                    "; ".join(float_moe))  # fmt: skip
    if moe_blocks and q.method == "int4_awq":
        log.info("int4_awq: %d mixture-of-experts blocks are rounded plainly (int4_rtn): "
                 "experts are not calibrated yet", moe_blocks)  # fmt: skip
    return {
        "method": q.method,
        "bits": 4,
        "group_size": q.group_size,
        "symmetric": True,
        "lm_head": q.lm_head and any(w in heads for w, _ in done),
        "weights": len(done),
        "float_weights": sorted(skipped),
        "moe_blocks": moe_blocks,
        "float_moe_blocks": len(float_moe),
        **({"moe_method": "int4_rtn"} if moe_blocks else {}),
        "weight_bytes": {"float": float_bytes, "int4": quant_bytes},
        **(
            {"awq_scaled_inputs": {"folded_into_norms": folded, "mul": len(scales) - folded}}
            if scales
            else {}
        ),  # fmt: skip
    }


def _quantize_moe(
    node: Any,
    index: int,
    inits: dict[str, Any],
    q: Quantization,
    base_dir: Path | str,
    skipped: dict[str, str],
) -> tuple[Any, list[Any], tuple[int, int]] | None:
    """An edgeomni::MoE node as QuantMoE: (the node, its packed experts and scales, (float
    bytes, int4 bytes)); or None, with why in ``skipped``, when its experts stay float."""
    from onnx import TensorProto, numpy_helper

    from edgeomni.plugins import quant_moe

    fc1, fc2 = node.input[2:4]
    why = None
    if fc1 not in inits or fc2 not in inits:
        why = "MoE experts that are not initializers"
    elif any(inits[w].data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16)
             or len(inits[w].dims) != 3 for w in (fc1, fc2)):  # fmt: skip
        why = "MoE experts that are not 3-D float weights"
    else:
        h, i = inits[fc1].dims[2], inits[fc2].dims[2]
        bad = [f"{n}={v}" for n, v in (("H", h), ("I", i)) if v % q.group_size]
        if bad:
            why = f"MoE {', '.join(bad)} not a multiple of the group size {q.group_size}"
    if why:
        skipped[fc1] = skipped[fc2] = why
        return None
    tensors, names, sizes = [], [], [0, 0]
    for w in (fc1, fc2):
        value = numpy_helper.to_array(inits[w], str(base_dir))
        packed, scales = quant_moe.quantize_experts(value, q.group_size, value.dtype)
        names += [w + "_q4", w + "_q4_scales"]
        tensors += [numpy_helper.from_array(packed, names[-2]),
                    numpy_helper.from_array(scales, names[-1])]  # fmt: skip
        sizes[0] += value.nbytes
        sizes[1] += packed.nbytes + scales.nbytes
    attrs = {a.name: a.i for a in node.attribute}
    new = quant_moe.make_node(
        [*node.input[:2], *names], node.output[0], top_k=attrs["top_k"],
        normalize_routing=attrs["normalize_routing"], block_size=q.group_size,
        name=node.name or f"quant_moe_{index}",
    )  # fmt: skip
    return new, tensors, (sizes[0], sizes[1])


def _linear(node: Any, inits: dict[str, Any]) -> tuple[str, str, bool, str | None] | None:
    """(x, weight, weight stored [N, K], bias or None) of a MatMul by a weight, or of a Gemm
    that is one (torch exports a Linear on 2-D inputs as Gemm with transB=1); else None."""
    from onnx import helper

    if node.domain not in ("", "ai.onnx") or len(node.input) < 2 or node.input[1] not in inits:
        return None
    if node.op_type == "MatMul":
        return node.input[0], node.input[1], False, None
    if node.op_type != "Gemm":
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
        return None
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    return node.input[0], node.input[1], bool(attrs.get("transB", 0)), bias


def _why_not(
    t: Any, transposed: bool, q: Quantization, is_head: bool, floats: dict[int, Any],
    is_router: bool = False,
) -> str | None:  # fmt: skip
    """Why a MatMul weight stays float, or None when it is quantized."""
    if is_head and not q.lm_head:
        return "lm_head"
    if is_router:
        return "MoE router"
    if t.data_type not in floats or len(t.dims) != 2:
        return "not a 2-D float weight"
    k = t.dims[1] if transposed else t.dims[0]
    if k % q.group_size:
        return f"K={k} is not a multiple of the group size {q.group_size}"
    return None


def _drop(graph: Any, names: set[str]) -> None:
    """Remove the float weights that were quantized, unless something else still reads one."""
    read = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    keep = [t for t in graph.initializer if t.name not in names or t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(keep)
