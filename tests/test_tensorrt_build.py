"""edge-build --backend tensorrt / tensorrt-rtx: what can be checked without TensorRT.

The flags and the module checks (missing, too old) are checked here through edge-build itself.
The optimisation profiles come from each family's ``dim_ranges``; a TensorRT engine refuses any
call outside them, so the runtime's real calls (a tiny Qwen3-Omni with audio and an image in,
speech out, windowed and whole-utterance; the tiny Qwen3-TTS) are recorded on ONNX Runtime and
each must fit one of its component's phases. TensorRT's own parse and build run where it imports
(tests/test_tensorrt_engine.py; on the H200 with TensorRT-RTX, docs/benchmarks.md).
"""

from __future__ import annotations

import sys
import types
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import pytest
from export_store import ExportStore

from edgeomni.builder import cli
from edgeomni.builder import tensorrt as trt_builder


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("backend,module", [("tensorrt", "tensorrt"),
                                            ("tensorrt-rtx", "tensorrt_rtx")])  # fmt: skip
def test_missing_module_is_a_bad_input_that_says_what_to_install(
    qwen3_ckpt: Path, tmp_path: Path, capsys, monkeypatch, backend: str, module: str
) -> None:
    for name in trt_builder.FLAVOURS[backend].modules:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    code, err = run_cli(capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir",
                        str(tmp_path / "e"), "--backend", backend)  # fmt: skip
    assert code == cli.EXIT_BAD_INPUT
    assert f"--backend {backend} needs" in err and module in err and "install" in err
    assert not (tmp_path / "e").exists()


def test_too_old_tensorrt_is_refused_naming_the_version_it_needs(
    qwen3_ckpt: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    """TensorRT 10.13 (JetPack 7.0) has no native attention (10.15)."""
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="10.13.3.9"))
    code, err = run_cli(capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir",
                        str(tmp_path / "e"), "--backend", "tensorrt")  # fmt: skip
    assert code == cli.EXIT_BAD_INPUT
    assert "TensorRT 10.13.3.9 is older than 10.15" in err and "JetPack 7.2 has 10.16" in err


@pytest.mark.parametrize("backend,version,ok", [
    ("tensorrt", "10.16.1.11", True), ("tensorrt", "10.15.0", True), ("tensorrt", "11.0.0", True),
    ("tensorrt", "10.13.3.9", False), ("tensorrt-rtx", "1.7.1.116", True),
    ("tensorrt-rtx", "1.6.0", False),
])  # fmt: skip
def test_attention_lowering_by_version(backend: str, version: str, ok: bool) -> None:
    """Native Attention + TensorScatter, which the parsers of TensorRT >= 10.15 and TensorRT-RTX
    >= 1.7 read; older versions are refused."""
    assert trt_builder.FLAVOURS[backend].supports(version) is ok


def test_tensorrt_on_the_cpu_is_refused(qwen3_ckpt: Path, tmp_path: Path, capsys) -> None:
    code, err = run_cli(capsys, "--model-dir", str(qwen3_ckpt), "--engine-dir",
                        str(tmp_path / "e"), "--backend", "tensorrt-rtx", "--device", "cpu")  # fmt: skip
    assert code == cli.EXIT_BAD_INPUT
    assert "--backend tensorrt-rtx builds engines for a GPU: use --device cuda" in err


def test_version_tuple() -> None:
    assert trt_builder.version_tuple("10.16.1.11") == (10, 16, 1)
    assert trt_builder.version_tuple("1.7.1.116") == (1, 7, 1)
    assert trt_builder.version_tuple("11.0.0rc1") == (11, 0, 0)


def _model(dims: dict[str, list]) -> onnx.ModelProto:
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in dims.items()]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, "capacity", 4])
    node = helper.make_node("Identity", ["past_key_0"], ["y"])
    return helper.make_model(helper.make_graph([node], "g", inputs, [out]))


