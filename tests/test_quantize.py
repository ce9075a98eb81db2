"""edge-build --quantization: the pass over the exported graph, and what the engines it builds
compute (the same tokens as float engines of the dequantized weights)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeomni.builder import cli as build_cli
from edgeomni.builder import onnxruntime as ort_backend
from edgeomni.builder.quantize import Quantization, quantize_file, quantize_model
from edgeomni.export.family import BuildArgs
from edgeomni.plugins import quant_linear
from edgeomni.runtime import cli

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = ["Hello! How are you today?", "Hi", "The quick brown fox jumps over the lazy dog."]


def dequantized_checkpoint(src: Path, dst: Path, group: int, lm_head: bool) -> Path:
    """A copy of ``src`` whose decoder linear weights are replaced by their int4 RTN values; a
    tied lm_head is untied first, so only the head (not the embedding table) is dequantized."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    for f in dst.glob("*.safetensors"):
        tensors = load_file(f)
        if lm_head and config.get("tie_word_embeddings") and "lm_head.weight" not in tensors:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
            config["tie_word_embeddings"] = False
        for name, w in tensors.items():
            layer = name.split(".")[-2] if name.endswith(".weight") else ""
            if layer in LINEARS or (lm_head and name == "lm_head.weight"):
                packed, scales = quant_linear.quantize_symmetric(w.T, group, w.dtype)
                k = w.shape[1]
                deq = quant_linear.dequantize(packed, scales, None, k=k, block_size=group)
                tensors[name] = np.ascontiguousarray(deq.T)
        save_file(tensors, f, metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def greedy(engine: Path, tmp_path: Path, stage: str = "llm") -> list[list[int]]:
    body = {
        "temperature": 0,
        "max_generate_length": 20,
        "requests": [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS],
    }
    req, pred = tmp_path / "req.json", tmp_path / "pred.json"
    req.write_text(json.dumps(body))
    code = cli.main(["--config", str(engine), "--input-file", str(req), "--output-file", str(pred)])
    assert code == cli.EXIT_OK
    responses = json.loads(pred.read_text())["responses"]
    return [r["stages"][stage]["output_tokens"] for r in responses]


ARGS = {"max_batch_size": 3, "max_input_len": 64, "max_kv_cache_capacity": 128}


@pytest.mark.parametrize(("group", "lm_head"), [(32, False), (64, True)])
def test_int4_engine_gives_the_dequantized_weights_tokens(
    qwen3_ckpt: Path, exports, tmp_path: Path, monkeypatch, group: int, lm_head: bool
) -> None:
    """The int4 engine (MatMulNBits computing in float: accuracy level 0) and a float engine of
    the same weights dequantized in numpy generate the same greedy tokens."""
    monkeypatch.setitem(ort_backend.NBITS_ACCURACY_LEVEL, "cpu", 0)
    q_args = BuildArgs(**ARGS, quantization="int4_rtn", group_size=group, quantize_lm_head=lm_head)
    q_engine = tmp_path / "int4"
    assert exports.build(qwen3_ckpt, q_engine, q_args) is not None
    deq_ckpt = dequantized_checkpoint(qwen3_ckpt, tmp_path / "deq", group, lm_head)
    f_engine = tmp_path / "float"
    assert exports.build(deq_ckpt, f_engine, BuildArgs(**ARGS)) is not None

    cfg = json.loads((q_engine / "config.json").read_text())
    q = cfg["quantization"]
    layers = json.loads((qwen3_ckpt / "config.json").read_text())["num_hidden_layers"]
    # qkv and gate/up are one packed MatMul each: 4 per layer, and the lm_head when asked
    assert q["weights"] == 4 * layers + lm_head
    assert (q["method"], q["group_size"], q["lm_head"]) == ("int4_rtn", group, lm_head)
    assert q["float_weights"] == ([] if lm_head else ["lm_head_t"])
    assert cfg["lowering"]["nbits_accuracy_level"] == 0
    model = onnx.load(str(q_engine / "llm.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == q["weights"]
    assert ops.count("MatMul") == (0 if lm_head else 1)
    assert (q_engine / "llm.onnx").stat().st_size < 0.6 * (f_engine / "llm.onnx").stat().st_size

    tokens = greedy(q_engine, tmp_path)
    assert tokens == greedy(f_engine, tmp_path)
    assert all(len(t) > 0 for t in tokens)


def test_default_cpu_build_is_int8_compute(qwen3_ckpt: Path, exports, tmp_path: Path) -> None:
    """Without the patch the CPU engine computes at accuracy level 4 (int8 activations) and
    runs end to end; the level is recorded for the runtime and the reader."""
    engine = tmp_path / "int4"
    assert exports.build(qwen3_ckpt, engine, BuildArgs(**ARGS, quantization="int4_rtn")) is not None
    assert json.loads((engine / "config.json").read_text())["lowering"]["nbits_accuracy_level"] == 4
    tokens = greedy(engine, tmp_path)
    assert [len(t) for t in tokens] and all(tokens)


def _toy(k: int, n: int, *, kv_cache: bool = True) -> onnx.ModelProto:
    """x [1, K] -> MatMul(W [K, N]) -> logits, with a KV cache input when it is a decoder."""
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])]
    if kv_cache:
        inputs.append(helper.make_tensor_value_info("past_key_0", TensorProto.FLOAT, [1]))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Relu", ["h"], ["y"]),
            helper.make_node("MatMul", ["y", "w2"], ["logits"]),
        ],  # fmt: skip
        "toy",
        inputs,
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w[:n, :n].copy(), "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def test_left_float_names_the_weight_not_the_exporters_copy(caplog) -> None:
    """Issue 50: torch's exporter stores a linear's weight transposed as an initializer of its
    own (val_6); the log and the report name the module's weight, from the node's name
    scopes, as a real export of the tiny Qwen3 carries them."""
    caplog.set_level("INFO", logger="edge-build")
    model = _toy(96, 64)
    model.graph.initializer[0].name = model.graph.node[0].input[1] = "val_6"
    scopes = "['', 'model.layers.0', 'model.layers.0.mlp.down_proj', 'linear']"
    model.graph.node[0].metadata_props.add(key="pkg.torch.onnx.name_scopes", value=scopes)
    report = quantize_model(model, Quantization("int4_rtn", 64, lm_head=False))
    assert report["float_weights"] == ["model.layers.0.mlp.down_proj.weight", "w2"]
    assert "left float: model.layers.0.mlp.down_proj.weight (K=96 is not a multiple" in caplog.text
    assert "val_6" not in caplog.text


