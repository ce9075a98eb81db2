"""edge-build --backend fused: dense decoders laid out for edgeomni's CUDA kernels, the other
components built with ONNX Runtime for the CUDA provider.

A decoder (export/common/decoder.py's CausalLM) whose every layer has a dense MLP becomes
``<component>.fused.safetensors``: the tensors
runtime/fused_engine.py reads, taken from the same module the ONNX export traced (so the
family's weight mapping is the one the ONNX build uses), and a ``fused`` table of dimensions in
its config.json. A decoder that draws its tokens in the engine (the code predictor on cuda,
export/common/sampler.py) also gets its sampler's embedding tables. Everything else (encoders, the vocoder, mixture-of-experts decoders) is built
as ``--backend onnxruntime --device cuda`` builds it; the log says which backend each component
got, and each config.json's ``backend`` records it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.builder.discover import FUSED_SUFFIX as SUFFIX
from edgeomni.builder.errors import BuildError
from edgeomni.export.common.onnx_export import ExportedDecoder
from edgeomni.export.family import BuildArgs

log = logging.getLogger("edge-build")
DTYPES = {"float16": np.float16, "float32": np.float32}
INT4_GROUPS = (32, 64, 128)  # the group sizes the int4 kernels take


def check_args(args: BuildArgs) -> None:
    """What a fused build needs, before anything is exported."""
    if args.dtype not in DTYPES:
        raise BuildError(f"--backend fused takes --dtype float16 or float32, not {args.dtype}")
    if args.quantization and args.quantization != "int4_rtn":
        raise BuildError(f"--backend fused quantizes with int4_rtn only ({args.quantization}'s "
                         "scales are not in its kernels): use int4_rtn or --backend onnxruntime")  # fmt: skip
    if args.quantization and args.dtype != "float16":
        raise BuildError("--backend fused runs int4 weights in float16 builds: add --dtype float16")
    if args.quantization and args.group_size not in INT4_GROUPS:
        raise BuildError(f"--backend fused takes an int4 --group-size of "
                         f"{', '.join(map(str, INT4_GROUPS))}, not {args.group_size}")  # fmt: skip


def backend(args: BuildArgs) -> Callable[..., dict[str, Any]]:
    """The build of each component (plugins/backends.py)."""
    return build_engine


def uncovered(decoder: ExportedDecoder | None) -> str | None:
    """Why the fused kernels cannot run this component, or None."""
    from edgeomni.export.common.decoder import MLP

    if decoder is None:
        return "not a decoder"
    kinds = sorted({t.kind for t in decoder.module.state_tensors()} - {"kv"})
    if kinds:  # Qwen3.5's Gated DeltaNet layers, say
        return f"its {' and '.join(kinds)} state has no fused kernels"
    if decoder.sampler_tables is not None and decoder.float32_embeds:
        return "its in-engine sampler feeds float32 inputs"
    if not all(isinstance(layer.mlp, MLP) for layer in decoder.module.model.layers):
        return "a mixture-of-experts decoder"
    return None


def build_engine(
    raw: Path, out_path: Path, args: BuildArgs, ranges: Any, seeds: Sequence[Path]
) -> dict[str, Any]:
    """The fused engine of a decoder exported to ``raw`` (kept by the export: kept_decoders),
    or the ONNX Runtime CUDA build of anything else; returns the config.json fields."""
    from edgeomni.export.common.onnx_export import kept_decoders

    decoder = kept_decoders().get(raw)
    why = uncovered(decoder)
    if why is not None:
        from edgeomni.builder.onnxruntime import build_engine as ort_build

        log.info("%s: onnxruntime (cuda), since the fused kernels do not cover it (%s)",
                 out_path.stem, why)  # fmt: skip
        return {"backend": "onnxruntime", "lowering": ort_build(raw, out_path, args)}
    assert decoder is not None
    tensors, spec = layout(decoder, args.dtype)
    if args.quantization:
        quantize(tensors, spec, args.group_size, args.quantize_lm_head, out_path.stem)
    path = out_path.with_name(out_path.stem + SUFFIX)
    from safetensors.numpy import save_file

    save_file(tensors, str(path))
    log.info("%s: fused, %d layers, %.1f MB of weights", out_path.stem, spec["num_layers"],
             sum(t.nbytes for t in tensors.values()) / 1e6)  # fmt: skip
    return {"backend": "fused", "engine": path.name, "fused": spec}


def layout(decoder: ExportedDecoder, dtype: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The fused engine's tensors (matrices [out, in] in ``dtype``, norms and rotary tables in
    float32) and its ``fused`` config table."""
    import torch

    module, cfg = decoder.module, decoder.module.cfg
    wt = DTYPES[dtype]

    def mat(t: torch.Tensor) -> np.ndarray:
        return np.ascontiguousarray(t.detach().float().cpu().numpy().astype(wt))

    def vec(t: torch.Tensor) -> np.ndarray:
        return np.ascontiguousarray(t.detach().float().cpu().numpy().astype(np.float32))

    out: dict[str, np.ndarray] = {}
    for n, layer in enumerate(module.model.layers):
        p, attn = f"layers.{n}.", layer.self_attn
        out[p + "qkv"] = mat(attn.qkv_proj.weight)
        out[p + "o"] = mat(attn.o_proj.weight)
        out[p + "gate_up"] = mat(layer.mlp.gate_up_proj.weight)
        out[p + "down"] = mat(layer.mlp.down_proj.weight)
        out[p + "input_norm"] = vec(layer.input_layernorm.weight)
        out[p + "post_norm"] = vec(layer.post_attention_layernorm.weight)
        if cfg.qk_norm:
            out[p + "q_norm"] = vec(attn.q_norm.weight)
            out[p + "k_norm"] = vec(attn.k_norm.weight)
        if cfg.attention_bias:
            out[p + "qkv_bias"] = vec(attn.qkv_proj.bias)
            out[p + "o_bias"] = vec(attn.o_proj.bias)
    out["norm"] = vec(module.model.norm.weight)
    rotary = module.model.rotary
    out["inv_freq"] = vec(rotary.inv_freq)
    if cfg.mrope_section is not None:  # each frequency's axis, from the export's one-hot
        out["freq_axis"] = rotary.axis_onehot[:, 0, 0, :].argmax(0).numpy().astype(np.int32)
    out["lm_head"] = mat(module.lm_head_t.transpose(-1, -2))  # [(N,) V, H]
    if cfg.input_size is not None:
        out["input_proj"] = mat(module.input_proj.weight)
        out["input_proj_bias"] = vec(module.input_proj.bias)
    if decoder.sampler_tables is not None:  # [heads, V, H]: what each head's drawn id feeds
        out["sampler_tables"] = mat(decoder.sampler_tables)
    if decoder.topk_exclude:
        bias = np.zeros(cfg.vocab_size, np.float32)
        bias[list(decoder.topk_exclude)] = -np.inf
        out["topk_bias"] = bias
    spec = {
        "dtype": dtype, "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
        "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps, "qk_norm": cfg.qk_norm,
        "attention_bias": cfg.attention_bias, "mrope": cfg.mrope_section is not None,
        "hidden_output_layer": cfg.hidden_output_layer,
        "last_hidden_output": cfg.last_hidden_output, "deepstack_layers": cfg.deepstack_layers,
        "lm_heads": cfg.lm_heads, "input_size": cfg.input_size or 0,
        "logits_topk": decoder.logits_topk, "sampler": decoder.sampler_tables is not None,
        # the ONNX build's float input type (inputs_embeds, deepstack_embeds); its float
        # outputs are in ``dtype``
        "embeds_dtype": "float32" if decoder.float32_embeds else dtype,
    }  # fmt: skip
    return out, spec


