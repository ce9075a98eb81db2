"""The GPU build's engines, run on the CPU provider: same tokens and codes as the CPU build.

A ``--device cuda`` build lowers attention for the GPU (GroupQueryAttention's lengths fed by the
host; for onnxruntime-gpu before 1.32, no per-row query lengths, so prefill goes row by row) and
reduces logits to a top-K in the graph. Those engines are provider-neutral, so CI runs them here
with the device switched to cpu in their config: everything of the GPU path but device memory and
CUDA graphs (tests/test_gpu.py covers those on a GPU). A float32 build gets plain-op attention
(what float32 engines run on the CUDA provider); the LLM test lowers as a float16 build does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgeomni.plugins import lowering

ONNXRUNTIME_GPU = "1.31.1"  # the newest onnxruntime-gpu on PyPI as of this writing


def gpu_build_on_cpu(
    ckpt: Path, out: Path, monkeypatch, components=None, gqa: bool = False
) -> Path:
    """A float32 ``--device cuda`` build (exact against the CPU build). Its attention is plain
    ops, as every float32 engine's on the CUDA provider; ``gqa`` lowers it as a float16 build's
    (GroupQueryAttention with host-fed lengths) instead."""
    from edgeomni.builder import onnxruntime as ort_builder
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    with monkeypatch.context() as m:  # lower as for the onnxruntime-gpu we deploy on
        m.setattr(lowering, "onnxruntime_options", lambda v=None: {
            "gqa_query_seqlens": False, "onnxruntime": ONNXRUNTIME_GPU})  # fmt: skip
        if gqa:
            lowered = ort_builder.cuda_lowering
            m.setattr(ort_builder, "cuda_lowering",
                      lambda model: {**lowered(model), "plain_attention": False})  # fmt: skip
        assert build(ckpt, out, BuildArgs(3, 128, 256, device="cuda"), components)
    for cfg_path in out.rglob("config.json"):
        cfg = json.loads(cfg_path.read_text())
        if cfg.get("device") == "cuda":
            cfg["device"] = "cpu"
            cfg_path.write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def mp():
    with pytest.MonkeyPatch.context() as m:
        yield m


def run(engine: Path, body: dict, batch: int) -> list:
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    requests, _ = parse_request_file(body)
    return Pipeline(engine).run(requests, batch_size=batch)


PROMPTS = ["Hello! How are you today?", "Hi", "What is the capital of France?"]


def test_llm(qwen3_ckpt, qwen3_engine, tmp_path, mp) -> None:
    eng = gpu_build_on_cpu(qwen3_ckpt, tmp_path / "eng", mp, gqa=True)
    cfg = json.loads((eng / "config.json").read_text())
    assert cfg["lowering"]["gqa_query_seqlens"] is False  # prefill goes row by row
    model = onnx.load(str(eng / "llm.onnx"))
    assert "gqa_seqlens_k" in [i.name for i in model.graph.input]
    # rotary in one node per q and k; each layer's two residual Adds (and the final norm's)
    # inside SkipSimplifiedLayerNormalization
    layers = json.loads((qwen3_ckpt / "config.json").read_text())["num_hidden_layers"]
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("RotaryEmbedding") == 2 * layers
    assert ops.count("SkipSimplifiedLayerNormalization") == cfg["lowering"]["fused_residual_norms"]
    assert cfg["lowering"]["fused_residual_norms"] == 2 * layers
    body = {"temperature": 0.7, "top_k": 10, "seed": 4, "max_generate_length": 12,
            "requests": [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS]}  # fmt: skip
    ours, ref = run(eng, body, 3), run(qwen3_engine, body, 3)
    for a, b in zip(ours, ref, strict=True):
        assert (
            a.entry["stages"]["llm"]["output_tokens"] == b.entry["stages"]["llm"]["output_tokens"]
        )


def test_omni_text_to_speech(omni_ckpt, omni_engine, tmp_path, mp) -> None:
    eng = gpu_build_on_cpu(omni_ckpt, tmp_path / "eng", mp,
                           ["llm", "talker", "code_predictor", "code2wav"])  # fmt: skip
    # float32 engines get plain-op attention (no float32 GroupQueryAttention kernel on the CUDA
    # provider): the decoders with their caches, and code2wav's sliding window
    for sub, engine in ((".", "llm.onnx"), ("talker", "llm.onnx"), ("code2wav", "code2wav.onnx")):
        assert json.loads((eng / sub / "config.json").read_text())["lowering"]["plain_attention"]
        model = onnx.load(str(eng / sub / engine), load_external_data=False)
        assert not any(n.op_type == "GroupQueryAttention" for n in model.graph.node)
    body = {"max_generate_length": 8, "top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 13,
            "requests": [{"messages": [{"role": "user", "content": [{"type": "text", "text": p}]}]}
                         for p in PROMPTS]}  # fmt: skip
    ours, ref = run(eng, body, 3), run(omni_engine, body, 3)
    for a, b in zip(ours, ref, strict=True):
        assert a.entry["ok"], a.entry
        assert (
            a.entry["stages"]["thinker"]["output_tokens"]
            == (b.entry["stages"]["thinker"]["output_tokens"])
        )
        np.testing.assert_array_equal(a.codes, b.codes)
        np.testing.assert_allclose(a.audio, b.audio, atol=1e-5)
