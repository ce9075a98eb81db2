"""The stateful streaming code2wav (issue 34): each frame decoded once, its state carried from
call to call, equal to the whole-utterance decode within 1e-4 on the CPU for Qwen3-Omni and
Qwen3-TTS, whatever the chunking, for requests joining and leaving a batch; through the
runner, the scheduler loop and edge-infer.

The engines are the session's tiny Qwen3-Omni and Qwen3-TTS builds (tests/conftest.py), whose
graphs stream with the step engine (edge-build's default). Their windows: Qwen3-Omni's
code2wav attends over 8 frames, Qwen3-TTS's over 72, so the utterances here run past them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from edgeomni.builder.build import check_flags, select_components
from edgeomni.builder.errors import BuildError
from edgeomni.export.family import BuildArgs
from edgeomni.graph_schema import Emit, Input, Stage
from edgeomni.runtime.engine import Engines
from edgeomni.runtime.events import CodecFrames, Finished
from edgeomni.runtime.pipeline import woken
from edgeomni.runtime.scheduler import run_graph
from edgeomni.runtime.speech.code2wav import Code2Wav
from edgeomni.runtime.stage import RequestState

TOL = 1e-4  # absolute, on audio in [-1, 1]
FAMILIES = {"omni": "omni_engine", "tts": "tts_engine"}
# frames of the requests of a batch: past each family's window, odd, one and two frames
LENGTHS = {"omni": [37, 11, 23, 1, 2], "tts": [90, 30, 75, 1, 2]}


def stage(**config: Any) -> Stage:
    return Stage(id="code2wav", runner="qwen3_omni.code2wav", artifact="code2wav",
                 kind="iterative", inputs=(Input("codes", "talker:codes"),),
                 emits=(Emit("audio", "audio", terminal=True),), config=config)  # fmt: skip


def stateful(engine: Path, **config: Any) -> Code2Wav:
    """The runner streaming with the step engine (the graph's stage config, chunks as given)."""
    graph = json.loads((engine / "multistage_config.json").read_text())
    built = next(s for s in graph["stages"] if s["id"] == "code2wav")["config"]
    return Code2Wav(stage(**{**built, **config}), engine / "code2wav", engines=Engines(threads=2))


def in_bursts(runner: Code2Wav, codes: np.ndarray, bursts: tuple[int, ...]) -> np.ndarray:
    """One request's frames pushed in uneven bursts (each decoded as the batch would), then the
    rest and the end: its audio."""
    batch = runner.stream_batch()
    stream = runner.stream_for(RequestState(0, None, None), batch)
    at = 0
    for burst in bursts:
        stream(codes[at : at + burst])
        batch.decode_ready()
        at += burst
    stream(codes[at:])
    return stream.finish()


@pytest.fixture(scope="module")
def wholes(request) -> dict[str, dict[int, tuple[np.ndarray, np.ndarray]]]:
    """Each family's random codes per length and their whole-utterance audio (one call each,
    through the codes -> waveform engine)."""
    out = {}
    for family, fixture in FAMILIES.items():
        engine = request.getfixturevalue(fixture)
        runner = Code2Wav(stage(), engine / "code2wav", engines=Engines(threads=2),
                          whole_utterance=True)  # fmt: skip
        rng = np.random.default_rng(len(family))
        out[family] = {}
        for n in LENGTHS[family]:
            codes = rng.integers(0, runner.codebook_size, (n, runner.num_quantizers))
            audio, calls, mode = runner.vocode(codes)
            assert (calls, mode) == (1, "whole")
            out[family][n] = (codes, audio)
    return out


# -- a talker stand-in: one frame per step for each of its rows ----------------------------------
@dataclass
class _Slot:
    state: RequestState
    row: int
    at: int = 0
    finish: str | None = None


class FrameSource:
    """The talker's place in the loop: each request's codes one frame a step, then Finished."""

    stage_id, consumes = "talker", False

    def ready(self, state, upstream_done, events) -> bool:
        return True

    def admit(self, entries) -> list[_Slot]:
        return [_Slot(state, row) for state, row, _ in entries]

    def step(self, slots) -> None:
        for slot in slots.values():
            slot.at += 1

    def update(self, slot: _Slot, events: bool) -> list[Any]:
        codes = slot.state.prepared["codes"]
        out: list[Any] = [CodecFrames(slot.state.index, "talker", codes[slot.at - 1 : slot.at])]
        if slot.at == len(codes):
            slot.state.outputs["talker:codes"] = codes
            slot.finish = "eos"
            out.append(Finished(slot.state.index, "talker", "eos"))
        return out if slot.at else []

    def consume(self, slot, event) -> None: ...
    def move(self, slot, row) -> None:
        slot.row = row

    def retire(self, slot) -> None: ...
    def discard(self, slot) -> None: ...


def run_batch(runner: Code2Wav, codes: list[np.ndarray], width: int) -> list[RequestState]:
    """The requests through a talker stand-in and the runner's stage, ``width`` rows each:
    later requests join as earlier ones leave."""
    states = [RequestState(index=i, request=None, plan=SimpleNamespace(stages=("talker",
              "code2wav")), prepared={"codes": c}) for i, c in enumerate(codes)]  # fmt: skip
    stages = {"talker": FrameSource(), "code2wav": runner.slot_stage()}
    with woken(stages.values()) as idle:
        run_graph(stages, states, {"talker": width, "code2wav": width}, idle=idle)
    for state in states:
        assert state.error is None, state.error
    return states


def record_calls(runner: Code2Wav) -> list[list[int]]:
    """Each step engine call's valid frames per row, as the runner makes them."""
    calls: list[list[int]] = []
    run = runner.step.run

    def recording(codes, lens, states):
        calls.append([int(n) for n in lens])
        return run(codes, lens, states)

    runner.step.run = recording
    return calls


# -- equal to the whole decode ---------------------------------------------------------------
@pytest.mark.slow  # its engines come through request.getfixturevalue
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize(("first", "size"), [(1, 4), (2, 5), (1, 3), (2, 25)])
def test_a_batch_joining_and_leaving_equals_whole_utterances(
    family: str, first: int, size: int, wholes, request
) -> None:
    """Five requests of different lengths through three rows (two join as others leave),
    each frame vocoded once, in chunks of ``first`` then doubling up to ``size`` frames, rows
    ready together in one call: each request's audio is its whole-utterance decode."""
    runner = stateful(request.getfixturevalue(FAMILIES[family]), first_chunk_frames=first,
                      chunk_frames=size)  # fmt: skip
    calls = record_calls(runner)
    items = list(wholes[family].values())
    states = run_batch(runner, [codes for codes, _ in items], width=3)
    for state, (codes, whole) in zip(states, items, strict=True):
        audio = state.outputs["code2wav:audio"]
        assert audio.shape == whole.shape
        assert np.abs(audio - whole).max() < TOL, (family, len(codes))
        report = state.details["code2wav"]
        assert report["mode"] == "stateful"
        assert (report["first_chunk_frames"], report["chunk_frames"]) == (first, max(size, first))
    total = sum(len(codes) for codes, _ in items)
    assert sum(map(sum, calls)) == total  # each frame decoded once
    assert max(n for call in calls for n in call) <= max(size, first)
    assert any(len(call) > 1 for call in calls)  # rows stepping together share calls
    assert runner._engine is None  # streaming stateful loads only the step engine


@pytest.mark.slow  # its engines come through request.getfixturevalue
@pytest.mark.parametrize("family", list(FAMILIES))
def test_on_a_thread_of_its_own_a_batch_equals_whole_utterances(family: str, wholes,
                                                                 request) -> None:  # fmt: skip
    """The stage config's own_thread (edge-infer --vocoder-threads): every call runs on the
    vocoder's worker thread while the loop goes on, and each request's audio is still its
    whole-utterance decode, each frame vocoded once; the rows go back to the pool."""
    import threading

    runner = stateful(request.getfixturevalue(FAMILIES[family]), first_chunk_frames=2,
                      chunk_frames=4, own_thread=True)  # fmt: skip
    threads: list[str] = []
    run = runner.step.run

    def recording(codes, lens, rows):
        threads.append(threading.current_thread().name)
        return run(codes, lens, rows)

    runner.step.run = recording
    items = list(wholes[family].values())
    stage = runner.slot_stage()
    assert stage.polls
    states = [RequestState(index=i, request=None, plan=SimpleNamespace(stages=("talker",
              "code2wav")), prepared={"codes": c}) for i, (c, _) in enumerate(items)]  # fmt: skip
    stages = {"talker": FrameSource(), "code2wav": stage}
    with woken(stages.values()) as idle:
        assert idle is not None
        run_graph(stages, states, {"talker": 3, "code2wav": 3}, idle=idle)
    assert not stage.wakes  # the run's wake is taken off again
    for state, (codes, whole) in zip(states, items, strict=True):
        assert state.error is None, state.error
        audio = state.outputs["code2wav:audio"]
        assert audio.shape == whole.shape
        assert np.abs(audio - whole).max() < TOL, (family, len(codes))
    assert threads and all(name.startswith("edgeomni-vocoder") for name in threads)
    assert runner.step.pool.free == runner.step.pool.state.max_batch  # every row released


def windowed(engine: Path, **config: Any) -> Code2Wav:
    """The runner vocoding in windows (the GPU's default streaming), the graph's stage config
    otherwise."""
    graph = json.loads((engine / "multistage_config.json").read_text())
    built = next(s for s in graph["stages"] if s["id"] == "code2wav")["config"]
    return Code2Wav(stage(**{**built, "streaming": "windows", "first_window_frames": 2,
                             "window_frames": 8, **config}),
                    engine / "code2wav", engines=Engines(threads=2))  # fmt: skip


@pytest.mark.slow  # its engines come through request.getfixturevalue
@pytest.mark.parametrize("family", list(FAMILIES))
def test_windows_on_a_thread_of_their_own_give_the_loops_audio(family: str, wholes,
                                                               request) -> None:  # fmt: skip
    """Windows with own_thread (edge-infer --vocoder-threads; on a GPU, the vocoder's kernels on
    a stream of their own): every call runs on the worker thread, the windows of rows stepping
    together share calls, the last partial windows included, and each request's audio is the
    audio the loop's own windows make. A call that may capture a CUDA graph is waited for: the
    loop's thread makes no call while the worker captures."""
    import threading

    engine = request.getfixturevalue(FAMILIES[family])
    codes = [c for c, _ in wholes[family].values()]
    inline = [s.outputs["code2wav:audio"] for s in run_batch(windowed(engine), codes, width=3)]
    runner = windowed(engine, own_thread=True)
    calls: list[tuple[str, int]] = []
    waited: list[bool] = []
    decode = runner.decode_batch

    def recording(batch_codes: np.ndarray) -> np.ndarray:
        calls.append((threading.current_thread().name, len(batch_codes)))
        return decode(batch_codes)

    runner.decode_batch = recording  # type: ignore[method-assign]
    runner.may_capture = lambda shape: len(calls) < 2  # type: ignore[method-assign]
    stage = runner.slot_stage()
    assert stage.polls
    collect = stage.batch.collect

    def watched(**kw: Any) -> bool:
        took = collect(**kw)
        if not kw:  # a call that may capture, waited for as it is sent
            waited.append(not stage.batch.beside.pending)
        return took

    stage.batch.collect = watched  # type: ignore[method-assign]
    states = [RequestState(index=i, request=None, plan=SimpleNamespace(stages=("talker",
              "code2wav")), prepared={"codes": c}) for i, c in enumerate(codes)]  # fmt: skip
    stages = {"talker": FrameSource(), "code2wav": stage}
    with woken(stages.values()) as idle:
        run_graph(stages, states, {"talker": 3, "code2wav": 3}, idle=idle)
    for state, want in zip(states, inline, strict=True):
        assert state.error is None, state.error
        got = state.outputs["code2wav:audio"]
        assert got.shape == want.shape
        assert np.abs(got - want).max() < 1e-5, (family, len(state.prepared["codes"]))
    assert calls and all(name.startswith("edgeomni-vocoder") for name, _ in calls)
    assert max(rows for _, rows in calls) > 1  # rows shared calls
    assert waited == [True, True]  # the two calls that might capture: waited for at once
    assert not stage.batch.beside.pending and all(not s.in_flight for s in stage.batch.streams)


def test_windows_of_requests_finishing_together_share_their_last_call(omni_engine,
                                                                      wholes) -> None:  # fmt: skip
    """Two requests the talker speaks in step, vocoded in windows in the loop: every window of
    theirs, the partial last ones included, is one call of two rows (alone, each tail was a
    call of its own)."""
    runner = windowed(omni_engine)
    rows: list[tuple[int, int]] = []
    decode = runner.decode_batch

    def recording(batch_codes: np.ndarray) -> np.ndarray:
        rows.append((batch_codes.shape[0], batch_codes.shape[2]))
        return decode(batch_codes)

    runner.decode_batch = recording  # type: ignore[method-assign]
    codes, _ = wholes["omni"][11]
    states = run_batch(runner, [codes, codes.copy()], width=2)
    # 11 frames: windows of 2 and 4 new frames, then the last 5 with the 6 before them
    assert rows == [(2, 2), (2, 6), (2, 11)], rows
    a, b = (s.outputs["code2wav:audio"] for s in states)
    np.testing.assert_array_equal(a, b)


def test_windows_of_several_lengths_share_a_fixed_lengths_call(omni_engine, wholes) -> None:
    """Where windows run at fixed lengths (a GPU; set here on the CPU engine), the last windows
    of requests ending together share one call even when their lengths differ (each padded on
    the right with code 0), and each request's audio is what its windows give alone."""
    codes, _ = wholes["omni"][11]
    exact = windowed(omni_engine)
    runner = windowed(omni_engine)
    runner.fixed_lengths = tuple(sorted(runner.vocoder().lengths()))
    calls: list[tuple[int, ...]] = []
    decode = runner.decode_batch

    def recording(batch_codes: np.ndarray) -> np.ndarray:
        calls.append(batch_codes.shape)
        return decode(batch_codes)

    runner.decode_batch = recording  # type: ignore[method-assign]
    audio = {}
    for name, r in (("exact", exact), ("fixed", runner)):
        batch = r.stream_batch()
        streams = [r.stream_for(RequestState(i, None, None), batch) for i in range(2)]
        for stream, n in zip(streams, (7, 8), strict=True):  # two tails: 1 and 2 new frames
            stream(codes[:n])
        batch.decode_ready()
        for stream in streams:
            stream.close()
        batch.decode_ready()
        audio[name] = [stream.finish() for stream in streams]
    # the first two windows, then both tails (1 and 2 new frames after their context) in one
    assert [c[0] for c in calls] == [2, 2, 2], calls
    for got, want in zip(audio["fixed"], audio["exact"], strict=True):
        assert got.shape == want.shape and np.abs(got - want).max() < 1e-5


def test_on_a_thread_of_its_own_later_chunks_are_short(tts_engine) -> None:
    """What is left when the talker ends is vocoded after it on the vocoder's thread: its later
    chunks default to BESIDE_CHUNK_FRAMES and its first to one frame, unless the stage config
    names chunk_frames or first_chunk_frames."""
    from edgeomni.runtime.speech.code2wav_stream import BESIDE_CHUNK_FRAMES

    built = stateful(tts_engine).chunks
    assert built.size > BESIDE_CHUNK_FRAMES  # the build's, in the loop's turn
    assert stateful(tts_engine, own_thread=True).chunks.size == BESIDE_CHUNK_FRAMES
    assert stateful(tts_engine, own_thread=True, chunk_frames=20).chunks.size == 20
    assert stateful(tts_engine, own_thread=True).chunks.first == 1 < built.first
    assert stateful(tts_engine, own_thread=True, first_chunk_frames=2).chunks.first == 2


def test_a_call_failing_on_the_vocoders_thread_fails_its_requests(omni_engine, wholes) -> None:
    """A call that raises on the worker thread fails the rows of the step that takes it in, with
    the call's error; their rows go back to the pool and the loop ends."""
    runner = stateful(omni_engine, first_chunk_frames=2, chunk_frames=4, own_thread=True)

    def broken(codes, lens, rows):
        raise RuntimeError("the engine broke")

    runner.step.run = broken
    codes, _ = wholes["omni"][11]
    states = [RequestState(index=i, request=None, plan=SimpleNamespace(stages=("talker",
              "code2wav")), prepared={"codes": codes}) for i in range(2)]  # fmt: skip
    stages = {"talker": FrameSource(), "code2wav": runner.slot_stage()}
    with woken(stages.values()) as idle:
        run_graph(stages, states, {"talker": 2, "code2wav": 2}, idle=idle)
    assert [s.error for s in states] == ["code2wav: RuntimeError: the engine broke"] * 2
    assert runner.step.pool.free == runner.step.pool.state.max_batch


def test_requests_finishing_together_share_their_last_call(omni_engine, wholes) -> None:
    """Two requests the talker speaks in step: every chunk of theirs, the tails the talker's
    last step leaves included, is one call of two rows."""
    runner = stateful(omni_engine, first_chunk_frames=2, chunk_frames=4)
    calls = record_calls(runner)
    codes, whole = wholes["omni"][11]
    states = run_batch(runner, [codes, codes.copy()], width=2)
    assert calls == [[2, 2], [4, 4], [4, 4], [1, 1]]
    for state in states:
        assert np.abs(state.outputs["code2wav:audio"] - whole).max() < TOL


def test_an_onnxruntime_without_batched_past_attention_steps_one_row_a_call(
    omni_engine, wholes, monkeypatch
) -> None:
    """onnxruntime 1.31 refuses the step engine's attention with past context for two rows of
    more than one frame: under an onnxruntime older than BATCHED_PAST_ATTENTION (here: made
    newer than this one), the rows of a call are split into calls of one row (the same audio);
    1.32 and later take them together."""
    import onnxruntime

    from edgeomni.runtime import engine

    have = tuple(int(x) for x in onnxruntime.__version__.split(".")[:2])
    assert stateful(omni_engine).step.max_rows == (1 if have < (1, 32) else 0)
    monkeypatch.setattr(engine, "BATCHED_PAST_ATTENTION", (have[0], have[1] + 1))
    runner = stateful(omni_engine, first_chunk_frames=2, chunk_frames=4)
    assert runner.step.max_rows == 1
    calls = record_calls(runner)
    codes, whole = wholes["omni"][11]
    states = run_batch(runner, [codes, codes.copy()], width=2)
    assert calls == [[2], [2], [4], [4], [4], [4], [1], [1]]
    for state in states:
        assert np.abs(state.outputs["code2wav:audio"] - whole).max() < TOL


@pytest.mark.slow  # its engines come through request.getfixturevalue
@pytest.mark.parametrize("family", list(FAMILIES))
def test_chunks_of_any_size_equal_the_whole_decode(family: str, wholes, request) -> None:
    """One request's frames pushed in uneven bursts, chunked as they come and at the end."""
    runner = stateful(request.getfixturevalue(FAMILIES[family]), first_chunk_frames=2,
                      chunk_frames=7)  # fmt: skip
    codes, whole = max(wholes[family].values(), key=lambda item: len(item[0]))
    audio = in_bursts(runner, codes, (1, 3, 1, 11, 2, 20, 5, 40))
    assert audio.shape == whole.shape
    assert np.abs(audio - whole).max() < TOL


@pytest.mark.slow  # its engines come through request.getfixturevalue
@pytest.mark.parametrize("family", list(FAMILIES))
def test_chunks_padded_to_fixed_sizes_equal_the_whole_decode(family: str, wholes, request) -> None:
    """Where the engine prefers fixed shapes (ONNX Runtime's CUDA provider) a chunk runs padded
    to the chunk size that holds it, its valid frames in chunk_lens: the same audio (the GPU
    path, run here on the CPU)."""
    runner = stateful(request.getfixturevalue(FAMILIES[family]), first_chunk_frames=2,
                      chunk_frames=8)  # fmt: skip
    runner.step.engine.prefers_fixed_shapes = True
    widths: list[tuple[int, int]] = []
    run = runner.step.run

    def recording(codes, lens, states):  # noqa: ANN001, ANN202
        widths.extend((codes.shape[-1], int(n)) for n in lens)
        return run(codes, lens, states)

    runner.step.run = recording
    # after chunks of 2, 4 and 8s, a last one of 7 (Qwen3-Omni) or 5 (Qwen3-TTS): padded to 8
    codes, whole = wholes[family][{"omni": 37, "tts": 75}[family]]
    audio = in_bursts(runner, codes, (1, 3, 1, 5, 2, 7, 3))
    assert {w for w, _ in widths} <= {2, 4, 8, *(n for _, n in widths if n > 8)}
    assert any(n < w for w, n in widths), widths  # some chunks ran padded
    assert audio.shape == whole.shape
    assert np.abs(audio - whole).max() < TOL


def test_an_utterance_of_no_frames_is_empty_audio(omni_engine) -> None:
    runner = stateful(omni_engine)
    stream = runner.stream_for(RequestState(0, None, None), runner.stream_batch())
    assert stream.finish().shape == (0,) and runner.step.calls == 0


def test_the_state_layout_is_declared_and_delays_are_the_trims(omni_engine, tts_engine) -> None:
    """config.json declares every state tensor the step engine takes and returns; a stream's
    first samples that are not audio are Qwen3-Omni's trim (its blocks cut them off the front
    of the whole decode) and none for Qwen3-TTS."""
    import onnx

    for engine, delay in ((omni_engine, 555), (tts_engine, 0)):
        cfg = json.loads((engine / "code2wav_stream" / "config.json").read_text())
        model = onnx.load(str(engine / "code2wav_stream" / cfg["engine"]),
                          load_external_data=False)  # fmt: skip
        names = [t["name"] for t in cfg["state"]]
        assert [i.name for i in model.graph.input] == ["codes", "chunk_lens",
                                                       *("state_" + n for n in names)]  # fmt: skip
        assert [o.name for o in model.graph.output] == ["waveform",
                                                        *("next_state_" + n for n in names)]  # fmt: skip
        assert names[0] == "frames" and {"key_0", "value_0", "conv_0"} <= set(names)
        assert cfg["delay_samples"] == delay
        assert cfg["delay_samples"] == json.loads(
            (engine / "code2wav" / "config.json").read_text())["trim"]  # fmt: skip


def test_the_cuda_lowering_runs_the_same_stream(omni_ckpt, exports, wholes, tmp_path,
                                                monkeypatch) -> None:  # fmt: skip
    """A cuda build's step engine (plain-op attention over its in-graph cache: float32), run on
    the CPU provider, streams the whole decode too, one row a call and two rows of other lengths
    a call."""
    import onnxruntime as ort

    args = BuildArgs(2, 64, 128, device="cuda", code2wav_streaming="stateful")  # opt-in there
    exports.build(omni_ckpt, tmp_path / "eng", args, ["code2wav_stream"])
    folder = tmp_path / "eng" / "code2wav_stream"
    cfg = json.loads((folder / "config.json").read_text())
    session = ort.InferenceSession(str(folder / cfg["engine"]), providers=["CPUExecutionProvider"])
    codes, whole = max(wholes["omni"].values(), key=lambda item: len(item[0]))
    state = {"state_" + t["name"]: np.zeros((1, *t["shape"]), t["dtype"]) for t in cfg["state"]}
    pieces, at = [], 0
    for n in (1, 2, 4, 8, 8, 8, 6):
        out = session.run(None, {"codes": codes[at : at + n].T[None], "chunk_lens": np.array([n]),
                                 **state})  # fmt: skip
        pieces.append(out[0].ravel())
        state = dict(zip(state, out[1:], strict=True))
        at += n
    assert at == len(codes)
    audio = np.concatenate(pieces)[cfg["delay_samples"] :]
    assert np.abs(audio - whole).max() < TOL
    # two rows of other lengths in each call, past context and all: plain-op attention has
    # no GroupQueryAttention's one-row limit, so an onnxruntime before 1.32 takes them together
    from edgeomni.runtime import engine

    monkeypatch.setattr(engine, "BATCHED_PAST_ATTENTION", (99, 0))
    assert engine.OrtEngine(folder / cfg["engine"], cfg).rows_with_past == 0
    assert engine.OrtEngine(folder / cfg["engine"], {**cfg, "lowering": {}}).rows_with_past == 1
    (a, whole_a), (b, whole_b) = sorted(wholes["omni"].values(), key=lambda item: -len(item[0]))[:2]
    state = {"state_" + t["name"]: np.zeros((2, *t["shape"]), t["dtype"]) for t in cfg["state"]}
    pieces_a, pieces_b, at_a, at_b = [], [], 0, 0
    for n_a, n_b in ((1, 2), (2, 1), (4, 3), (8, 8), (8, 5), (8, 8), (8, 8), (8, 8)):
        n_a, n_b = min(n_a, len(a) - at_a), min(n_b, len(b) - at_b)
        n = max(n_a, n_b, 1)
        codes2 = np.zeros((2, a.shape[1], n), np.int64)
        codes2[0, :, :n_a], codes2[1, :, :n_b] = a[at_a : at_a + n_a].T, b[at_b : at_b + n_b].T
        out = session.run(None, {"codes": codes2, "chunk_lens": np.array([n_a, n_b]), **state})
        samples = cfg["samples_per_frame"]
        pieces_a.append(out[0][0, 0, : n_a * samples])
        pieces_b.append(out[0][1, 0, : n_b * samples])
        state = dict(zip(state, out[1:], strict=True))
        at_a, at_b = at_a + n_a, at_b + n_b
    assert (at_a, at_b) == (len(a), len(b)) and len(a) != len(b)
    for pieces, whole in ((pieces_a, whole_a), (pieces_b, whole_b)):
        audio = np.concatenate(pieces)[cfg["delay_samples"] :]
        assert np.abs(audio - whole).max() < TOL


# -- limits ------------------------------------------------------------------------------------
def test_a_chunk_past_the_engines_capacity_is_refused(omni_engine) -> None:
    runner = stateful(omni_engine)
    most = runner.step.max_chunk
    codes = np.zeros((1, runner.num_quantizers, most + 1), np.int64)
    with pytest.raises(ValueError, match=f"{most + 1} frames is more than the step engine's "
                                         f"max_chunk_frames {most}"):  # fmt: skip
        runner.step.run(codes, np.array([most + 1]), [runner.step.fresh()])
    with pytest.raises(ValueError, match=f"code2wav: chunk_frames {most + 1} must be 1..{most}"):
        stateful(omni_engine, chunk_frames=most + 1)
    with pytest.raises(ValueError, match="first_chunk_frames 0 must be"):
        stateful(omni_engine, first_chunk_frames=0)


def test_modes_and_what_they_need(omni_engine, tmp_path: Path) -> None:
    """Windows and whole utterances stay options (runner option or stage config) and load only
    the codes -> waveform engine; stateful without a step engine named is one clear error."""
    folder = omni_engine / "code2wav"
    windows = stateful(omni_engine, streaming="windows")
    assert (windows.mode, windows.step) == ("windows", None)
    assert Code2Wav(stage(), folder, whole_utterance=True).mode == "whole"
    with pytest.raises(ValueError, match="needs the stateful step engine.*--code2wav-streaming"):
        Code2Wav(stage(streaming="stateful"), folder)
    # a runner option that needs no step engine opens without one
    assert Code2Wav(stage(streaming="stateful"), folder, streaming="windows").step is None
    assert Code2Wav(stage(streaming="stateful"), folder, whole_utterance=True).mode == "whole"
    with pytest.raises(ValueError, match="streaming 'chunked': choose stateful or windows"):
        Code2Wav(stage(streaming="chunked"), folder)


def test_the_build_choice(omni_ckpt) -> None:
    """--code2wav-streaming windows leaves the step engine out of "all" (naming it is an
    error saying why); the TensorRT backends default to windows and refuse stateful."""
    from edgeomni.builder.build import left_out
    from edgeomni.export.common.checkpoint import open_checkpoint
    from edgeomni.export.registry import family_for

    ckpt = open_checkpoint(omni_ckpt)
    hooks = family_for(ckpt.model_type).hooks()
    names = [c.name for c in hooks.components(ckpt)]
    assert names[-2:] == ["code2wav", "code2wav_stream"]
    windows = BuildArgs(2, 64, 128, code2wav_streaming="windows")
    picked = select_components(hooks.components(ckpt), None, left_out(hooks, ckpt, windows))
    assert [c.name for c in picked] == names[:-1]
    with pytest.raises(BuildError, match=r"leaves out code2wav_stream \(--code2wav-streaming "):
        select_components(hooks.components(ckpt), ["code2wav_stream"],
                          left_out(hooks, ckpt, windows))  # fmt: skip
    assert BuildArgs(2, 64, 128).code2wav_streaming == "stateful"
    trt = BuildArgs(2, 64, 128, backend="tensorrt", device="cuda")
    assert trt.code2wav_streaming == "windows"
    check_flags(trt)
    with pytest.raises(BuildError, match="no tensorrt lowering yet"):
        check_flags(BuildArgs(2, 64, 128, backend="tensorrt", device="cuda",
                              code2wav_streaming="stateful"))  # fmt: skip


# -- end to end ------------------------------------------------------------------------------
E2E = {
    "omni": (["--voice", "ethan"], {"top_k": 1, "talker_top_k": 1}),
    "tts": (["--voice", "vivian", "--language", "english"],
            {"talker_top_k": 1, "subtalker_top_k": 1}),
}  # fmt: skip


@pytest.mark.slow  # its engines come through request.getfixturevalue
@pytest.mark.parametrize("family", list(FAMILIES))
def test_edge_infer_streams_stateful_as_the_whole_utterance(
    family: str, request, tmp_path: Path
) -> None:
    """edge-infer --out-audio: the graph's default (stateful, the talker's frames vocoded as
    they come), and the same on the vocoder's own thread (--vocoder-threads 1, the rest on the
    other core), write the audio --whole-utterance writes, within 1e-4 (the WAVs are 16-bit);
    windows on the vocoder's own thread write the loop's windows' audio."""
    import soundfile as sf

    from edgeomni.runtime import cli

    engine = request.getfixturevalue(FAMILIES[family])
    flags, sampling = E2E[family]
    sampling = json.dumps({**sampling, "talker_max_new_tokens": 40})
    audio = {}
    windows = ["--code2wav-streaming", "windows"]
    modes = [("stateful", []), ("whole", ["--whole-utterance"]),
             ("beside", ["--vocoder-threads", "1", "--threads", "1"]), ("windows", windows),
             ("windows-beside", [*windows, "--vocoder-threads", "1", "--threads", "1"])]  # fmt: skip
    for mode, extra in modes:
        wav = tmp_path / f"{mode}.wav"
        code = cli.main(["--config", str(engine), "--prompt", "Hello there", *flags,
                         "--out-audio", str(wav), "--max-generate-length", "8",
                         "--sampling", sampling, *extra])  # fmt: skip
        assert code == cli.EXIT_OK
        audio[mode] = sf.read(wav, dtype="float32")[0]
    assert audio["stateful"].size > 24000 // 2  # some frames past the first chunks
    for mode in ("stateful", "beside"):
        assert audio[mode].shape == audio["whole"].shape
        assert np.abs(audio[mode] - audio["whole"]).max() < TOL
    # windows on the vocoder's own thread: the loop's windows' audio
    assert audio["windows-beside"].shape == audio["windows"].shape == audio["whole"].shape
    assert np.abs(audio["windows-beside"] - audio["windows"]).max() < TOL


@pytest.mark.slow  # its engines come through request.getfixturevalue
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_gpu_paths_fixed_buffers_equal_the_whole_decode(family: str, wholes, request) -> None:
    """The step's GPU path (a call's buffers kept per batch size and length, the rows' states
    copied in and their new states copied back into the rows' own buffers), run here over host
    buffers: two requests sharing calls stream the whole decode, and no call allocates."""
    from edgeomni.runtime.buffers import HostBuffers

    class Device(HostBuffers):
        on_host = False  # what sends StepEngine.run down the GPU path

    runner = stateful(request.getfixturevalue(FAMILIES[family]), first_chunk_frames=2,
                      chunk_frames=4)  # fmt: skip
    runner.step.engine.buffers = Device()
    codes = [item for n, item in wholes[family].items() if n > 10][:2]
    batch = runner.stream_batch()
    streams = [runner.stream_for(RequestState(i, None, None), batch) for i in range(2)]
    owned = [[id(b) for b in s.state] for s in streams]
    for at in range(0, 40, 5):
        for stream, (c, _) in zip(streams, codes, strict=True):
            stream(c[at : at + 5])
        batch.decode_ready()
    audio = []
    for stream, (c, _) in zip(streams, codes, strict=True):
        stream(c[40:])
        audio.append(stream.finish())
    assert [[id(b) for b in s.state] for s in streams] == owned  # written in place
    assert any(b == 2 for b, _ in runner.step._slots)  # rows shared calls
    for got, (_, whole) in zip(audio, codes, strict=True):
        assert got.shape == whole.shape
        assert np.abs(got - whole).max() < TOL