def test_profiles_follow_the_ranges_and_fixed_dims_become_static() -> None:
    from edgeomni.export.common.shapes import decoder_ranges

    model = _model(
        {"inputs_embeds": ["batch", "seq", 8], "past_key_0": ["batch", 2, "capacity", 4]}
    )
    ranges = decoder_ranges(batch=4, prefill_len=32, capacity=64)
    profiles = trt_builder.input_profiles(model, ranges)
    assert list(profiles) == ["decode", "prefill"]  # the runtime takes the first that fits
    assert profiles["decode"]["inputs_embeds"] == ((1, 1, 8), (4, 1, 8), (4, 1, 8))
    assert profiles["prefill"]["inputs_embeds"] == ((1, 1, 8), (1, 32, 8), (4, 32, 8))
    assert profiles["prefill"]["past_key_0"] == ((1, 2, 64, 4), (1, 2, 64, 4), (4, 2, 64, 4))
    assert trt_builder.fix_static_dims(model, ranges) == ["capacity"]
    dims = [[d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
            for v in (model.graph.input[1], model.graph.output[0])]  # fmt: skip
    assert dims == [["batch", 2, 64, 4], ["batch", 2, 64, 4]]


def test_a_dim_without_a_range_is_named() -> None:
    from edgeomni.builder.errors import BuildError

    model = _model({"frames_in": ["batch", "frames"], "past_key_0": ["batch", 2, "capacity", 4]})
    with pytest.raises(BuildError, match=r"input 'frames_in', axis 1: 'frames' has no range in "
                       r"the family's 'decode' phase"):  # fmt: skip
        trt_builder.input_profiles(model, {"decode": {"batch": (1, 1, 2), "capacity": (4,) * 3}})


# ---------------------------------------------------------------------------------------------
# the runtime's calls fit the profiles the families declare
# ---------------------------------------------------------------------------------------------
def record_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[dict[str, tuple]]]:
    """Every engine call's input shapes (fed and bound), by engine file."""
    from edgeomni.runtime import engine as eng

    calls: dict[str, list[dict[str, tuple]]] = defaultdict(list)
    bound: dict[int, dict[str, tuple]] = defaultdict(dict)
    originals = {n: getattr(eng.OrtBinding, n) for n in ("bind_in_place", "bind_input", "run")}

    def bind_in_place(self, input_name, output_name, array, capacity=None):  # noqa: ANN001, ANN202
        bound[id(self)][input_name] = tuple(array.shape)
        return originals["bind_in_place"](self, input_name, output_name, array, capacity)

    def bind_input(self, name, array):  # noqa: ANN001, ANN202
        bound[id(self)][name] = tuple(array.shape)
        return originals["bind_input"](self, name, array)

    def run(self, feeds, **kw):  # noqa: ANN001, ANN202
        shapes = {**bound[id(self)], **{n: tuple(np.shape(a)) for n, a in feeds.items()}}
        calls[self._session._model_path].append(shapes)
        return originals["run"](self, feeds, **kw)

    monkeypatch.setattr(eng.OrtBinding, "bind_in_place", bind_in_place)
    monkeypatch.setattr(eng.OrtBinding, "bind_input", bind_input)
    monkeypatch.setattr(eng.OrtBinding, "run", run)
    return calls


def fits(shapes: dict[str, tuple], dims: dict[str, list], phase: dict[str, tuple]) -> bool:
    """Whether one call's input shapes lie inside one phase's ranges (every input the engine
    has must be there: a TensorRT engine needs each one's shape)."""
    for name, named in dims.items():
        shape = shapes.get(name)
        if shape is None or len(shape) != len(named):
            return False
        for size, d in zip(shape, named, strict=True):
            lo, _, hi = (d, d, d) if isinstance(d, int) else phase[d]
            if not lo <= size <= hi:
                return False
    return True


def check_calls_fit(engine_dir: Path, ckpt: Path, args, calls) -> set[str]:  # noqa: ANN001
    from edgeomni.builder.build import dim_ranges
    from edgeomni.export.common.checkpoint import open_checkpoint
    from edgeomni.export.registry import family_for

    ck = open_checkpoint(ckpt)
    hooks = family_for(ck.model_type).hooks()
    seen = set()
    for comp in hooks.components(ck):
        path = engine_dir / comp.subdir / comp.engine
        model = onnx.load(str(path), load_external_data=False)
        dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
                for i in model.graph.input}  # fmt: skip
        ranges = dim_ranges(hooks, ck, comp, args)
        assert ranges, comp.name
        for shapes in calls.get(str(path), []):
            seen.add(comp.name)
            assert any(fits(shapes, dims, phase) for phase in ranges.values()), (
                comp.name, shapes, ranges)  # fmt: skip
    return seen