def quantize(
    tensors: dict[str, np.ndarray], spec: dict[str, Any], group: int, lm_head: bool, name: str
) -> None:
    """int4_rtn in place: each layer's qkv, o, gate_up and down (and a single LM head with
    ``lm_head``) become codes [rows, K / 2] and float16 scales [rows, K / group] under
    ``<name>.scales`` (plugins/quant_linear.py's symmetric rounding, the ONNX build's, of the
    float16 weights), and ``spec`` says so (runtime/fused_engine.py's FusedSpec)."""
    from edgeomni.plugins.decoder_linear_cuda import INT4_MATRICES
    from edgeomni.plugins.quant_linear import quantize_symmetric

    names = [n for n in tensors
             if n.startswith("layers.") and n.rsplit(".", 1)[-1] in INT4_MATRICES]  # fmt: skip
    # stacked heads (a code predictor's, one a residual group) stay float16, as the ONNX pass
    # leaves them (a Gather of the head, then a MatMul by it: no constant weight to quantize)
    lm_head = lm_head and int(spec.get("lm_heads") or 1) == 1
    names += ["lm_head"] if lm_head else []
    for matrix in names:
        w = tensors[matrix]
        k = w.shape[-1]
        if k % group:
            raise BuildError(f"{name}: {matrix} has K = {k}, not a multiple of the int4 "
                             f"--group-size {group}")  # fmt: skip
        flat = w.reshape(-1, k).astype(np.float32)
        packed, scales = quantize_symmetric(flat.T, group, np.float16)
        tensors[matrix] = np.ascontiguousarray(packed.reshape(*w.shape[:-1], k // 2))
        tensors[matrix + ".scales"] = np.ascontiguousarray(scales.reshape(*w.shape[:-1], -1))
    spec["int4"] = {"group_size": group, "lm_head": lm_head}

