"""The ONNX Runtime backend: lower plugin ops to contrib ops and save an optimised model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeomni.builder.errors import BuildError
from edgeomni.builder.ort_fusions import fuse_attention_prologue, fuse_residual_rms_norm
from edgeomni.export.family import BuildArgs

PROVIDERS = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider"]}
# MatMulNBits' (and QMoE's) compute type per provider: on the CPU, 4 quantizes each block of
# activations to int8 and runs int8 dot products (4.3x fp32 at Qwen3-0.6B's sizes;
# docs/quantization.md has its perplexity cost); the CUDA kernels dequantize to the activations'
# type whatever it says
NBITS_ACCURACY_LEVEL = {"cpu": 4, "cuda": 0}


def backend(args: BuildArgs) -> Callable[..., dict[str, Any]]:
    """The build of each component (plugins/backends.py): its lowering, in its config.json."""
    return lambda raw, out, args, ranges, seeds: {"lowering": build_engine(raw, out, args)}


def build_engine(raw: Path, out_path: Path, args: BuildArgs) -> dict[str, Any]:
    """raw ONNX (edgeomni ops) -> lowered -> ORT-optimised model at out_path (+ .data if large);
    returns the lowering options used, for the engine's config.json.

    The optimisation runs once here, at EXTENDED level (the CPU provider's fusions; ENABLE_ALL
    would add layout changes that tie the file to this machine's CPU), so the runtime starts fast.
    """
    import onnx
    import onnxruntime as ort

    from edgeomni.plugins import lower_model
    from edgeomni.plugins.lowering import onnxruntime_options

    if args.device not in PROVIDERS:
        raise BuildError(f"device {args.device!r} is not supported by this build of edge-build")
    if args.device == "cuda":
        return _save_for_cuda(raw, out_path, args)
    model = onnx.load(str(raw), load_external_data=False)
    options = _used({**onnxruntime_options(), **nbits_options(model, args.device)}, model)
    lower_model(model, "onnxruntime", options)
    lowered = raw.with_name(raw.stem + ".lowered.onnx")
    onnx.save(model, str(lowered))  # external tensors keep pointing at raw's data file
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(out_path)
    if external:
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", out_path.name + ".data"
        )
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
    try:
        ort.InferenceSession(str(lowered), so, providers=PROVIDERS[args.device])
    except Exception as e:  # ORT raises its own exception types
        raise BuildError(f"ONNX Runtime could not build {out_path.name}: {e}") from None
    if not out_path.is_file():
        raise BuildError(f"ONNX Runtime wrote no optimised model to {out_path}")
    return options


def _used(options: dict[str, Any], model: Any) -> dict[str, Any]:
    """The options without ``gated_delta_net`` where the model has no DeltaNet op: the engine
    config records what its lowering used, and the runtime refuses an onnxruntime too old for
    it (engine._check_lowering)."""
    from edgeomni.plugins import gated_delta

    ops = (gated_delta.RULE_OP_TYPE, gated_delta.CONV_OP_TYPE)
    if not any(n.op_type in ops for n in model.graph.node):
        options.pop("gated_delta_net", None)
    return options


def nbits_options(model: Any, device: str) -> dict[str, Any]:
    """The accuracy level of a quantized model's MatMulNBits and QMoE (nothing for a float
    model): QMoE's CPU kernel reads the level as MatMulNBits does."""
    from edgeomni.plugins import quant_linear, quant_moe

    quantized = (quant_linear.OP_TYPE, quant_moe.OP_TYPE)
    if not any(n.op_type in quantized for n in model.graph.node):
        return {}
    return {"nbits_accuracy_level": NBITS_ACCURACY_LEVEL[device]}


def cuda_lowering(model: Any) -> dict[str, Any]:
    """The plugin lowering for the CUDA provider: lengths from the host; rotary in one kernel;
    plain-op attention for a model without float16 weights."""
    import onnx

    from edgeomni.plugins.lowering import onnxruntime_options

    half = any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
    return {
        **onnxruntime_options(),
        "lengths_as_inputs": True,
        "plain_attention": not half,
        "fused_rotary": True,
    }


def _save_for_cuda(raw: Path, out_path: Path, args: BuildArgs) -> dict[str, Any]:
    """Lowered but not optimised: the CUDA provider's fusions need the GPU, so they run when the
    engine is first loaded there (with ENABLE_ALL), and this build runs on any machine.

    Attention takes its lengths from the host (computed in the graph they gave wrong float16
    prefill on the CUDA provider); a model without float16 weights (code2wav, or a float32
    build) gets plain-op attention, since GroupQueryAttention has no float32 CUDA kernel and would
    run on the CPU with copies around it (measured: 10 Memcpy nodes, 255 ms per code2wav window).
    """
    import onnx

    from edgeomni.plugins import lower_model

    model = onnx.load(str(raw))  # external weights in, so they can be written beside the engine
    options = _used({**cuda_lowering(model), **nbits_options(model, "cuda")}, model)
    lower_model(model, "onnxruntime", options)
    options["fused_residual_norms"] = fuse_residual_rms_norm(model)
    if options.get("qk_norm_attention"):  # 1-D RoPE decoders (LLMs, Qwen3-Omni's code predictor)
        positions = args.max_kv_cache_capacity
        options["fused_attention_prologue"] = fuse_attention_prologue(model, positions)
    big = sum(t.ByteSize() for t in model.graph.initializer) > (1 << 30)
    onnx.save_model(
        model,
        str(out_path),
        save_as_external_data=big,
        all_tensors_to_one_file=True,
        location=out_path.name + ".data",
    )
    return options
