"""Pre-quantized checkpoints (AWQ, GPTQ, compressed-tensors, FP8) built as they are stored: the
engine holds the checkpoint's own int4 codes and gives the same tokens as a float engine of the
same weights dequantized; formats and variants not read are one clear line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import onnx
import prequant_writers as writers
import pytest
import torch
from test_quantize import ARGS, greedy

from edgeomni.builder import cli as build_cli
from edgeomni.builder import onnxruntime as ort_backend
from edgeomni.builder import prequant
from edgeomni.export.common import prequantized
from edgeomni.export.common.checkpoint import CheckpointError, open_checkpoint
from edgeomni.export.family import BuildArgs

FORMATS = {  # id -> (quant_method, the writer)
    "awq-g32": ("awq", lambda: writers.awq(32)),
    "gptq-v1-g64": ("gptq", lambda: writers.gptq(64)),
    "gptq-v2-per-channel": ("gptq", lambda: writers.gptq(-1, v1=False)),
    "compressed-tensors-sym-g32": (
        "compressed-tensors", lambda: writers.compressed_tensors(32, symmetric=True)),
    "compressed-tensors-asym-g64": (
        "compressed-tensors", lambda: writers.compressed_tensors(64, symmetric=False)),
}  # fmt: skip


def _layers(ckpt: Path) -> int:
    return json.loads((ckpt / "config.json").read_text())["num_hidden_layers"]


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_int4_checkpoint_gives_the_dequantized_weights_tokens(
    qwen3_ckpt: Path, exports, tmp_path: Path, monkeypatch, fmt: str
) -> None:
    """Every decoder linear stays the checkpoint's int4 (codes, scales, zero points as stored:
    no new rounding), and greedy tokens equal the float engine of the dequantized weights
    (MatMulNBits computing in float: accuracy level 0)."""
    monkeypatch.setitem(ort_backend.NBITS_ACCURACY_LEVEL, "cpu", 0)
    pre, deq = tmp_path / "pre", tmp_path / "deq"
    writers.write_pair(qwen3_ckpt, pre, deq, FORMATS[fmt][1]())
    q_engine, f_engine = tmp_path / "q", tmp_path / "f"
    assert exports.build(pre, q_engine, BuildArgs(**ARGS)) is not None
    assert exports.build(deq, f_engine, BuildArgs(**ARGS)) is not None

    report = json.loads((q_engine / "config.json").read_text())["quantization"]
    # q/k/v and gate/up are one packed MatMul each: 4 int4 MatMuls a layer; the head stays float
    assert report["weights"] == 4 * _layers(qwen3_ckpt)
    assert (report["source"], report["bits"]) == ("checkpoint", 4)
    assert report["method"] == FORMATS[fmt][0]
    asymmetric = fmt.startswith("awq") or "asym" in fmt
    assert report["zero_points"] is asymmetric
    assert report["float_weights"] == {}
    model = onnx.load(str(q_engine / "llm.onnx"))
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == report["weights"]
    assert all((len(n.input) > 3 and bool(n.input[3])) is asymmetric for n in nbits)
    tokens = greedy(q_engine, tmp_path)
    assert tokens == greedy(f_engine, tmp_path) and all(tokens)


def test_stored_codes_reach_the_engine_unchanged(qwen3_ckpt: Path, tmp_path: Path) -> None:
    """The reader's dequantization is the writer's reference, and the pass puts the stored
    codes in the graph: q, k and v packed as one weight are found as the three AWQ linears,
    their own nibbles un-interleaved; a weight with rows the checkpoint does not hold is not."""
    from safetensors.torch import load_file

    from edgeomni.plugins import quant_linear

    pre, deq = tmp_path / "pre", tmp_path / "deq"
    writers.write_pair(qwen3_ckpt, pre, deq, writers.awq(32))
    ckpt = open_checkpoint(pre)
    pq = ckpt.prequantized
    names = [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv"]
    reference = load_file(deq / "model.safetensors")
    for name in names:
        assert torch.equal(ckpt.tensor(name), reference[name])
    index = prequant.RowIndex(pq.linear, pq.linear_names())
    qkv = np.concatenate([reference[n].numpy() for n in names])
    segments, _ = index.find(qkv)
    assert [name for name, _ in segments] == names
    packed, scales, zeros, bs = prequant.assemble(segments, np.float32)
    assert bs == 32 and zeros is not None
    stored = np.concatenate([pq.linear(n).codes for n in names])
    assert np.array_equal(quant_linear.unpack_codes(packed, qkv.shape[1]), stored)
    extra = np.random.default_rng(0).standard_normal((16, qkv.shape[1])).astype(np.float32)
    assert index.find(np.concatenate([qkv, extra])) == (None, "only partly int4 in the checkpoint")
    assert index.find(extra) == (None, "")


def test_groups_past_128_repeat_their_scale() -> None:
    """A group of 256 (or a whole row) is blocks of 128 with the group's scale repeated: the
    same weight, exactly."""
    from edgeomni.plugins import quant_linear

    rng = np.random.default_rng(1)
    q = prequantized.QuantizedLinear(
        codes=rng.integers(0, 16, (8, 512), dtype=np.uint8),
        scales=rng.random((8, 2)).astype(np.float16),
        zeros=rng.integers(0, 16, (8, 2), dtype=np.uint8),
        group=256,
    )
    index = prequant.RowIndex({"w": q}.__getitem__, ["w"])
    segments, _ = index.find(q.dequantized())
    packed, scales, zeros, bs = prequant.assemble(segments, np.float32)
    assert bs == 128 and scales.shape == (8, 4)
    deq = quant_linear.dequantize(packed, scales, zeros, k=512, block_size=bs)
    assert np.array_equal(deq.T, q.dequantized())
    assert prequant.block_for(96) is None and prequant.block_for(384) == 128


def test_fp8_checkpoint_reads_to_float(qwen3_ckpt: Path, exports, tmp_path: Path, caplog) -> None:
    """FP8 block weights are read to the engine's dtype (scale per block applied), with the size
    that costs said; tokens equal the float engine of the same values."""
    pre, deq = tmp_path / "pre", tmp_path / "deq"
    writers.write_pair(qwen3_ckpt, pre, deq, writers.fp8((32, 32)))
    q_engine, f_engine = tmp_path / "q", tmp_path / "f"
    with caplog.at_level(logging.WARNING, logger="edge-build"):
        assert exports.build(pre, q_engine, BuildArgs(**ARGS)) is not None
    assert any("FP8 weights (block-scaled e4m3) are read to float32" in r.message
               for r in caplog.records)  # fmt: skip
    assert exports.build(deq, f_engine, BuildArgs(**ARGS)) is not None
    tokens = greedy(q_engine, tmp_path)
    assert tokens == greedy(f_engine, tmp_path) and all(tokens)
    # and an FP8 checkpoint may be rounded to int4 on the way
    i4 = tmp_path / "i4"
    assert exports.build(pre, i4, BuildArgs(**ARGS, quantization="int4_rtn")) is not None
    assert json.loads((i4 / "config.json").read_text())["quantization"]["method"] == "int4_rtn"


def _edge_build(ckpt: Path, engine: Path, *extra: str) -> int:
    return build_cli.main(["--model-dir", str(ckpt), "--engine-dir", str(engine),
                           "--max-batch-size", "1", *extra])  # fmt: skip


@pytest.mark.parametrize(
    ("qconfig", "says"),
    [
        ({"quant_method": "bitsandbytes", "load_in_4bit": True},
         "quant_method 'bitsandbytes' (bitsandbytes) is not read"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "AWQ version 'gemv' is not read"),
        ({"quant_method": "gptq", "bits": 8}, "8-bit weights are not read"),
        ({"quant_method": "compressed-tensors", "format": "float-quantized"},
         "compressed-tensors format 'float-quantized' is not read"),
        ({"quant_method": "fp8", "activation_scheme": "static"},
         "FP8 without weight_block_size"),
        ("awq", "expected an object"),
    ],
)  # fmt: skip
def test_formats_not_read_are_one_clear_line(
    qwen3_ckpt: Path, tmp_path: Path, capsys, qconfig: object, says: str
) -> None:
    ckpt = tmp_path / "ckpt"
    import shutil

    shutil.copytree(qwen3_ckpt, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "quantization_config": qconfig}))
    assert _edge_build(ckpt, tmp_path / "eng") == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "eng").exists()
    with pytest.raises(CheckpointError, match="quantization_config"):
        open_checkpoint(ckpt)


def test_int4_checkpoint_takes_only_rtn_for_the_float_rest(
    qwen3_ckpt: Path, exports, tmp_path: Path, capsys
) -> None:
    """int4_awq has nothing to calibrate on an int4 checkpoint: refused in one line. int4_rtn
    keeps the stored weights and rounds what the checkpoint left float (here the lm_head)."""
    writers.write_pair(qwen3_ckpt, tmp_path / "pre", tmp_path / "deq", writers.awq(32))
    code = _edge_build(tmp_path / "pre", tmp_path / "eng", "--quantization", "int4_awq")
    assert code == 2
    assert "already quantized (awq int4)" in capsys.readouterr().err
    engine = tmp_path / "rtn"
    assert exports.build(tmp_path / "pre", engine, BuildArgs(**ARGS, quantization="int4_rtn"))
    report = json.loads((engine / "config.json").read_text())["quantization"]
    assert report["weights"] == 4 * _layers(qwen3_ckpt) and report["zero_points"] is True
    assert report["rounded"]["weights"] == 1 and report["rounded"]["lm_head"] is True
    model = onnx.load(str(engine / "llm.onnx"))
    assert [n.op_type for n in model.graph.node].count("MatMulNBits") == 4 * _layers(
        qwen3_ckpt) + 1  # fmt: skip
    assert all(greedy(engine, tmp_path))


def test_act_order_gptq_is_refused(qwen3_ckpt: Path, tmp_path: Path, capsys) -> None:
    """GPTQ act-order weights (groups that are not runs of K) are named, not misread."""
    hidden = json.loads((qwen3_ckpt / "config.json").read_text())["hidden_size"]
    shuffled = np.random.default_rng(0).permutation(np.arange(hidden) // 32)
    writers.write_pair(qwen3_ckpt, tmp_path / "pre", tmp_path / "deq",
                       writers.gptq(32, g_idx=shuffled))  # fmt: skip
    assert _edge_build(tmp_path / "pre", tmp_path / "eng") == 2
    assert "g_idx: act-order (desc_act) weights" in capsys.readouterr().err


def test_gptq_v1_zero_point_16_is_refused() -> None:
    """v1 stores zero - 1: a stored 15 (a zero point of 0 wrapped) would be 16, out of int4."""
    words = writers.pack8(np.full((1, 8), 15, np.uint8), 1)
    tensors = {
        "x.qweight": torch.from_numpy(writers.pack8(np.zeros((32, 8), np.uint8), 0)),
        "x.qzeros": torch.from_numpy(words),
        "x.scales": torch.ones(1, 8, dtype=torch.float16),
    }
    with pytest.raises(CheckpointError, match="zero point of 16"):
        prequantized.read_gptq(tensors.__getitem__, "x.", True, tensors.__contains__)


def test_omni_int4_checkpoint_speaks_as_its_dequantized_weights(
    omni_ckpt: Path, exports, tmp_path: Path, monkeypatch
) -> None:
    """Qwen3-Omni from a compressed-tensors checkpoint (every q/k/v/o and MLP projection int4,
    the MoE experts too): the engines hold the stored int4 of every component that has it (the
    code2wav's transformer too); the experts, which no MatMul holds as stored, are read to their
    dequantized values. Text, all 16 code groups and audio equal the float engines of the
    dequantized checkpoint."""
    from edgeomni.runtime import cli
    from edgeomni.runtime.audio import read_wav
    from edgeomni.runtime.safetensors_np import load

    monkeypatch.setitem(ort_backend.NBITS_ACCURACY_LEVEL, "cpu", 0)
    pre, deq = tmp_path / "pre", tmp_path / "deq"
    writers.write_pair(omni_ckpt, pre, deq, writers.compressed_tensors(32, symmetric=True))
    args = BuildArgs(max_batch_size=2, max_input_len=64, max_kv_cache_capacity=128)
    components = ["llm", "talker", "code_predictor", "code2wav"]
    outputs = []
    for ckpt in (pre, deq):
        engine = tmp_path / f"eng-{ckpt.name}"
        assert exports.build(ckpt, engine, args, components) is not None
        body = {"max_generate_length": 8, "requests": [
            {"messages": [{"role": "user", "content": "Hello! How are you today?"}]}]}  # fmt: skip
        (tmp_path / "r.json").write_text(json.dumps(body))
        sampling = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 12}
        code = cli.main(["--config", str(engine), "--input-file", str(tmp_path / "r.json"),
                         "--output-file", str(tmp_path / "p.json"), "--sampling",
                         json.dumps(sampling), "--output-audio-dir", str(tmp_path / ckpt.name)])  # fmt: skip
        assert code == cli.EXIT_OK
        entry = json.loads((tmp_path / "p.json").read_text())["responses"][0]
        outputs.append((entry["stages"]["thinker"]["output_tokens"],
                        np.asarray(load(entry["rvq_file"])["rvq_codes"]),
                        read_wav(entry["audio_file"])[0]))  # fmt: skip
    q_engine = tmp_path / "eng-pre"
    for sub in ("", "talker", "code_predictor", "code2wav"):
        report = json.loads((q_engine / sub / "config.json").read_text())["quantization"]
        assert report["method"] == "compressed-tensors" and report["weights"] > 0, sub
    (q_tokens, q_codes, q_audio), (f_tokens, f_codes, f_audio) = outputs
    assert q_tokens == f_tokens and q_tokens
    np.testing.assert_array_equal(q_codes, f_codes)
    assert q_codes.shape[0] > 0 and q_codes.shape[1] == 16
    # 16-bit WAVs of float audio that agrees to ~1e-5: at most a step or two apart
    assert q_audio.shape == f_audio.shape and np.abs(q_audio - f_audio).max() <= 3 / 32768


@pytest.mark.parametrize("fmt", ["awq-g32", "gptq-v2-per-channel"])
def test_estimate_counts_the_stored_int4(qwen3_ckpt: Path, exports, tmp_path: Path, fmt) -> None:
    """edge-build --estimate from an int4 checkpoint's config alone counts its decoder linears
    at their stored layout (zero points, per-row groups as blocks of the row): within 2% of the
    built engine's bytes."""
    from test_estimate import compare

    pre, deq = tmp_path / "pre", tmp_path / "deq"
    writers.write_pair(qwen3_ckpt, pre, deq, FORMATS[fmt][1]())
    engine = tmp_path / "eng"
    assert exports.build(pre, engine, BuildArgs(**ARGS)) is not None
    ((est, built, est_tables, tables),) = compare(pre, engine, BuildArgs(**ARGS), tmp_path).values()
    assert abs(est / built - 1) < 0.02 and est_tables == tables, (est, built)
    float_engine = tmp_path / "f"
    assert exports.build(deq, float_engine, BuildArgs(**ARGS)) is not None
    ((f_est, f_built, _, _),) = compare(deq, float_engine, BuildArgs(**ARGS), tmp_path).values()
    assert built < 0.75 * f_built and est < 0.75 * f_est


def test_scales_not_exact_in_the_engine_dtype_leave_the_weight_float() -> None:
    """A float16 graph of a weight whose scales float16 cannot hold (1e-6: subnormal there)
    keeps the float weight, with the reason, rather than an int4 weight that is not it."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    q = prequantized.QuantizedLinear(
        codes=rng.integers(0, 16, (8, 32), dtype=np.uint8),
        scales=np.full((8, 1), 1.2345e-6, np.float32),
        zeros=np.full((8, 1), 8, np.uint8),
        group=32,
    )
    w = q.dequantized().T.astype(np.float16)  # [K, N] as a float16 export holds it
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 8])],
        [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    model = helper.make_model(graph)
    report = prequant.apply(model, prequant.RowIndex({"lin.weight": q}.__getitem__, ["lin.weight"]))
    assert report is not None and report["weights"] == 0
    assert report["float_weights"] == {"w": "its scales are not exact in float16"}
    assert [n.op_type for n in model.graph.node] == ["MatMul"]


def test_declared_format_is_checked_against_the_tensors(
    qwen3_ckpt: Path, tmp_path: Path, capsys
) -> None:
    """Issue 50: a quantization_config saying AWQ over float tensors is exit 2 naming the key
    and a float linear, for a build (before any export) and for --estimate, which would
    otherwise count int4 that the build never makes; a stored AWQ tensor of the wrong dtype
    is named too."""
    import shutil

    from safetensors.torch import load_file, save_file

    ckpt = tmp_path / "ckpt"
    shutil.copytree(qwen3_ckpt, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    _, awq_config = writers.awq(32)
    (ckpt / "config.json").write_text(json.dumps({**config, "quantization_config": awq_config}))
    says = ("config.json: quantization_config.quant_method 'awq' declares awq int4 weights, "
            "but no tensor is stored so (its linears are <linear>.qweight I32")  # fmt: skip
    capsys.readouterr()
    assert _edge_build(ckpt, tmp_path / "eng") == 2
    err = capsys.readouterr().err
    assert says in err and "proj.weight is F32" in err and not (tmp_path / "eng").exists()
    assert build_cli.main(["--model-dir", str(ckpt), "--estimate"]) == 2
    assert says in capsys.readouterr().err
    pre = tmp_path / "pre"
    writers.write_pair(qwen3_ckpt, pre, tmp_path / "deq", writers.awq(32))
    (shard,) = pre.glob("*.safetensors")
    tensors = load_file(str(shard))
    name = next(n for n in sorted(tensors) if n.endswith(".qzeros"))
    tensors[name] = tensors[name].float()
    save_file(tensors, str(shard))
    capsys.readouterr()
    assert _edge_build(pre, tmp_path / "eng") == 2
    assert f"quantization_config.quant_method 'awq': {name} is F32, not I32" in (
        capsys.readouterr().err)  # fmt: skip
