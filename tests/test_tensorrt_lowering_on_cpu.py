"""The TensorRT lowering of whole decoders, run on ONNX Runtime's CPU provider.

TensorRT cannot run here, but the graph it would be given can: the tiny Qwen3 built with its
plugin ops lowered for TensorRT (attention as ONNX TensorScatter + Attention with an in-graph
length mask, rotary as ONNX RotaryEmbedding) and then run by ONNX Runtime's own opset-23/24
kernels, through the runtime's real calls (a right-padded cohort prefill, decode, rows of different lengths and
idle rows, in flight), gives the same tokens as the ONNX Runtime build. What TensorRT itself does
with that graph (parse, build, run) is for the machines that have it (issue 19).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from export_store import ExportStore

PROMPTS = ["Hello! How are you today?", "Hi", "What is the capital of France?",
           "Tell me a story about a fox.", "Count to ten."]  # fmt: skip


def tensorrt_lowered_build(
    ckpt: Path, out: Path, monkeypatch: pytest.MonkeyPatch, exports: ExportStore, **quant: object
) -> Path:
    """An ONNX Runtime CPU build whose plugin ops are lowered as for TensorRT. The raw exports
    are the session engine's (the lowering, the subject here, comes after them)."""
    import edgeomni.plugins as plugins
    from edgeomni.builder.tensorrt import LOWERING
    from edgeomni.export.family import BuildArgs

    lower = plugins.lower_model
    with monkeypatch.context() as m:
        m.setattr(plugins, "lower_model", lambda model, backend, options=None, base_dir=None:
                  lower(model, "tensorrt", LOWERING, base_dir))  # fmt: skip
        assert exports.build(ckpt, out, BuildArgs(max_batch_size=3, max_input_len=64,
                                                  max_kv_cache_capacity=128, **quant))  # fmt: skip
    return out


def run(engine: Path, body: dict, batch: int) -> list:
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    requests, _ = parse_request_file(body)
    return Pipeline(engine).run(requests, batch_size=batch)


def assert_same_tokens(engine: Path, reference: Path, body: dict) -> None:
    """Every request answered on ``engine``, with ``reference``'s llm tokens (not none)."""
    for a, b in zip(run(engine, body, 3), run(reference, body, 3), strict=True):
        assert a.entry["ok"], a.entry
        tokens = a.entry["stages"]["llm"]["output_tokens"]
        assert tokens == b.entry["stages"]["llm"]["output_tokens"] and len(tokens) > 0


