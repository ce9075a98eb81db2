"""Issue 54: Qwen3-TTS Base's clone encoders with a context cache attached encode the same
reference audio, hashed, once: a later request with that clip reads the stored x-vector and
reference codes (the stage reports ``cached``), and makes the same codes and audio as a run
without the cache; another clip is encoded anew."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from edgeomni.graph_schema.model import Input, Stage
from edgeomni.runtime.audio import write_wav
from edgeomni.runtime.context_cache import ContextCache, build_identity
from edgeomni.runtime.engine import Engines
from edgeomni.runtime.families.qwen3_tts.clone import SpeechEncoder
from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.requests import parse_request_file
from edgeomni.runtime.stage import RequestState

ENCODERS = ("speaker_encoder", "speech_tokenizer_encoder")
RATE = 24000
FRAME = 1920  # samples of one 12 Hz codec frame
GREEDY = {"talker_do_sample": 0, "subtalker_dosample": 0, "talker_max_new_tokens": 4}


def clip(path: Path, frames: int, seed: int) -> str:
    """A reference clip of ``frames`` codec frames at 24 kHz (a tone under noise)."""
    t = np.arange(frames * FRAME) / RATE
    noise = np.random.default_rng(seed).standard_normal(t.size)
    write_wav(path, (0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * noise).astype(np.float32), RATE)
    return str(path)


def request(ref_audio: str) -> dict[str, Any]:
    return {"messages": [{"role": "assistant", "content": "Hello there."}],
            "language": "English", "ref_audio": ref_audio, "ref_text": "Hi."}  # fmt: skip


def run(pipe: Pipeline, clips: list[str]) -> list[Any]:
    parsed, _ = parse_request_file({**GREEDY, "requests": [request(c) for c in clips]})
    outs = pipe.run(parsed, batch_size=1)
    for out in outs:
        assert out.entry["ok"], out.entry["error"]
    return outs


def encoders_cached(engine: Path) -> tuple[Pipeline, ContextCache]:
    """A pipeline whose encoder stages alone use a cache: what they give is all that differs
    from a run without one."""
    pipe, cache = Pipeline(engine, context_cache_mb=0), ContextCache(64 << 20)
    for sid in ENCODERS:
        pipe.runner(sid).use_context_cache(cache)
    return pipe, cache


def test_same_clip_is_encoded_once_and_changes_nothing(tts_base_engine: Path,
                                                       tmp_path: Path) -> None:  # fmt: skip
    ref = clip(tmp_path / "ref.wav", 8, seed=1)
    plain = run(Pipeline(tts_base_engine, context_cache_mb=0), [ref, ref])
    pipe, cache = encoders_cached(tts_base_engine)
    outs = run(pipe, [ref, ref])
    for sid in ENCODERS:
        assert [o.entry["stages"][sid]["cached"] for o in outs] == [False, True]
        assert [o.entry["stages"][sid]["cached"] for o in plain] == [False, False]
        assert "encode_ms" in outs[1].entry["stages"][sid]
        stats = cache.parts[sid].stats
        assert (stats.lookups, stats.hits, stats.stored) == (2, 1, 1)
    for got, want in zip(outs, plain, strict=True):
        np.testing.assert_array_equal(got.codes, want.codes)
        np.testing.assert_array_equal(got.audio, want.audio)


def test_another_clip_is_not_a_hit(tts_base_engine: Path, tmp_path: Path) -> None:
    """Through the pipeline's own cache (Pipeline attaches it to the encoders as they open)."""
    pipe = Pipeline(tts_base_engine, context_cache_mb=64)
    one, two = clip(tmp_path / "one.wav", 8, seed=1), clip(tmp_path / "two.wav", 8, seed=2)
    outs = run(pipe, [one, two, one])
    assert pipe.context_cache is not None
    for sid in ENCODERS:
        assert [o.entry["stages"][sid]["cached"] for o in outs] == [False, False, True]
        stats = pipe.context_cache.parts[sid].stats
        assert (stats.lookups, stats.hits, stats.stored) == (3, 1, 2)


