"""Qwen3-Omni code2wav: ONNX engine == transformers, gap-free windows == whole decode, runner.

One tiny random vocoder (H32, 2 layers, sliding_window 8, decoder_dim 64, 1920 samples per frame)
is exported and built once per session.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from edgeomni.export.common import artifacts
from edgeomni.export.families.qwen3_omni import code2wav as c2w
from edgeomni.graph_schema import Emit, Input, Stage
from edgeomni.runtime.engine import Engines, OrtEngine
from edgeomni.runtime.speech.code2wav import Code2Wav, padded_length
from edgeomni.runtime.stage import RequestState
from edgeomni.runtime.vocoder import WindowedVocoder, playback_stall_s

Q, CODEBOOK, SPF, TRIM = 16, 64, 1920, 555
PARITY_TOL = 2e-5  # ORT vs torch; output peak ~0.5, HF float32 vs float64 alone is ~8e-6


def tiny_model() -> Any:
    """Random weights that make the audio depend on the codes (HF init would not): matrices at
    std 1/sqrt(fan_in), SnakeBeta log-alpha/beta near 0, layer scales small as in training,
    the output conv scaled down so the waveform stays inside the +-1 clamp (peak ~0.5)."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeCode2WavConfig,
    )
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    cfg = Qwen3OmniMoeCode2WavConfig(
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=64,
        sliding_window=8,
        decoder_dim=64,
        codebook_size=CODEBOOK,
        num_quantizers=Q,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3OmniMoeCode2Wav(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                fan_in = 1 if name == "code_embedding.weight" else p[0].numel()
                p.normal_(0, 1 / math.sqrt(fan_in))
            elif name.endswith(("alpha", "beta")):
                p.normal_(0, 0.1)
            elif name.endswith(("scale", "gamma")):
                p.uniform_(0.05, 0.15)
            elif name.endswith("weight"):  # norm gains
                p.normal_(1, 0.1)
            else:  # biases
                p.normal_(0, 0.1)
        model.decoder[-1].conv.weight.mul_(0.005)
    return model


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from edgeomni.builder.onnxruntime import build_engine
    from edgeomni.export.family import BuildArgs

    model = tiny_model()
    root = tmp_path_factory.mktemp("code2wav")
    raw = c2w.export_code2wav(model, root / "raw" / c2w.ENGINE)
    folder = root / "code2wav"
    folder.mkdir()
    build_engine(raw, folder / c2w.ENGINE, BuildArgs(1, 1, 1))
    artifacts.write_engine_config(folder, c2w.code2wav_engine_config(model.config))
    engine = OrtEngine(folder / c2w.ENGINE, threads=2)
    return {"model": model, "raw": raw, "folder": folder, "engine": engine}


def ort_decode(engine: OrtEngine) -> Callable[[np.ndarray], np.ndarray]:
    return lambda codes: engine.session.run(None, {"codes": codes})[0]


def hf(model: Any, codes: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(codes)).numpy()


def random_codes(frames: int, seed: int) -> np.ndarray:
    """[frames, Q], the talker's layout."""
    return np.random.default_rng(seed).integers(0, CODEBOOK, (frames, Q), dtype=np.int64)


# -- export --------------------------------------------------------------------------------------
def test_attention_goes_through_the_plugin_op(built: dict[str, Any]) -> None:
    raw = onnx.load(str(built["raw"]), load_external_data=False)
    plugin = [
        n for n in raw.graph.node if n.domain == "edgeomni" and n.op_type == "CachedAttention"
    ]
    assert len(plugin) == 2
    assert all({a.name: a.i for a in n.attribute}["window"] == 8 for n in plugin)
    lowered = onnx.load(str(built["folder"] / c2w.ENGINE))
    gqa = [n for n in lowered.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2
    assert not [n for n in lowered.graph.node if n.op_type in ("Softmax", "Where")]


def test_engine_config(built: dict[str, Any]) -> None:
    cfg = c2w.code2wav_engine_config(built["model"].config)
    assert (cfg["samples_per_frame"], cfg["trim"], cfg["sample_rate"]) == (SPF, TRIM, 24000)
    assert (cfg["window_frames"], cfg["left_context_frames"]) == (300, 25)
    assert cfg["receptive_field_frames"] == 25  # 2 x (8-1) attention + convs
    real = c2w.code2wav_engine_config({"code2wav_config": {}})  # the class defaults = real model
    assert (real["samples_per_frame"], real["trim"], real["num_quantizers"]) == (SPF, TRIM, 16)
    assert real["receptive_field_frames"] > 568


@pytest.mark.parametrize(("batch", "frames"), [(1, 1), (1, 7), (2, 7), (1, 60), (2, 60)])
def test_engine_matches_transformers(built: dict[str, Any], batch: int, frames: int) -> None:
    codes = np.random.default_rng(frames).integers(0, CODEBOOK, (batch, Q, frames))
    out = ort_decode(built["engine"])(codes)
    ref = hf(built["model"], codes)
    assert out.shape == ref.shape == (batch, 1, frames * SPF - TRIM)
    assert np.abs(out - ref).max() < PARITY_TOL


def test_load_code2wav_by_checkpoint_names(built: dict[str, Any]) -> None:
    model = built["model"]
    tensors = {f"code2wav.{k}": v.clone() for k, v in model.state_dict().items()}
    loaded = c2w.load_code2wav(tensors.__getitem__, {"code2wav_config": model.config.to_dict()})
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    codes = random_codes(9, 1).T[None]
    # loaded runs sdpa (the config default), the fixture model eager
    assert np.abs(hf(loaded, codes) - hf(model, codes)).max() < 1e-5


def test_audio_depends_on_codes(built: dict[str, Any]) -> None:
    decode = ort_decode(built["engine"])
    a, b = decode(random_codes(20, 2).T[None]), decode(random_codes(20, 3).T[None])
    assert 0.1 < np.abs(a).max() < 1.0  # audible, not clamped
    assert np.std(a - b) > 0.3 * np.std(a)


# -- windowed vocoding ---------------------------------------------------------------------------
def windowed(decode: Callable, codes: np.ndarray, left_context: int, chunks: list[int]) -> Any:
    voc = WindowedVocoder(decode, window=20, left_context=left_context)
    pieces, at = [], 0
    for n in chunks:
        pieces.append(voc.push(codes[at : at + n]))
        at += n
    pieces.append(voc.flush())
    return voc, pieces


@pytest.mark.parametrize("frames", [60, 47])  # whole windows; a partial last window
def test_windows_equal_whole_decode_with_enough_context(built: dict[str, Any], frames: int) -> None:
    decode = ort_decode(built["engine"])
    codes = random_codes(frames, frames)
    voc, pieces = windowed(decode, codes, 25, [frames])
    whole = voc.decode_whole(codes)
    audio = np.concatenate(pieces)
    assert audio.size == whole.size == frames * SPF - TRIM  # no 555-sample gaps at the joins
    assert np.abs(audio - whole).max() < 1e-5
    assert voc.windows - 1 == math.ceil(frames / 20)  # minus the whole decode


# measured with this model (torch): context 4 -> 0.18, 16 -> 0.025, 20 -> 2.4e-4, 24 -> 8e-6
@pytest.mark.parametrize(("context", "low", "high"), [(4, 0.05, 0.3), (16, 1e-3, 0.05)])
def test_small_context_is_bounded_and_first_window_exact(
    built: dict[str, Any], context: int, low: float, high: float
) -> None:
    decode = ort_decode(built["engine"])
    codes = random_codes(60, 5)
    voc, pieces = windowed(decode, codes, context, [60])
    whole = voc.decode_whole(codes)
    audio = np.concatenate(pieces)
    assert audio.size == whole.size
    first = 20 * SPF - TRIM
    assert np.abs(audio[:first] - whole[:first]).max() < 1e-5  # causal: no context needed
    diff = np.abs(audio - whole).max()
    print(f"left context {context}: max abs diff {diff:.3g} (peak {np.abs(whole).max():.2f})")
    assert low < diff < high


def test_push_frame_by_frame_equals_chunks(built: dict[str, Any]) -> None:
    decode = ort_decode(built["engine"])
    codes = random_codes(53, 6)
    _, one = windowed(decode, codes, 25, [1] * 53)
    _, chunked = windowed(decode, codes, 25, [7, 13, 0, 1, 32])
    np.testing.assert_array_equal(np.concatenate(one), np.concatenate(chunked))
    # audio comes out as windows complete: the first 20 frames give 20*1920-555 samples
    assert [p.size for p in one[:21] if p.size] == [20 * SPF - TRIM]


def test_short_first_window_is_gap_free_and_early(built: dict[str, Any]) -> None:
    """A 4-frame first window, then windows doubling up to 20 frames: audio after 4 frames, and
    the joined audio still equals the whole decode."""
    decode = ort_decode(built["engine"])
    codes = random_codes(47, 8)
    voc = WindowedVocoder(decode, window=20, left_context=25, first_window=4)
    pieces = [voc.push(codes[i : i + 1]) for i in range(len(codes))] + [voc.flush()]
    sizes = [p.size for p in pieces]
    assert sizes[3] == 4 * SPF - TRIM and not any(sizes[:3])  # first audio after frame 4
    # then 8, 16 and 20 frames, each doubling the last (47 frames: 4 + 8 + 16 + the last 19)
    assert [i for i, n in enumerate(sizes) if n] == [3, 11, 27, len(codes)]
    assert sizes[11] == 8 * SPF and sizes[27] == 16 * SPF and sizes[-1] == 19 * SPF
    whole = voc.decode_whole(codes)
    audio = np.concatenate(pieces)
    assert audio.size == whole.size and np.abs(audio - whole).max() < 1e-5


def test_hf_chunked_decode_drops_samples_at_joins(built: dict[str, Any]) -> None:
    """Why the gap-free rule: HF's chunked_decode loses 555 samples per join."""
    codes = torch.from_numpy(random_codes(60, 7).T[None].copy())
    with torch.no_grad():
        chunked = built["model"].chunked_decode(codes, chunk_size=20, left_context_size=25)
    assert chunked.shape[-1] == 60 * SPF - TRIM - 2 * TRIM


# -- runner --------------------------------------------------------------------------------------
def stage(**config: Any) -> Stage:
    return Stage(
        id="code2wav",
        runner="qwen3_omni.code2wav",
        artifact="code2wav",
        kind="iterative",
        inputs=(Input("codes", "talker:codes"),),
        emits=(Emit("audio", "audio", terminal=True),),
        config=config,
    )


def drive(runner: Code2Wav, states: list[RequestState]) -> None:
    """The runner's stage alone through the scheduler loop, every request's codes complete."""
    from types import SimpleNamespace

    from edgeomni.runtime.scheduler import run_graph

    for state in states:
        state.plan = SimpleNamespace(stages=("code2wav",))
    run_graph({"code2wav": runner.slot_stage()}, states, {"code2wav": len(states)})


def run_runner(runner: Code2Wav, *codes: np.ndarray) -> list[RequestState]:
    states = [
        RequestState(index=i, request=None, plan=None, outputs={"talker:codes": c})
        for i, c in enumerate(codes)
    ]
    drive(runner, states)
    return states


def test_runner_windows_equal_whole_decode(built: dict[str, Any]) -> None:
    runner = Code2Wav(stage(window_frames=20), built["folder"], engines=Engines(threads=2))
    codes = [random_codes(60, 8), random_codes(5, 9)]
    states = run_runner(runner, *codes)
    for state, c in zip(states, codes, strict=True):
        audio = state.outputs["code2wav:audio"]
        whole = hf(built["model"], c.T[None].copy()).ravel()
        assert audio.dtype == np.float32 and audio.shape == whole.shape
        assert np.abs(audio - whole).max() < PARITY_TOL
    details = states[0].details["code2wav"]
    assert details["frames"] == 60 and details["samples"] == 60 * SPF - TRIM
    assert details["windows"] == 3 and details["mode"] == "windowed"
    assert details["duration_ms"] == pytest.approx((60 * SPF - TRIM) / 24)


def test_an_utterance_of_no_frames_is_empty_audio(built: dict[str, Any]) -> None:
    """A talker that ends speech at its first code leaves no frames: windowed or whole, the
    request gets empty audio, not an error."""
    none = np.zeros((0, Q), np.int64)
    for config, mode in (({}, "streamed"), ({"whole_utterance": True}, "whole")):
        runner = Code2Wav(stage(window_frames=20, **config), built["folder"],
                          engines=Engines(threads=2))
        state = run_runner(runner, none)[0]
        assert state.error is None
        assert state.outputs["code2wav:audio"].shape == (0,)
        assert state.details["code2wav"]["mode"] == mode
        assert state.details["code2wav"]["samples"] == 0


def test_padded_length_rule() -> None:
    lengths = (5, 50)
    assert padded_length(5, lengths) == 5
    assert padded_length(3, lengths) == 5
    assert padded_length(30, lengths) == 50 and padded_length(25, lengths) == 50
    assert padded_length(24, lengths) is None  # 50 frames would be more than twice the work
    assert padded_length(2, lengths) is None and padded_length(51, lengths) is None
    assert padded_length(7, ()) is None


def test_fixed_length_windows_equal_exact_ones(built: dict[str, Any]) -> None:
    """Windows padded with code 0 to the fixed lengths a GPU replays (set here on a CPU engine)
    give the audio of windows run at their own lengths: the vocoder is causal."""
    codes = [random_codes(57, 11), random_codes(57, 12), random_codes(3, 13)]
    config = {"window_frames": 20, "first_window_frames": 4}
    two = Engines(threads=2)
    exact = run_runner(Code2Wav(stage(**config), built["folder"], engines=two), *codes)
    runner = Code2Wav(stage(**config), built["folder"], engines=two)
    assert runner.fixed_lengths == ()  # a CPU engine runs every window at its own length
    # what a GPU engine takes: the first window, the growing ones with the context they have,
    # 20 frames + 25 of left context
    runner.fixed_lengths = tuple(sorted(runner.vocoder().lengths()))
    assert runner.fixed_lengths == (4, 12, 28, 45)
    calls: list[tuple[int, ...]] = []
    run = runner._decode_fixed
    runner._decode_fixed = lambda c, length: calls.append((*c.shape, length)) or run(c, length)
    padded = run_runner(runner, *codes)
    for a, b in zip(exact, padded, strict=True):
        x, y = a.outputs["code2wav:audio"], b.outputs["code2wav:audio"]
        assert x.shape == y.shape and np.abs(x - y).max() < 1e-5
    # 57 frames: 4 | 8 (+4 context) | 16 (+12) | 20 (+25) | 9 (+25, padded); 3 frames: one
    # 3-frame call, padded
    assert calls == [(1, Q, 4, 4), (1, Q, 12, 12), (1, Q, 28, 28), (1, Q, 45, 45),
                     (1, Q, 34, 45)] * 2 + [(1, Q, 3, 4)]  # fmt: skip
    # buffers kept per batch size and length
    assert set(runner._fixed) == {(1, 4), (1, 12), (1, 28), (1, 45)}
    assert padded[0].details["code2wav"]["fixed_lengths"] == [4, 12, 28, 45]


def test_a_shapes_first_call_runs_until_its_graph_is_captured(built: dict[str, Any]) -> None:
    """On an engine that captures CUDA graphs, with the calls on a thread of their own
    (own_thread), a fixed-length shape's first call runs its binding CAPTURE_RUNS times (ONNX
    Runtime captures a graph id on its third run), later calls once, the samples the same: only
    a shape's first call may capture (``may_capture``), the one call of that shape the loop
    waits for. In the loop's thread every call runs once. Over the CPU engine here, with the
    graph id and the capturing faked."""
    from types import SimpleNamespace

    from edgeomni.runtime.engine import CAPTURE_RUNS

    runner = Code2Wav(stage(window_frames=20, own_thread=True), built["folder"],
                      engines=Engines(threads=2))  # fmt: skip
    engine = runner.engine
    runner._engines = SimpleNamespace(captures=lambda config: True)  # type: ignore[assignment]
    runner.fixed_lengths = (8,)
    engine.new_graph_id = lambda: 5  # type: ignore[method-assign]
    graphs: list[int | None] = []
    made = engine.binding

    def binding() -> Any:
        b = made()
        run = b.run
        b.run = lambda feeds, **kw: graphs.append(kw.get("graph")) or run(feeds, **kw)
        return b

    engine.binding = binding  # type: ignore[method-assign]
    codes = random_codes(6, 3).T[None].copy()  # [1, Q, 6]: padded to 8
    assert runner.may_capture(codes.shape)
    first = runner.decode_batch(codes)
    assert graphs == [5] * CAPTURE_RUNS and not runner.may_capture(codes.shape)
    again = runner.decode_batch(codes)
    assert graphs == [5] * (CAPTURE_RUNS + 1)
    np.testing.assert_array_equal(first, again)
    assert runner.may_capture((2, *codes.shape[1:]))  # another batch size: its own graph
    assert not runner.may_capture((1, Q, 30))  # a length run as it is: nothing captured
    runner.beside = False  # in the loop's thread: a new shape's first call runs once
    graphs.clear()
    runner.decode_batch(np.concatenate([codes, codes]))
    assert graphs == [5]


def test_runner_whole_utterance_and_fallback(built: dict[str, Any], tmp_path: Path) -> None:
    codes = random_codes(40, 10)
    whole = run_runner(Code2Wav(stage(whole_utterance=True), built["folder"]), codes)[0]
    assert whole.details["code2wav"]["windows"] == 1
    option = run_runner(Code2Wav(stage(), built["folder"], whole_utterance=True), codes)[0]
    np.testing.assert_array_equal(option.outputs["code2wav:audio"], whole.outputs["code2wav:audio"])
    # an engine built for at most 30 frames: the 40-frame utterance falls back to windows
    small = tmp_path / "code2wav"
    shutil.copytree(built["folder"], small)
    cfg = c2w.code2wav_engine_config(built["model"].config, max_frames=30)
    artifacts.write_engine_config(small, cfg)
    runner = Code2Wav(stage(window_frames=5), small, whole_utterance=True)
    fallback = run_runner(runner, codes)[0]
    assert fallback.details["code2wav"]["windows"] == 8
    diff = np.abs(fallback.outputs["code2wav:audio"] - whole.outputs["code2wav:audio"]).max()
    assert diff < 1e-5


def test_whole_utterances_complete_together_share_calls(built: dict[str, Any]) -> None:
    """Vocoding whole utterances, the requests whose codes are complete together share engine
    calls: sorted by length, a call takes those up to twice the shortest's frames, padded on
    the right; each request's audio is what it gets alone (an in-context prompt cut off as
    alone), and a request with bad codes fails alone."""
    codes = [random_codes(20, 31), random_codes(15, 32), random_codes(40, 33), random_codes(9, 34)]
    prompt = random_codes(6, 35)  # the fourth request's, vocoded in front and cut off
    runner = Code2Wav(stage(whole_utterance=True), built["folder"], engines=Engines(threads=2))
    runner.prompt_source = "talker:prompt"
    calls: list[tuple[int, ...]] = []
    decode = runner.decode_batch
    runner.decode_batch = lambda c: calls.append(c.shape) or decode(c)

    def states() -> list[RequestState]:
        out = [RequestState(index=i, request=None, plan=None, outputs={"talker:codes": c})
               for i, c in enumerate(codes)]  # fmt: skip
        out[3].outputs["talker:prompt"] = prompt
        out.append(RequestState(index=4, request=None, plan=None,
                                outputs={"talker:codes": np.zeros((3, 4), np.int64)}))  # fmt: skip
        return out

    together = states()
    drive(runner, together)
    # 15 (with the 9 + 6 prompt frames), 20 in one call; 40 alone (more than twice 15)
    assert calls == [(3, Q, 20), (1, Q, 40)]
    assert "[frames, 16]" in (together[4].error or "")
    alone = Code2Wav(stage(whole_utterance=True, max_windows_per_call=1), built["folder"],
                     engines=Engines(threads=2))  # fmt: skip
    alone.prompt_source = "talker:prompt"
    singles = states()
    drive(alone, singles)
    for a, b in zip(together[:4], singles[:4], strict=True):
        x, y = a.outputs["code2wav:audio"], b.outputs["code2wav:audio"]
        assert x.shape == y.shape and np.abs(x - y).max() < 1e-5
        assert a.details["code2wav"]["mode"] == "whole"
    assert together[3].outputs["code2wav:audio"].size == 9 * SPF - TRIM
    assert [s.details["code2wav"]["call_rows"] for s in together[:4]] == [3, 3, 1, 3]
    assert [s.details["code2wav"]["call_rows"] for s in singles[:4]] == [1, 1, 1, 1]


def test_runner_reports_missing_or_bad_codes(built: dict[str, Any]) -> None:
    runner = Code2Wav(stage(), built["folder"])
    missing = RequestState(index=0, request=None, plan=None)
    bad = RequestState(index=1, request=None, plan=None, outputs={"talker:codes": np.zeros((3, 4))})
    drive(runner, [missing, bad])
    assert "no codes from talker:codes" in (missing.error or "")
    assert "[frames, 16]" in (bad.error or "")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"max_windows_per_call": -1}, "max_windows_per_call must be >= 0"),
        ({"window_frames": 20, "first_window_frames": 0}, "at least 1 frame"),
        ({"first_window_frames": 10_000}, "exceed the engine's max_frames"),
    ],
)
def test_bad_window_settings_are_refused(built: dict[str, Any], config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Code2Wav(stage(**config), built["folder"], engines=Engines(threads=2))


def test_playback_stall_counts_only_the_waits_after_playing_starts() -> None:
    rate = 1000  # samples per second: a piece of 500 samples plays for 0.5 s
    assert playback_stall_s([], rate) == 0.0
    assert playback_stall_s([(3.0, 500)], rate) == 0.0  # first audio late: not a stall
    assert playback_stall_s([(1.0, 500), (1.4, 500), (1.9, 200)], rate) == 0.0  # each in time
    # the second piece comes 0.3 s after the first has played; the third while it plays
    stalls = playback_stall_s([(1.0, 500), (1.8, 1000), (2.5, 100)], rate)
    assert stalls == pytest.approx(0.3)
    # the third comes 0.25 s after the second has played, counted from the second's own end
    assert playback_stall_s([(1.0, 500), (1.8, 100), (2.15, 100)], rate) == pytest.approx(0.55)


def test_windows_grow_from_the_first_to_the_full_size() -> None:
    """Each window doubles the one before up to ``window``, so it plays at least as long as the
    next takes to generate at twice real time; ``lengths`` lists what a fixed-length vocoder
    prepares, context included."""
    voc = WindowedVocoder(lambda c: c, window=25, left_context=25, first_window=5)
    assert [voc.size(i) for i in range(6)] == [5, 10, 20, 25, 25, 25]
    assert voc.lengths() == [5, 15, 35, 50]  # 5 | 10 (+5) | 20 (+15) | 25 (+25)
    same = WindowedVocoder(lambda c: c, window=25, left_context=25)  # no shorter first window
    assert [same.size(i) for i in range(3)] == [25, 25, 25] and same.lengths() == [25, 50]
    longer = WindowedVocoder(lambda c: c, window=8, left_context=4, first_window=30)
    assert [longer.size(i) for i in range(3)] == [30, 8, 8] and longer.lengths() == [30, 12]


def test_windows_taken_ahead_give_the_audio_pushed_windows_give() -> None:
    """A caller that decodes windows on another thread takes each as it sends it (the next
    starts at once) and cuts its audio when the samples come back, and sends the last, partial
    window once no more frames come (``tail``): the pieces are ``push``'s and ``flush``'s."""
    spf, trim = 4, 3

    def decode(codes: np.ndarray) -> np.ndarray:  # samples that name their frame and offset
        n = codes.shape[-1]
        return (codes[0, 0].repeat(spf) * 10 + np.tile(np.arange(spf), n))[: n * spf - trim]

    codes = np.arange(23)[:, None].repeat(2, axis=1)
    pushed = WindowedVocoder(decode, window=8, left_context=2, samples_per_frame=spf, trim=trim,
                             first_window=2)  # fmt: skip
    want = [pushed.push(codes[:11]), pushed.push(codes[11:]), pushed.flush()]
    ahead = WindowedVocoder(decode, window=8, left_context=2, samples_per_frame=spf, trim=trim,
                            first_window=2)  # fmt: skip
    ahead.add(codes)
    taken = []
    while (window := ahead.pending()) is not None:  # every complete window sent before any cut
        ahead.take(window)
        taken.append(window)
    assert ahead.left == 23 - taken[-1].end > 0 and ahead.tail() is not None
    last = ahead.tail()
    assert last is not None
    ahead.take(last)
    assert ahead.left == 0 and ahead.tail() is None and ahead.pending() is None
    got = [ahead.cut(w, decode(np.ascontiguousarray(w.codes.T[None]))) for w in [*taken, last]]
    np.testing.assert_array_equal(np.concatenate(got), np.concatenate(want))
    assert ahead.windows == pushed.windows