def test_pass_leaves_what_it_cannot_quantize_float(caplog) -> None:
    """K not a multiple of the group stays float, named in the report and the log; so does the
    lm_head (the MatMul making logits) when asked; by default it is quantized."""
    caplog.set_level("INFO", logger="edge-build")
    model = _toy(96, 64)  # K=96: groups of 64 do not divide it; the lm_head's K=64 does
    report = quantize_model(model, Quantization("int4_rtn", 64, lm_head=False))
    assert report["weights"] == 0
    assert report["float_weights"] == ["w", "w2"]
    assert "w (K=96 is not a multiple of the group size 64)" in caplog.text
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Relu", "MatMul"]
    model = _toy(96, 64)
    report = quantize_model(model, Quantization("int4_rtn", 32))
    assert report["weights"] == 2 and report["lm_head"] is True
    assert [n.op_type for n in model.graph.node] == ["QuantMatMul", "Relu", "QuantMatMul"]
    assert {t.name for t in model.graph.initializer} == {"w_q4", "w_q4_scales", "w2_q4",
                                                          "w2_q4_scales"}  # fmt: skip


def test_components_without_a_kv_cache_stay_float(tmp_path: Path) -> None:
    raw = tmp_path / "enc.onnx"
    onnx.save(_toy(64, 32, kv_cache=False), str(raw))
    assert quantize_file(raw, tmp_path / "enc.q4.onnx", Quantization("int4_rtn", 32)) is None
    assert not (tmp_path / "enc.q4.onnx").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--group-size", "64"],
         "--group-size, --[no-]quantize-lm-head and --quantize-encoders need --quantization"),
        (["--quantize-lm-head"], "need --quantization"),
        (["--no-quantize-lm-head"], "need --quantization"),
        (["--quantize-encoders"], "need --quantization"),
    ],
)
def test_cli_refuses_quantization_flags_alone(
    tmp_path: Path, capsys, argv: list[str], message: str
) -> None:
    code = build_cli.main(
        ["--model-dir", str(tmp_path), "--engine-dir", str(tmp_path / "e"), *argv]
    )
    assert code == build_cli.EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_cli_refuses_an_unknown_method_and_group(tmp_path: Path, capsys) -> None:
    base = ["--model-dir", str(tmp_path), "--engine-dir", str(tmp_path / "e")]
    for extra in (["--quantization", "int3"], ["--quantization", "int4_rtn", "--group-size", "48"]):
        with pytest.raises(SystemExit) as e:
            build_cli.main(base + extra)
        assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_omni_int4_quantizes_every_decoder_and_runs(
    omni_ckpt: Path, exports, tmp_path: Path, caplog
) -> None:
    """Qwen3-Omni's thinker, talker and code predictor are quantized by the same pass, the
    thinker's and talker's MoE experts too (QMoE); the encoders and code2wav (both engines) stay
    float; a spoken reply runs end to end."""
    caplog.set_level("INFO", logger="edge-build")
    engine = tmp_path / "omni-int4"
    args = BuildArgs(max_batch_size=2, max_input_len=128, max_kv_cache_capacity=256,
                     quantization="int4_rtn")  # fmt: skip
    assert exports.build(omni_ckpt, engine, args) is not None
    reports = {
        p.parent.relative_to(engine).as_posix(): json.loads(p.read_text())["quantization"]
        for p in engine.rglob("config.json")
        if "component" in json.loads(p.read_text())
    }
    assert {k for k, v in reports.items() if v is None} == {"audio", "visual", "code2wav",
                                                            "code2wav_stream"}  # fmt: skip
    config = json.loads((omni_ckpt / "config.json").read_text())
    for name in (".", "talker", "code_predictor"):
        assert reports[name]["weights"] > 0, name
        model = onnx.load(str(engine / name / "llm.onnx"), load_external_data=False)
        ops = [n.op_type for n in model.graph.node]
        # the weights, each read by one MatMulNBits a call (15, one a step, in a frame engine)
        packed = {n.input[1] for n in model.graph.node if n.op_type == "MatMulNBits"}
        assert len(packed) == reports[name]["weights"], name
        assert ops.count("QMoE") == reports[name]["moe_blocks"], name
        assert "MoE" not in ops and reports[name]["float_moe_blocks"] == 0, name
    thinker = config["thinker_config"]["text_config"]["num_hidden_layers"]
    assert reports["."]["moe_blocks"] == thinker and reports["talker"]["moe_blocks"] > 0
    assert "keep float experts" not in caplog.text
    body = {"max_generate_length": 8, "requests": [{"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]}]}  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps(body))
    sampling = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 8}
    code = cli.main(["--config", str(engine), "--input-file", str(tmp_path / "r.json"),
                     "--output-file", str(tmp_path / "p.json"), "--sampling",
                     json.dumps(sampling), "--output-audio-dir", str(tmp_path / "a")])  # fmt: skip
    assert code == cli.EXIT_OK
    (entry,) = json.loads((tmp_path / "p.json").read_text())["responses"]
    assert entry["ok"], entry["error"]
    assert list((tmp_path / "a").glob("*.wav"))


def test_a_gemm_with_bias_is_quantized_as_its_linear() -> None:
    """torch exports a Linear over 2-D inputs as Gemm(x, W [N, K], b, transB=1): it becomes
    QuantMatMul of W's transpose plus an Add of the bias, and computes x @ deq(W^T) + b."""
    import onnxruntime as ort

    from edgeomni.plugins import lower_model
    from edgeomni.plugins.lowering import onnxruntime_options

    rng = np.random.default_rng(5)
    k, n = 64, 48
    w, b = rng.standard_normal((n, k)).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, k]),
         helper.make_tensor_value_info("past_key_0", TensorProto.FLOAT, [1])],  # fmt: skip
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    report = quantize_model(model, Quantization("int4_rtn", 32))
    assert report["weights"] == 1
    assert [n.op_type for n in model.graph.node] == ["QuantMatMul", "Add"]
    packed, scales = quant_linear.quantize_symmetric(np.ascontiguousarray(w.T), 32)
    x = rng.standard_normal((3, k)).astype(np.float32)
    expected = quant_linear.reference(x, packed, scales, K=k, N=n, block_size=32) + b
    lower_model(model, "onnxruntime", {**onnxruntime_options(), "nbits_accuracy_level": 0})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(["y"], {"x": x, "past_key_0": np.zeros(1, np.float32)})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_omni_int4_experts_give_the_dequantized_experts_tokens(
    omni_ckpt: Path, exports, tmp_path: Path, monkeypatch
) -> None:
    """The thinker with int4 experts (QMoE) and int4 linears (MatMulNBits), both computing in
    float (accuracy level 0), generates the greedy tokens of a float thinker whose experts and
    linears were dequantized in numpy (per expert on disk: ``...experts.N.gate_proj.weight``,
    rounded along each row's inputs exactly as the pass rounds fc1/fc2's rows)."""
    monkeypatch.setitem(ort_backend.NBITS_ACCURACY_LEVEL, "cpu", 0)
    args = {"max_batch_size": 3, "max_input_len": 128, "max_kv_cache_capacity": 256}
    q_engine, f_engine = tmp_path / "int4", tmp_path / "float"
    q_args = BuildArgs(**args, quantization="int4_rtn", quantize_lm_head=False)
    assert exports.build(omni_ckpt, q_engine, q_args, ["llm"]) is not None
    deq_ckpt = dequantized_checkpoint(omni_ckpt, tmp_path / "deq", 32, lm_head=False)
    assert exports.build(deq_ckpt, f_engine, BuildArgs(**args), ["llm"]) is not None
    q_bytes, f_bytes = ((e / "llm.onnx").stat().st_size for e in (q_engine, f_engine))
    assert q_bytes < 0.5 * f_bytes, (q_bytes, f_bytes)
    ops = [n.op_type for n in onnx.load(str(q_engine / "llm.onnx")).graph.node]
    assert ops.count("QMoE") > 0 and "MoE" not in ops
    tokens = greedy(q_engine, tmp_path, "thinker")
    assert tokens == greedy(f_engine, tmp_path, "thinker")
    assert all(len(t) > 0 for t in tokens)
