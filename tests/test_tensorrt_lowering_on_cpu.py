"""The TensorRT lowering of whole decoders, run on ONNX Runtime's CPU provider.

TensorRT cannot run here, but the graph it would be given can: the tiny Qwen3 built with its
plugin ops lowered for TensorRT (attention as ONNX TensorScatter + Attention with an in-graph
length mask, rotary as plain ops) and then run by ONNX Runtime's own opset-23/24 kernels, through
the runtime's real calls (a right-padded cohort prefill, decode, rows of different lengths and
idle rows, in flight), gives the same tokens as the ONNX Runtime build. What TensorRT itself does
with that graph (parse, build, run) is for the machines that have it (issue 19).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

PROMPTS = ["Hello! How are you today?", "Hi", "What is the capital of France?",
           "Tell me a story about a fox.", "Count to ten."]  # fmt: skip


def tensorrt_lowered_build(ckpt: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ONNX Runtime CPU build whose plugin ops are lowered as for TensorRT."""
    import edgeomni.plugins as plugins
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    lower = plugins.lower_model
    with monkeypatch.context() as m:
        m.setattr(plugins, "lower_model", lambda model, backend, options=None:
                  lower(model, "tensorrt"))  # fmt: skip
        assert build(ckpt, out, BuildArgs(max_batch_size=3, max_input_len=64,
                                          max_kv_cache_capacity=128))  # fmt: skip
    return out


def run(engine: Path, body: dict, batch: int) -> list:
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    requests, _ = parse_request_file(body)
    return Pipeline(engine).run(requests, batch_size=batch)


def test_qwen3_tokens_equal_the_onnxruntime_build(
    qwen3_ckpt: Path, qwen3_engine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = tensorrt_lowered_build(qwen3_ckpt, tmp_path / "eng", monkeypatch)
    model = onnx.load(str(eng / "llm.onnx"), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    layers = sum(op == "Attention" for op in ops)
    assert layers > 0 and ops.count("TensorScatter") == 2 * layers
    # (ONNX Runtime's own optimiser has since fused norms into its contrib ops: that file is
    # an ONNX Runtime engine; the attention in it is still the TensorRT lowering's)
    assert "GroupQueryAttention" not in ops
    # 5 requests of different lengths on 3 rows: ragged prefill, rows joining and leaving
    body = {"top_k": 1, "max_generate_length": 12,
            "requests": [{"messages": [{"role": "user", "content": p}],
                          "max_generate_length": 6 + 2 * i} for i, p in enumerate(PROMPTS)]}  # fmt: skip
    ours, ref = run(eng, body, 3), run(qwen3_engine, body, 3)
    for a, b in zip(ours, ref, strict=True):
        assert a.entry["ok"], a.entry
        tokens = a.entry["stages"]["llm"]["output_tokens"]
        assert tokens == b.entry["stages"]["llm"]["output_tokens"] and len(tokens) > 0