# --- the runner alone, on an engine that counts its calls (no build) ---


class CountingEngines(Engines):
    """Opens a fake speech-encoder engine: its codes are a function of the clip, its calls
    counted in ``calls``."""

    calls: list[int] = []

    def open(self, folder: Path, config: Any, *, spin: bool | None = None,
             replay: bool = True) -> Any:  # fmt: skip
        calls = self.calls

        class Binding:
            def bind_output(self, name: str, array: np.ndarray) -> None:
                self.out = array

            def run(self, feeds: dict[str, np.ndarray], **_: Any) -> None:
                calls.append(1)
                wav = feeds["wav"][0]
                frames = np.resize(wav, self.out.shape[1] * FRAME).reshape(-1, FRAME)
                self.out[0] = (np.abs(frames).sum(axis=1, keepdims=True) * 1000).astype(np.int64)

        class Engine:
            def binding(self) -> Binding:
                return Binding()

        return Engine()


@pytest.fixture
def encoder(tmp_path: Path) -> SpeechEncoder:
    """A SpeechEncoder over a folder whose engine file is a real (empty-graph) ONNX model."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph), tmp_path / "model.onnx")
    config = {"engine": "model.onnx", "backend": "onnxruntime", "sample_rate": RATE,
              "samples_per_frame": FRAME, "num_quantizers": 16}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    stage = Stage("speech_tokenizer_encoder", "qwen3_tts.speech_encoder", "enc", "iterative",
                  inputs=(Input("ref_audio", "request:ref_audio"),))  # fmt: skip
    CountingEngines.calls = []
    return SpeechEncoder(stage, tmp_path, engines=CountingEngines())


def encode(runner: SpeechEncoder, wav: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    state = RequestState(0, request=cast(Any, None), plan=cast(Any, None))
    state.prepared[runner.stage.id] = wav
    runner.encode_request(state)
    out = cast(np.ndarray, state.outputs[f"{runner.stage.id}:codes"])
    return out, state.details[runner.stage.id]


def test_runner_hit_is_a_copy_of_the_first_encode(encoder: SpeechEncoder) -> None:
    wav = np.random.default_rng(0).standard_normal(3 * FRAME + 7).astype(np.float32)
    plain, report = encode(encoder, wav)
    assert report["cached"] is False
    encoder.use_context_cache(ContextCache(1 << 20))
    first, report = encode(encoder, wav)
    assert report["cached"] is False and len(CountingEngines.calls) == 2
    first[:] = -1  # a request changing its output changes no entry
    again, report = encode(encoder, wav.copy())
    assert report["cached"] is True and len(CountingEngines.calls) == 2
    np.testing.assert_array_equal(again, plain)
    assert again.shape == (4, 16) and again.dtype == np.int64
    _, report = encode(encoder, wav[:-1])  # one sample shorter: another clip
    assert report["cached"] is False and len(CountingEngines.calls) == 3
    _, report = encode(encoder, wav.astype(np.float64))  # the same values, another dtype
    assert report["cached"] is False
    assert encoder.cache is not None
    assert (encoder.cache.stats.lookups, encoder.cache.stats.hits) == (4, 1)


def test_identity_changes_with_the_engine_file(encoder: SpeechEncoder) -> None:
    """build_identity, which every stage's part of the cache is keyed by: a rebuilt engine
    (its file touched) or another config gets keys of its own."""
    folder, config = encoder.folder, dict(encoder.config)
    before = build_identity(folder, config)
    assert build_identity(folder, config) == before
    engine = folder / "model.onnx"
    stat = engine.stat()
    os.utime(engine, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    touched = build_identity(folder, config)
    assert touched != before
    assert build_identity(folder, {**config, "num_quantizers": 8}) != touched
    cache = ContextCache(1 << 20)
    assert cache.part("enc", before).seed != cache.part("enc", touched).seed
