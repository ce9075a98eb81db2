"""TensorRT builds and runs, where TensorRT or TensorRT-RTX imports (skipped elsewhere, saying so).

On the project's H200 (TensorRT-RTX 1.7) the builds run and the engines cannot: TensorRT-RTX
does not run on compute capability 9.0, and the run tests skip with its own message. On a GPU
where the engines load (an RTX card with TensorRT-RTX, a Jetson or data-center GPU with
TensorRT >= 10.15), the tiny models' greedy tokens and codes must equal the ONNX Runtime build's.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest

from edgeomni.builder.tensorrt import FLAVOURS


def _importable(backend: str) -> str | None:
    for name in FLAVOURS[backend].modules:
        try:
            importlib.import_module(name)
            return name
        except ImportError:
            continue
    return None


AVAILABLE = [b for b in FLAVOURS if _importable(b)]
pytestmark = [pytest.mark.tensorrt, pytest.mark.gpu, pytest.mark.skipif(
    not AVAILABLE,
    reason="neither tensorrt nor tensorrt_rtx imports here: TensorRT builds run on a GPU machine "
    "with one of them (docs/benchmarks.md: TensorRT-RTX builds on the H200)",
)]  # fmt: skip
BACKEND = AVAILABLE[0] if AVAILABLE else "tensorrt"
PROMPTS = ["Hello! How are you today?", "Hi", "What is the capital of France?"]


def build(ckpt: Path, out: Path, backend: str = BACKEND) -> Path:
    """A tiny build with TensorRT, or the ONNX Runtime CPU build it is compared with."""
    from edgeomni.builder.build import build as do_build
    from edgeomni.export.family import BuildArgs

    device = "cpu" if backend == "onnxruntime" else "cuda"
    args = BuildArgs(max_batch_size=3, max_input_len=64, max_kv_cache_capacity=256,
                     backend=backend, device=device)  # fmt: skip
    assert do_build(ckpt, out, args) is not None
    return out


@pytest.fixture(scope="module")
def qwen3_trt(qwen3_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(qwen3_ckpt, tmp_path_factory.mktemp("trt") / "eng")


def test_build_records_flavour_profiles_and_lowering(qwen3_trt: Path) -> None:
    cfg = json.loads((qwen3_trt / "config.json").read_text())
    assert cfg["backend"] == BACKEND and cfg["engine"] == "llm.engine"
    assert (qwen3_trt / "llm.engine").stat().st_size > 0
    assert (qwen3_trt / "timing.cache").is_file()
    trt = cfg["tensorrt"]
    assert trt["flavour"] == BACKEND and trt["version"]
    assert list(trt["profiles"]) == ["decode", "prefill"]
    assert trt["profiles"]["decode"]["inputs_embeds"][2][:2] == [3, 1]
    assert trt["profiles"]["prefill"]["past_key_0"][2][2] == 256  # the capacity, static
    assert cfg["lowering"]["attention"] == "native"
    assert cfg["lowering"]["decomposable_attention_nodes"] == 2  # the tiny Qwen3's two layers
    manifest = json.loads((qwen3_trt / "edgeomni_manifest.json").read_text())["files"]
    assert "llm.engine" in manifest and "llm.onnx" not in manifest


def test_graph_only_finds_tensorrt_engines(qwen3_ckpt: Path, qwen3_trt: Path) -> None:
    from edgeomni.builder.build import graph_only

    assert graph_only(qwen3_ckpt, qwen3_trt, raise_no_graph=True).is_file()


def _run(engine: Path, body: dict, batch: int) -> list:
    from edgeomni.runtime.engine import EngineError
    from edgeomni.runtime.pipeline import Pipeline, StageError
    from edgeomni.runtime.requests import parse_request_file

    requests, _ = parse_request_file(body)
    try:
        pipe = Pipeline(engine)
        return pipe.run(requests, batch_size=batch)
    except (EngineError, StageError) as e:
        if "cannot run on this GPU" in str(e) or "could not load" in str(e):
            pytest.skip(f"{BACKEND} builds here but cannot run its engines: {e}")
        raise


def test_qwen3_tokens_equal_the_onnxruntime_build(qwen3_trt: Path, qwen3_ckpt: Path,
                                                 tmp_path: Path) -> None:  # fmt: skip
    assert_qwen3_tokens_equal(qwen3_trt, build(qwen3_ckpt, tmp_path / "ort", "onnxruntime"))


def assert_qwen3_tokens_equal(engine: Path, ref: Path) -> None:
    """Greedy tokens of a TensorRT build against the ONNX Runtime build (skips where TensorRT
    builds but cannot run)."""
    body = {"top_k": 1, "max_generate_length": 10,
            "requests": [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS]}  # fmt: skip
    ours, theirs = _run(engine, body, 3), _run(ref, body, 3)
    for a, b in zip(ours, theirs, strict=True):
        assert a.entry["ok"], a.entry
        assert (
            a.entry["stages"]["llm"]["output_tokens"] == b.entry["stages"]["llm"]["output_tokens"]
        )


def test_every_omni_component_builds(omni_ckpt: Path, tmp_path: Path) -> None:
    """The thinker, its audio and visual encoders, the talker, the code predictor and code2wav:
    each parsed and built, with the profiles its family declares, recorded in its config.json;
    each later component's build starts from the earlier ones' timing caches."""
    from edgeomni.builder.build import build as do_build
    from edgeomni.export.family import BuildArgs

    args = BuildArgs(max_batch_size=3, max_input_len=64, max_kv_cache_capacity=256,
                     backend=BACKEND, device="cuda")  # fmt: skip
    assert do_build(omni_ckpt, tmp_path / "eng", args) is not None
    phases = {".": ["decode", "prefill"], "audio": ["clip"], "visual": ["images"],
              "talker": ["decode", "prefill"], "code_predictor": ["decode", "prefill"],
              "code2wav": ["window", "utterance"]}  # fmt: skip
    for sub, expected in phases.items():
        cfg = json.loads((tmp_path / "eng" / sub / "config.json").read_text())
        assert list(cfg["tensorrt"]["profiles"]) == expected, sub
        assert (tmp_path / "eng" / sub / cfg["engine"]).stat().st_size > 0, sub
        if sub != ".":  # the thinker is built first
            assert cfg["tensorrt"]["timing_caches_reused"] >= 1, sub
    code2wav = json.loads((tmp_path / "eng" / "code2wav" / "config.json").read_text())
    assert code2wav["lowering"]["conv1d_as_conv2d"] > 0  # without, TensorRT-RTX 1.7.1 fails it


def test_a_rebuild_starts_from_the_engine_dir_it_replaces(qwen3_ckpt: Path, tmp_path: Path) -> None:
    first = json.loads((build(qwen3_ckpt, tmp_path / "eng") / "config.json").read_text())
    assert first["tensorrt"]["timing_caches_reused"] == 0
    again = json.loads((build(qwen3_ckpt, tmp_path / "eng") / "config.json").read_text())
    assert again["tensorrt"]["timing_caches_reused"] == 1


def test_omni_codes_equal_the_onnxruntime_build(omni_ckpt: Path, tmp_path: Path) -> None:
    trt = build(omni_ckpt, tmp_path / "trt")
    ort = build(omni_ckpt, tmp_path / "ort", "onnxruntime")
    body = {"max_generate_length": 8, "top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 13,
            "requests": [{"messages": [{"role": "user", "content": p}]} for p in PROMPTS]}  # fmt: skip
    ours, theirs = _run(trt, body, 3), _run(ort, body, 3)
    for a, b in zip(ours, theirs, strict=True):
        assert a.entry["ok"], a.entry
        np.testing.assert_array_equal(a.codes, b.codes)
        np.testing.assert_allclose(a.audio, b.audio, atol=2e-3)
