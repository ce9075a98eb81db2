"""OrtBinding's run options: every run names its CUDA graph (-1: none), and a queued run asks
ONNX Runtime not to synchronise its providers at the end; and which feeds a DecoderSession call
must copy because they share memory with its output buffers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from edgeomni.runtime.engine import OrtBinding  # noqa: E402


class _Session:
    def __init__(self) -> None:
        self.options: list[Any] = []

    def io_binding(self) -> Any:
        class _IO:
            def bind_cpu_input(self, name: str, array: np.ndarray) -> None:
                pass

        return _IO()

    def run_with_iobinding(self, io: Any, options: Any = None) -> None:
        self.options.append(options)


def _entry(options: Any, key: str) -> str | None:
    try:
        return options.get_run_config_entry(key) or None
    except RuntimeError:  # onnxruntime raises for a key never set
        return None


@pytest.mark.parametrize("graphs", [False, True])
def test_runs_name_their_graph_and_queued_runs_skip_the_final_sync(graphs: bool) -> None:
    session = _Session()
    binding = OrtBinding(session, cuda_graphs=graphs)
    binding.run({"x": np.zeros(1)})
    binding.run({}, graph=3)
    binding.run({}, graph=3, wait=False)
    plain, graphed, queued = session.options
    # a missing gpu_graph_id makes onnxruntime's Python wrapper raise and catch an exception on
    # every run (50 us, against 2.5 us): it is always set
    assert _entry(plain, "gpu_graph_id") == "-1"
    assert _entry(graphed, "gpu_graph_id") == ("3" if graphs else "-1")
    assert _entry(queued, "gpu_graph_id") == _entry(graphed, "gpu_graph_id")
    assert _entry(plain, "disable_synchronize_execution_providers") is None
    assert _entry(queued, "disable_synchronize_execution_providers") == "1"
    binding.run({})
    assert session.options[-1] is plain  # options are made once per kind of run


def test_a_feed_that_is_an_output_is_told_apart_from_a_fresh_one() -> None:
    """Buffers.overlaps: a call copies a feed that shares memory with its slot's output buffers
    (an earlier call's output fed back), and only then: host views of an output, the output
    itself, arrays over a foreign buffer that overlaps it; device buffers by address range."""
    from types import SimpleNamespace

    from edgeomni.runtime.buffers import DeviceBuffers, HostBuffers

    def _aliases(value: Any, outputs: dict) -> bool:
        memory = HostBuffers() if isinstance(value, np.ndarray) else DeviceBuffers()
        return memory.overlaps(value, outputs.values())

    logits, embeds = np.zeros((2, 8), np.float32), np.zeros((2, 4), np.float16)
    outputs = {"logits": logits, "sampled_embeds": embeds}
    assert _aliases(embeds, outputs)
    assert _aliases(embeds[:, None, :], outputs)  # the view the runtime feeds back
    assert _aliases(embeds[1:].reshape(1, 1, 4), outputs)
    assert not _aliases(embeds.copy(), outputs)
    assert not _aliases(np.zeros((2, 1, 4), np.float16), outputs)
    over = np.frombuffer(memoryview(logits).cast("B"), np.float32)  # not an ndarray base
    assert _aliases(over, outputs)
    assert not _aliases(np.frombuffer(bytearray(32), np.float32), outputs)

    def dev(ptr: int, nbytes: int) -> SimpleNamespace:
        return SimpleNamespace(ptr=ptr, nbytes=nbytes)

    device = {"sampled_embeds": dev(1000, 64), "logits": dev(4096, 256)}
    assert _aliases(dev(1000, 64), device) and _aliases(dev(1032, 16), device)
    assert not _aliases(dev(1064, 64), device) and not _aliases(dev(0, 1000), device)
    assert not DeviceBuffers().overlaps(embeds, device.values())  # a host array never does


@pytest.mark.parametrize(("config", "want"), [({}, "0"), ({"tf32": True}, "1")])
def test_cuda_sessions_run_exact_float32_unless_the_engine_allows_tf32(
    monkeypatch, tmp_path, config, want
) -> None:
    """The CUDA provider's default runs float32 products on TF32 tensor cores; an engine runs
    exact float32 unless its config.json says ``"tf32": true`` (the vocoders' do)."""
    from edgeomni.runtime import engine as eng

    seen: dict[str, Any] = {}

    class _Fake:
        def __init__(self, path: str, options: Any, providers: list[Any]) -> None:
            seen.update(dict(p for p in providers if isinstance(p, tuple)))

        def disable_fallback(self) -> None:
            pass

        def get_providers(self) -> list[str]:
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    monkeypatch.setattr(ort, "InferenceSession", _Fake)
    monkeypatch.setattr(eng.memory, "stream", lambda index, lane=0: 100 + lane)
    eng._session(tmp_path / "m.onnx", "cuda", 0, None, False, tf32=bool(config.get("tf32")))
    assert seen["CUDAExecutionProvider"]["use_tf32"] == want
    assert seen["CUDAExecutionProvider"]["user_compute_stream"] == "100"
    # a stage beside the loop (the vocoder on its own thread) runs on its lane's stream
    eng._session(tmp_path / "m.onnx", "cuda", 0, None, False, lane=eng.memory.BESIDE)
    assert seen["CUDAExecutionProvider"]["user_compute_stream"] == str(100 + eng.memory.BESIDE)


def test_the_vocoders_allow_tf32_and_the_decoders_do_not(omni_engine, tts_engine) -> None:
    """What edge-build writes: code2wav's config allows TF32 (its audio stays within its
    tolerance of float32 on the GPU, tests/test_gpu.py); the decoders' do not."""
    import json

    for root in (omni_engine, tts_engine):
        configs = {json.loads(p.read_text())["component"]: json.loads(p.read_text())
                   for p in root.rglob("config.json")}  # fmt: skip
        assert configs["code2wav"]["tf32"] is True
        assert not any(configs[c].get("tf32") for c in ("talker", "code_predictor"))


def test_only_the_fused_engine_captures_sequences_of_calls(tts_engine) -> None:
    """Engine.sequence_graph (a code predictor's frame as one graph) is the fused backend's:
    an ONNX Runtime engine says so (captures_sequences False) and refuses the call by name, so
    a stage that asked anyway would learn why rather than run uncaptured."""
    import json

    from edgeomni.runtime.engine import EngineError, open_engine

    folder = tts_engine / "code_predictor"
    engine = open_engine(folder, json.loads((folder / "config.json").read_text()))
    assert engine.captures_sequences is False
    assert engine.new_graph_id() is None  # a CPU engine captures no call: no graph id to run
    with pytest.raises(EngineError, match="ONNX Runtime engines run calls one at a time"):
        engine.sequence_graph(lambda: None)