def test_omni_calls_fit_the_profiles(omni_ckpt: Path, omni_engine: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from PIL import Image

    from edgeomni.export.family import BuildArgs
    from edgeomni.runtime.audio import write_wav
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    args = BuildArgs(max_batch_size=3, max_input_len=128, max_kv_cache_capacity=256)  # conftest
    t = np.arange(16000 * 3) / 16000
    write_wav(tmp_path / "q.wav", (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (56, 84, 3), dtype=np.uint8)).save(tmp_path / "q.png")
    content = [{"type": "audio", "audio": str(tmp_path / "q.wav")},
               {"type": "image", "image": str(tmp_path / "q.png")},
               {"type": "text", "text": "What do you hear and see?"}]  # fmt: skip
    body = {"max_generate_length": 10, "top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 40,
            "requests": [{"messages": [{"role": "user", "content": content}]},
                         {"messages": [{"role": "user", "content": "Hello there"}]},
                         {"messages": [{"role": "user", "content": "Count to three"}]}]}  # fmt: skip
    calls = record_calls(monkeypatch)
    for whole in (False, True):
        requests, _ = parse_request_file(body)
        results = Pipeline(omni_engine, whole_utterance=whole).run(requests, batch_size=3)
        assert all(r.entry["ok"] for r in results), [r.entry for r in results]
    seen = check_calls_fit(omni_engine, omni_ckpt, args, calls)
    assert seen == {"llm", "audio", "visual", "talker", "code_predictor", "code2wav",
                    "code2wav_stream"}  # fmt: skip


def test_vl_calls_fit_the_profiles(vl_ckpt: Path, vl_engine: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Qwen3-VL's llm and visual calls (an image, a video of 5 frames, text) fit its ranges."""
    from PIL import Image

    from edgeomni.export.family import BuildArgs
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    args = BuildArgs(max_batch_size=3, max_input_len=256, max_kv_cache_capacity=384)  # conftest
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (56, 84, 3), dtype=np.uint8)).save(tmp_path / "q.png")
    frames = []
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (40, 60, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        frames.append(str(tmp_path / f"{i}.png"))
    content = [{"type": "image", "image": str(tmp_path / "q.png")},
               {"type": "video", "video": frames}, {"type": "text", "text": "What is this?"}]  # fmt: skip
    body = {"max_generate_length": 6, "top_k": 1,
            "requests": [{"messages": [{"role": "user", "content": content}]},
                         {"messages": [{"role": "user", "content": "Hello there"}]}]}  # fmt: skip
    calls = record_calls(monkeypatch)
    requests, _ = parse_request_file(body)
    results = Pipeline(vl_engine).run(requests, batch_size=3)
    assert all(r.entry["ok"] for r in results), [r.entry for r in results]
    assert check_calls_fit(vl_engine, vl_ckpt, args, calls) == {"llm", "visual"}


def test_tts_calls_fit_the_profiles(tts_engine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgeomni.export.family import BuildArgs
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    args = BuildArgs(max_batch_size=2, max_input_len=64, max_kv_cache_capacity=128)  # conftest
    body = {"talker_top_k": 1, "talker_max_new_tokens": 30,
            "requests": [{"messages": [{"role": "assistant", "content": text}],
                          "language": "English", "speaker": "vivian"}
                         for text in ("Hello there.", "A second, longer sentence to say.")]}  # fmt: skip
    calls = record_calls(monkeypatch)
    for streaming in ("stateful", "windows"):
        requests, _ = parse_request_file(body)
        results = Pipeline(tts_engine, code2wav_streaming=streaming).run(requests, batch_size=2)
        assert all(r.entry["ok"] for r in results), [r.entry for r in results]
    seen = check_calls_fit(tts_engine, tts_engine.parent / "ckpt", args, calls)
    assert seen == {"talker", "code_predictor", "code2wav", "code2wav_stream"}


def test_trt_engine_takes_the_first_profile_that_holds_a_call() -> None:
    """TrtEngine's choice of context (runtime/tensorrt_engine.py's profile_for), without
    TensorRT: decode shapes go to the decode profile, anything else that fits to prefill, and a
    call outside every profile names its shapes and the engine's ranges."""
    from edgeomni.runtime.engine import EngineError
    from edgeomni.runtime.tensorrt_engine import profile_for

    names = ("inputs_embeds", "past_key_0")
    profiles = [
        {"inputs_embeds": ((1, 1, 8), (4, 1, 8), (4, 1, 8)),
         "past_key_0": ((1, 2, 64, 4), (4, 2, 64, 4), (4, 2, 64, 4))},
        {"inputs_embeds": ((1, 1, 8), (1, 32, 8), (4, 32, 8)),
         "past_key_0": ((1, 2, 64, 4), (1, 2, 64, 4), (4, 2, 64, 4))},
    ]  # fmt: skip

    def pick(shapes: dict[str, tuple[int, ...]]) -> int:
        return profile_for(profiles, names, shapes)

    assert pick({"inputs_embeds": (3, 1, 8), "past_key_0": (3, 2, 64, 4)}) == 0
    assert pick({"inputs_embeds": (1, 1, 8), "past_key_0": (1, 2, 64, 4)}) == 0
    assert pick({"inputs_embeds": (2, 17, 8), "past_key_0": (2, 2, 64, 4)}) == 1
    with pytest.raises(EngineError, match=r"inputs_embeds \(2, 33, 8\).*fits none.*\(4, 32, 8\)"):
        pick({"inputs_embeds": (2, 33, 8), "past_key_0": (2, 2, 64, 4)})
    with pytest.raises(EngineError, match="no buffer for input.*past_key_0"):
        pick({"inputs_embeds": (2, 3, 8)})


def test_tts_clone_encoders_calls_fit_the_profiles(tmp_path: Path, exports: ExportStore,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A Base checkpoint's voice clone: the speaker encoder's mel frames and the speech
    tokenizer's samples for a reference clip fit their 'clip' phases, as do the speech stages.
    (Built by export_store.py's build: the exports on both cores.)"""
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.tiny_tts import make_checkpoint
    from edgeomni.runtime.audio import write_wav
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    ckpt = make_checkpoint(tmp_path / "ckpt", "base", "tiny")
    args = BuildArgs(max_batch_size=2, max_input_len=64, max_kv_cache_capacity=128)
    assert exports.build(ckpt, tmp_path / "eng", args) is not None
    t = np.arange(24000 * 3) / 24000
    write_wav(tmp_path / "ref.wav", (0.3 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000)
    clone = {"messages": [{"role": "assistant", "content": "Say this in my voice."}],
             "language": "English", "ref_audio": str(tmp_path / "ref.wav")}  # fmt: skip
    body = {"talker_top_k": 1, "talker_max_new_tokens": 20,
            "requests": [clone, {**clone, "ref_text": "A reference sentence."}]}  # fmt: skip
    calls = record_calls(monkeypatch)
    requests, _ = parse_request_file(body)
    results = Pipeline(tmp_path / "eng").run(requests, batch_size=2)
    assert all(r.entry["ok"] for r in results), [r.entry for r in results]
    seen = check_calls_fit(tmp_path / "eng", ckpt, args, calls)
    assert {"speaker_encoder", "speech_tokenizer_encoder", "talker", "code2wav_stream"} <= seen


def test_asr_calls_fit_the_profiles(asr_ckpt: Path, asr_engine: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Clips of 0.3 s (padded to the extractor's minimum) and 8 s (four attention windows)
    beside a text request."""
    from edgeomni.export.family import BuildArgs
    from edgeomni.runtime.audio import write_wav
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    args = BuildArgs(max_batch_size=3, max_input_len=128, max_kv_cache_capacity=256)  # conftest
    requests = [{"prompt": "Hello there"}]
    for seconds in (0.3, 8.0):
        t = np.arange(int(16000 * seconds)) / 16000
        wav = tmp_path / f"{seconds}.wav"
        write_wav(wav, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)
        content = [{"type": "audio", "audio": str(wav)}]
        requests.append({"messages": [{"role": "user", "content": content}]})
    body = {"max_generate_length": 10, "top_k": 1, "requests": requests}
    calls = record_calls(monkeypatch)
    parsed, _ = parse_request_file(body)
    results = Pipeline(asr_engine).run(parsed, batch_size=3)
    assert all(r.entry["ok"] for r in results), [r.entry for r in results]
    assert check_calls_fit(asr_engine, asr_ckpt, args, calls) == {"llm", "audio"}
