"""The CUDA path: engines on ONNX Runtime's CUDA provider, KV caches in device memory.

Skipped, with the reason, where no CUDA provider or GPU is present (every CI machine); run on
the GPU machine with ``pytest -m gpu``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeomni.runtime import cli


def _cuda_reason() -> str | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "onnxruntime has no CUDAExecutionProvider here (needs onnxruntime-gpu and a GPU)"
    try:
        from edgeomni.runtime.memory import DeviceArray

        DeviceArray.zeros((1,), np.float32)
    except Exception as e:  # no driver, no device, no cuda-python
        return f"no usable CUDA device: {e}"
    return None


REASON = _cuda_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


@pytest.fixture(scope="module")
def cuda_engine(qwen3_ckpt: Path, tmp_path_factory) -> Path:
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    eng = tmp_path_factory.mktemp("cuda") / "eng"
    args = BuildArgs(3, 64, 128, device="cuda", dtype="float16")
    assert build(qwen3_ckpt, eng, args) is not None
    return eng


def greedy(engine: Path, tmp: Path, prompts: list[str]) -> list[list[int]]:
    body = {"temperature": 0, "max_generate_length": 16,
            "requests": [{"messages": [{"role": "user", "content": p}]} for p in prompts]}  # fmt: skip
    (tmp / "r.json").write_text(json.dumps(body))
    code = cli.main(["--config", str(engine), "--input-file", str(tmp / "r.json"),
                     "--output-file", str(tmp / "p.json"), "--batch-size", "3"])  # fmt: skip
    assert code == cli.EXIT_OK
    entries = json.loads((tmp / "p.json").read_text())["responses"]
    return [e["stages"]["llm"]["output_tokens"] for e in entries]


def prefill_logits(engine: Path, prompt: str) -> np.ndarray:
    """The last-position logits of one prompt's prefill, through the runner's own pieces."""
    from edgeomni.runtime.decoder import DecoderSession, text_positions
    from edgeomni.runtime.pipeline import Pipeline

    runner = Pipeline(engine).runner("llm")
    ids = np.asarray(runner.tokenizer.encode(prompt), np.int64)[None]
    session = DecoderSession(runner.engine, runner.kv, 1, {"logits": (runner.vocab_size,)})
    zero, n = np.zeros(1, np.int32), np.array([ids.shape[1]], np.int32)
    out = session.run(
        runner.embedding[ids], text_positions(zero, ids.shape[1], False), zero, n, n - 1
    )
    return np.asarray(out["logits"][0], np.float32)


def test_cuda_engine_matches_cpu(cuda_engine, qwen3_engine, tmp_path) -> None:
    """float16 on the CUDA provider against float32 on the CPU: prefill logits within 1% of their
    range, and the same greedy tokens for every prompt."""
    prompts = ["Hello! How are you today?", "Hi", "What is the capital of France?"]
    for prompt in prompts:
        gpu, cpu = prefill_logits(cuda_engine, prompt), prefill_logits(qwen3_engine, prompt)
        assert np.abs(gpu - cpu).max() <= 1e-2 * np.abs(cpu).max(), prompt
        assert gpu.argmax() == cpu.argmax()
    for sub in ("g", "c"):
        (tmp_path / sub).mkdir()
    gpu_tokens = greedy(cuda_engine, tmp_path / "g", prompts)
    cpu_tokens = greedy(qwen3_engine, tmp_path / "c", prompts)
    assert gpu_tokens == cpu_tokens


def test_kv_cache_lives_on_the_device(cuda_engine) -> None:
    from edgeomni.runtime.memory import DeviceArray
    from edgeomni.runtime.pipeline import Pipeline

    runner = Pipeline(cuda_engine).runner("llm")
    assert runner.engine.device == "cuda"
    assert all(isinstance(k, DeviceArray) for k in runner.kv.keys + runner.kv.values)
    assert runner.kv.keys[0].dtype == np.float16