def test_qwen3_tokens_equal_the_onnxruntime_build(
    qwen3_ckpt: Path, qwen3_engine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    exports: ExportStore,
) -> None:
    eng = tensorrt_lowered_build(qwen3_ckpt, tmp_path / "eng", monkeypatch, exports)
    model = onnx.load(str(eng / "llm.onnx"), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    layers = sum(op == "Attention" for op in ops)
    assert layers > 0 and ops.count("TensorScatter") == 2 * layers
    assert ops.count("RotaryEmbedding") == 2 * layers  # q and k, ONNX's own op
    # (ONNX Runtime's own optimiser has since fused norms into its contrib ops: that file is
    # an ONNX Runtime engine; the attention in it is still the TensorRT lowering's)
    assert "GroupQueryAttention" not in ops
    # 5 requests of different lengths on 3 rows: ragged prefill, rows joining and leaving
    body = {"top_k": 1, "max_generate_length": 12,
            "requests": [{"messages": [{"role": "user", "content": p}],
                          "max_generate_length": 6 + 2 * i} for i, p in enumerate(PROMPTS)]}  # fmt: skip
    assert_same_tokens(eng, qwen3_engine, body)


def test_omni_text_to_speech_equals_the_onnxruntime_build(
    omni_ckpt: Path, omni_engine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    exports: ExportStore,
) -> None:
    """Every component of the tiny Qwen3-Omni lowered for TensorRT (the thinker's and talker's
    MoE as dense plain ops, code2wav's windowed attention, the encoders' bidirectional one):
    the thinker's tokens, the codec frames and the audio equal the ONNX Runtime build's."""
    import numpy as np

    eng = tensorrt_lowered_build(omni_ckpt, tmp_path / "eng", monkeypatch, exports)
    for sub, name in ((".", "llm.onnx"), ("talker", "llm.onnx"), ("code2wav", "code2wav.onnx"),
                      ("audio", None), ("visual", None)):  # fmt: skip
        files = [eng / sub / name] if name else sorted((eng / sub).glob("*.onnx"))
        assert files, sub
        for f in files:
            ops = {n.op_type for n in onnx.load(str(f), load_external_data=False).graph.node}
            assert "GroupQueryAttention" not in ops and "MoE" not in ops, f
    body = {"max_generate_length": 8, "top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 13,
            "requests": [{"messages": [{"role": "user", "content": [{"type": "text", "text": p}]}]}
                         for p in PROMPTS[:3]]}  # fmt: skip
    ours, ref = run(eng, body, 3), run(omni_engine, body, 3)
    for a, b in zip(ours, ref, strict=True):
        assert a.entry["ok"], a.entry
        assert (a.entry["stages"]["thinker"]["output_tokens"]
                == b.entry["stages"]["thinker"]["output_tokens"])  # fmt: skip
        np.testing.assert_array_equal(a.codes, b.codes)
        np.testing.assert_allclose(a.audio, b.audio, atol=1e-5)


def test_asr_tokens_equal_the_onnxruntime_build(
    asr_ckpt: Path, asr_engine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    exports: ExportStore,
) -> None:
    """The tiny Qwen3-ASR lowered for TensorRT (the llm's attention and rotary as ONNX ops, the
    audio encoder's windowed bidirectional attention): clips of 1.5 and 2.5 s (two attention
    windows) batched with a text request give the ONNX Runtime build's tokens."""
    import numpy as np

    from edgeomni.runtime.audio import write_wav

    eng = tensorrt_lowered_build(asr_ckpt, tmp_path / "eng", monkeypatch, exports)
    for f in (eng / "llm.onnx", eng / "audio" / "audio_encoder.onnx"):
        ops = {n.op_type for n in onnx.load(str(f), load_external_data=False).graph.node}
        assert "Attention" in ops and "GroupQueryAttention" not in ops, f
    requests: list[dict] = [{"prompt": PROMPTS[0]}]
    for seconds in (1.5, 2.5):
        wav = tmp_path / f"{seconds}.wav"
        t = np.arange(int(16000 * seconds)) / 16000
        write_wav(wav, (0.3 * np.sin(2 * np.pi * 300 * t * (1 + t))).astype(np.float32), 16000)
        requests.append({"messages": [{"role": "user", "content": [{"type": "audio",
                                                                   "audio": str(wav)}]}]})
    body = {"top_k": 1, "max_generate_length": 10, "requests": requests}
    assert_same_tokens(eng, asr_engine, body)


def test_int4_qwen3_tokens_equal_the_onnxruntime_int4_build(
    qwen3_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exports: ExportStore
) -> None:
    """int4 through the TensorRT lowering (a signed INT4 weight, DequantizeLinear blocked on
    the input axis, MatMul) gives the ONNX Runtime int4 build's tokens: the same codes and
    scales, re-laid. (ONNX Runtime's optimiser then fuses each DequantizeLinear + MatMul back
    into MatMulNBits; TensorRT builds the pattern as its INT4 weight-only GEMM.)"""
    import edgeomni.plugins as plugins
    from edgeomni.builder.tensorrt import LOWERING
    from edgeomni.export.family import BuildArgs

    args = BuildArgs(max_batch_size=3, max_input_len=64, max_kv_cache_capacity=128,
                     quantization="int4_rtn")  # fmt: skip
    lower, lowered = plugins.lower_model, []

    def as_tensorrt(model, backend, options=None, base_dir=None):  # noqa: ANN001, ANN202
        lowered.append(lower(model, "tensorrt", LOWERING, base_dir))
        return lowered[-1]

    with monkeypatch.context() as m:
        m.setattr(plugins, "lower_model", as_tensorrt)
        assert exports.build(qwen3_ckpt, tmp_path / "trt", args)
    ops = [n.op_type for n in lowered[-1].graph.node]
    int4 = [t for t in lowered[-1].graph.initializer if t.data_type == onnx.TensorProto.INT4]
    assert ops.count("DequantizeLinear") == len(int4) > 0 and "QuantMatMul" not in ops
    assert exports.build(qwen3_ckpt, tmp_path / "ort", args)
    body = {"temperature": 0, "max_generate_length": 12,
            "requests": [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS]}  # fmt: skip
    tokens = [[o.entry["stages"]["llm"]["output_tokens"] for o in run(tmp_path / e, body, 3)]
              for e in ("trt", "ort")]  # fmt: skip
    assert tokens[0] == tokens[1] and all(tokens[0])


def test_vl_tokens_equal_the_onnxruntime_build(
    vl_ckpt: Path, vl_engine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    exports: ExportStore,
) -> None:
    """The tiny Qwen3-VL lowered for TensorRT (the llm's cached attention, the ViT's
    bidirectional one): an image, a video and text in one batch give the ONNX Runtime build's
    tokens."""
    import numpy as np
    from PIL import Image

    eng = tensorrt_lowered_build(vl_ckpt, tmp_path / "eng", monkeypatch, exports)
    for f in (eng / "llm.onnx", eng / "visual" / "visual.onnx"):
        ops = {n.op_type for n in onnx.load(str(f), load_external_data=False).graph.node}
        assert "Attention" in ops and "GroupQueryAttention" not in ops, f
    rng = np.random.default_rng(6)
    Image.fromarray((rng.random((64, 96, 3)) * 255).astype(np.uint8)).save(tmp_path / "i.png")
    frames = []
    for i in range(4):
        Image.fromarray((rng.random((40, 60, 3)) * 255).astype(np.uint8)).save(tmp_path / f"{i}.png")
        frames.append(str(tmp_path / f"{i}.png"))
    contents = [[{"type": "image", "image": str(tmp_path / "i.png")}],
                [{"type": "video", "video": frames, "fps": 1}], []]  # fmt: skip
    body = {"top_k": 1, "max_generate_length": 8, "requests": [
        {"messages": [{"role": "user", "content": [*c, {"type": "text", "text": p}]}]}
        for c, p in zip(contents, PROMPTS, strict=False)]}  # fmt: skip
    ours, ref = run(eng, body, 3), run(vl_engine, body, 3)
    for a, b in zip(ours, ref, strict=True):
        assert a.entry["ok"], a.entry
        tokens = a.entry["stages"]["llm"]["output_tokens"]
        assert tokens == b.entry["stages"]["llm"]["output_tokens"] and len(tokens) > 0
