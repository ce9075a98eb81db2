"""int4_awq for talkers and code predictors (builder/awq_graph.py): their MatMul inputs recorded
while the built graph runs the calibration requests, then the calibrated rounding."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from edgeomni.builder import awq_graph
from edgeomni.export.family import BuildArgs
from edgeomni.runtime import cli, taps

ARGS = {"max_batch_size": 2, "max_input_len": 64, "max_kv_cache_capacity": 128}


def _reports(engine: Path) -> dict[str, dict]:
    return {name: json.loads((engine / name / "config.json").read_text())["quantization"]
            for name in ("talker", "code_predictor")}  # fmt: skip


def test_speech_decoders_are_calibrated_in_the_built_graph(
    tts_engine: Path, exports, tmp_path: Path
) -> None:
    """A CustomVoice checkpoint: the shipped text is spoken in its first voice through the
    built graph; the talker's and code predictor's recorded inputs give scales that beat plain
    rounding on them, and the calibrated engines (code2wav's transformer int4 too) run end to
    end."""
    ckpt = tts_engine.parent / "ckpt"
    engine = tmp_path / "awq"
    args = BuildArgs(**ARGS, quantization="int4_awq", quantize_encoders=True)
    assert exports.build(ckpt, engine, args) is not None
    for name, report in _reports(engine).items():
        awq = report["awq"]
        assert report["method"] == "int4_awq", (name, report)
        assert awq["calibrated"] and awq["inputs_from"] == "the built graph's run"
        assert awq["scaled_inputs"] > 0 and awq["error_vs_rtn"] < 1.0, (name, awq)
    # code2wav (no KV cache) is rounded plainly under --quantize-encoders, not run for rows
    vocoder = json.loads((engine / "code2wav" / "config.json").read_text())["quantization"]
    assert vocoder["method"] == "int4_rtn" and vocoder["weights"] > 0
    assert vocoder["awq"] == {"calibrated": False, "why": "encoders are rounded plainly"}
    out = tmp_path / "a.wav"
    code = cli.main(["--config", str(engine), "--prompt", "Hello there.", "--voice", "vivian",
                     "--out-audio", str(out), "--sampling", '{"talker_max_new_tokens": 6}'])  # fmt: skip
    assert code == cli.EXIT_OK and out.stat().st_size > 44


def test_a_graph_that_cannot_run_leaves_plain_rounding(
    tts_engine: Path, exports, tmp_path: Path, monkeypatch, caplog
) -> None:
    """When the calibration run fails, the components keep their plain int4 rounding, and
    the warning and config.json say why."""
    monkeypatch.setattr(awq_graph, "record", lambda *a, **k: "the reason")
    engine = tmp_path / "rtn"
    with caplog.at_level(logging.WARNING, logger="edge-build"):
        assert exports.build(tts_engine.parent / "ckpt", engine,
                             BuildArgs(**ARGS, quantization="int4_awq")) is not None  # fmt: skip
    for name, report in _reports(engine).items():
        assert report["method"] == "int4_rtn" and report["weights"] > 0, name
        assert report["awq"] == {"calibrated": False, "why": "the reason"}
    assert sum("int4_awq cannot calibrate it (the reason)" in r.message
               for r in caplog.records) == 2  # fmt: skip


def test_real_rows_drop_idle_rows_padding_and_non_finite() -> None:
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    x[0, 0, 1] = np.nan
    lens = np.array([2, 0])
    rows = taps.real_rows(x, lens)
    np.testing.assert_array_equal(rows, x[0, 1:2])  # row 0's first is NaN, row 1 idle
    flat = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(taps.real_rows(flat, np.array([1, 0])), flat[:1])
    np.testing.assert_array_equal(taps.real_rows(flat, None), flat)


@pytest.mark.parametrize("budget", [4, 9])
def test_shipped_text_is_cut_to_the_build(budget: int) -> None:
    """Requests of plain text stay within the budget (whole words), the family's fields on top."""
    text = "one two three four five six seven eight nine ten eleven"
    body = awq_graph.calibration_body([text], None, {"voice": "aiden"}, max_input_len=2 * budget)
    assert body["voice"] == "aiden" and body["max_generate_length"] == awq_graph.MAX_TOKENS
    assert body["seed"] == 0
    pieces = [r["messages"][0]["content"] for r in body["requests"]]
    assert " ".join(pieces) == text
    assert all(len(p.split()) <= max(8, budget) for p in pieces)


def test_tap_binding_hands_each_call_its_own_rows(tmp_path: Path) -> None:
    """A tap bound after the engine's own outputs (and bound again each call) gets that call's
    values: ONNX Runtime's output order is the order names were first bound."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4]),
         helper.make_empty_tensor_value_info("h")],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )  # fmt: skip
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    got: list[np.ndarray] = []
    engine = taps.TapEngine(taps.Tap(path, ("h",), lambda name, rows: got.append(rows)))
    binding = engine.binding()
    y = np.zeros((1, 2, 4), np.float32)
    binding.bind_output("y", y)
    for i in range(2):
        x = rng.standard_normal((1, 2, 4)).astype(np.float32)
        binding.run({"x": x, "query_lens": np.array([1 + i])})
        np.testing.assert_allclose(got[-1], (x @ w1)[0, : 1 + i], rtol=1e-5)
        np.testing.assert_allclose(y, x @ w1 @ w2, rtol=1e-5)


def test_calibration_needs_are_checked_only_where_the_graph_runs(tmp_path: Path) -> None:
    """Issue 50: the family's calibration_needs (a Base Qwen3-TTS's ref_audio) refuse int4_awq
    without --calibration, accept a file that sets them at the top level or per request, and
    do not apply where the calibration does not run the graph (a CUDA build rounds plainly)."""
    from edgeomni.builder.errors import BuildError
    from edgeomni.export.common.checkpoint import open_checkpoint
    from edgeomni.export.families.qwen3_tts import build as hooks
    from edgeomni.export.tiny_tts import make_checkpoint

    ckpt = open_checkpoint(make_checkpoint(tmp_path / "ckpt", "base", "tiny"))
    selected = hooks.components(ckpt)
    cpu = BuildArgs(**ARGS, quantization="int4_awq")
    with pytest.raises(BuildError, match="each request needs ref_audio"):
        awq_graph.check_requests(hooks, ckpt, selected, cpu)
    clip = tmp_path / "ref.wav"
    clip.write_bytes(b"RIFF")  # read when a request runs, not when the file is checked
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"ref_audio": str(clip), "requests": [
        {"prompt": "one"}, {"prompt": "two", "ref_audio": str(clip), "ref_text": "x"}]}))  # fmt: skip
    awq_graph.check_requests(hooks, ckpt, selected, BuildArgs(**ARGS, quantization="int4_awq",
                                                              calibration=str(good)))  # fmt: skip
    cuda = BuildArgs(**ARGS, quantization="int4_awq", device="cuda")
    awq_graph.check_requests(hooks, ckpt, selected, cuda)  # rounded plainly there: no requests
    code2wav_only = [c for c in selected if c.name == "code2wav"]
    awq_graph.check_requests(hooks, ckpt, code2wav_only, cpu)
    voice = open_checkpoint(make_checkpoint(tmp_path / "cv", "custom_voice", "tiny"))
    awq_graph.check_requests(hooks, voice, hooks.components(voice), cpu)
