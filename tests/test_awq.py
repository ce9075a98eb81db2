"""int4_awq's pieces (builder/awq.py, builder/quantize.py): the scale search, the calibration
text, and the graph edit that divides each scaled input (folded into its norm, or one Mul)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeomni.builder import awq
from edgeomni.builder import cli as build_cli
from edgeomni.builder.errors import BuildError
from edgeomni.builder.quantize import Quantization, quantize_model
from edgeomni.plugins import lower_model, quant_linear
from edgeomni.plugins.lowering import onnxruntime_options

K, N = 64, 32


def activations(rows: int = 256, seed: int = 0) -> np.ndarray:
    """Activations with a few loud channels: what AWQ is for."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, K)).astype(np.float32)
    x[:, :4] *= 30
    return x


def test_search_never_does_worse_than_rtn_and_helps_loud_channels() -> None:
    x = activations()
    w = np.random.default_rng(1).standard_normal((K, N)).astype(np.float32)
    s, alpha, ratio = awq.search_scale(x, [w], 32)
    assert s.shape == (K,) and s.dtype == np.float32
    assert 0 < ratio <= 1.0
    assert alpha > 0 and ratio < 0.9  # the loud channels get more of the grid
    assert s[:4].mean() > s[4:].mean()
    # alpha 0 is plain RTN and is always tried: even on even activations no worse than it
    even = np.random.default_rng(2).standard_normal((256, K)).astype(np.float32)
    _, _, ratio_even = awq.search_scale(even, [w], 32)
    assert 0 < ratio_even <= 1.0


def test_calibration_texts(tmp_path: Path) -> None:
    shipped = awq.calibration_texts(None)
    assert len(shipped) > 10 and all(t.strip() for t in shipped)
    body = {"requests": [
        {"messages": [{"role": "user", "content": "one"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "two"},
                                                    {"type": "image", "image": "x.png"}]}]},
    ]}  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps(body))
    assert awq.calibration_texts(tmp_path / "r.json") == ["one", "two"]
    (tmp_path / "empty.json").write_text('{"requests": []}')
    with pytest.raises(BuildError, match="no message text"):
        awq.calibration_texts(tmp_path / "empty.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(BuildError, match="bad.json: invalid JSON at line 1 column 2"):
        awq.calibration_texts(tmp_path / "bad.json")


def test_calibration_files_are_read_as_edge_infer_reads_them(tmp_path: Path, capsys) -> None:
    """Issue 50: the README's prompt shorthand is calibration text too, and a typo'd key is
    named as edge-infer names it (its request-file reader reads both), exit 2 before any
    export."""
    from edgeomni.export.tiny import make_qwen3
    from edgeomni.runtime.requests import load_request_file

    (tmp_path / "prompt.json").write_text(json.dumps(
        {"requests": [{"prompt": "one"}, {"messages": [{"role": "user", "content": "two"}]}]}))  # fmt: skip
    assert awq.calibration_texts(tmp_path / "prompt.json") == ["one", "two"]
    typo = tmp_path / "typo.json"
    typo.write_text('{"requests": [{"mesages": [{"role": "user", "content": "x"}]}]}')
    named = "request 0: unknown request keys ['mesages']; did you mean 'mesages' -> 'messages'?"
    with pytest.raises(BuildError, match=re.escape(named)):
        awq.calibration_texts(typo)
    (entry,), _ = load_request_file(typo)  # edge-infer's own words for the same request
    assert named.removeprefix("request 0: ") in entry.error
    engine = tmp_path / "e"
    ckpt = make_qwen3(tmp_path / "ckpt")
    code = build_cli.main(["--model-dir", str(ckpt), "--engine-dir", str(engine),
                           "--quantization", "int4_awq", "--calibration", str(typo)])  # fmt: skip
    assert code == build_cli.EXIT_BAD_INPUT
    assert f"edge-build: error: --calibration: {typo}: {named}" in capsys.readouterr().err
    assert not engine.exists()


def _model(with_norm: bool) -> tuple:
    """h -> [RMSNormalization(g) ->] x -> MatMul(W) -> y, as a decoder (a KV cache input)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((K, N)).astype(np.float32)
    g = (rng.random(K) + 0.5).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x" if with_norm else "h", "w"], ["y"])]
    if with_norm:
        nodes.insert(0, helper.make_node("RMSNormalization", ["h", "g"], ["x"], epsilon=1e-6))
    graph = helper.make_graph(
        nodes, "m",
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [5, K]),
         helper.make_tensor_value_info("past_key_0", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, N])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(g, "g")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), w, g


@pytest.mark.parametrize("with_norm", [True, False])
def test_scaled_input_computes_x_over_s_times_the_scaled_weight(with_norm: bool) -> None:
    """y = (x / s) @ deq(Q(s * W)): with a norm before, 1/s is in the norm's weight (a copy);
    without, one Mul divides x."""
    model, w, g = _model(with_norm)
    s = (np.linspace(0.5, 2.0, K)).astype(np.float32)
    x_name = "x" if with_norm else "h"
    report = quantize_model(model, Quantization("int4_awq", 32, lm_head=True), scales={x_name: s})
    assert report["awq_scaled_inputs"] == {"folded_into_norms": int(with_norm),
                                           "mul": int(not with_norm)}  # fmt: skip
    ops = [n.op_type for n in model.graph.node]
    assert ops == (["RMSNormalization", "QuantMatMul"] if with_norm else ["Mul", "QuantMatMul"])
    lower_model(model, "onnxruntime", {**onnxruntime_options(), "nbits_accuracy_level": 0})
    h = np.random.default_rng(4).standard_normal((5, K)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(["y"], {"h": h, "past_key_0": np.zeros(1, np.float32)})[0]
    x = h / np.sqrt((h**2).mean(-1, keepdims=True) + 1e-6) * g if with_norm else h
    packed, scales = quant_linear.quantize_symmetric(w * s[:, None], 32)
    deq = quant_linear.dequantize(packed, scales, None, k=K, block_size=32)
    np.testing.assert_allclose(got, (x / s) @ deq, rtol=1e-4, atol=1e-4)


def test_cli_checks_calibration_before_exporting(tmp_path: Path, capsys) -> None:
    from edgeomni.export.tiny import make_qwen3

    ckpt = make_qwen3(tmp_path / "ckpt")
    base = ["--model-dir", str(ckpt), "--engine-dir", str(tmp_path / "e")]
    assert build_cli.main([*base, "--calibration", "x.json"]) == build_cli.EXIT_BAD_INPUT
    assert "--calibration needs --quantization int4_awq" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[")
    code = build_cli.main([*base, "--quantization", "int4_awq", "--calibration",
                           str(tmp_path / "bad.json")])  # fmt: skip
    assert code == build_cli.EXIT_BAD_INPUT
    assert "bad.json: invalid JSON at line 1 column 2" in capsys.readouterr().err
    assert not (tmp_path / "e").exists()  # refused before anything was exported
