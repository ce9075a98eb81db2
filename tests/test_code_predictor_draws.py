"""The code predictor's engine draws each frame's residual codes itself (export/common/sampler.py)
and feeds each step the embedding of the code the step before drew: the codes equal those of
drawing on the host, greedy and sampled, in cohorts, and a frame the engine cannot decide is
drawn again on the host with the same uniform numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from export_store import ExportStore

from edgeomni.runtime.buffers import DeviceBuffers, HostBuffers
from edgeomni.runtime.decoder import StepOutputs
from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.requests import parse_request_file
from edgeomni.runtime.speech.code_predictor import CodePredictor

sys.path.insert(0, str(Path(__file__).parent))
import omni_reference as ref  # noqa: E402

PROMPTS = ["Hello! How are you today?", "The quick brown fox.", "What is the capital of France?"]
# the talker and code predictor sample (transformers' defaults: top-k 50, top-p 0.8 for the
# residual codes); the thinker stays greedy so every run speaks the same text
SAMPLED = {"top_k": 1, "talker_temperature": 0.9, "talker_top_k": 50, "talker_seed": 1234,
           "talker_max_new_tokens": 12, "talker_min_new_tokens": 12}  # fmt: skip
GREEDY = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 12}


@pytest.fixture(scope="module")
def sampling_engine(
    omni_ckpt: Path, exports: ExportStore, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny Qwen3-Omni built for the CPU with engine sampling on (a cuda build's default;
    a CPU build draws on the host). Only the code predictor's export reads the flag: the other
    components' exports are shared with the session engine's build (export_store.py)."""
    from edgeomni.export.family import BuildArgs

    engine_dir = tmp_path_factory.mktemp("omni-engine-sampling") / "eng"
    args = BuildArgs(max_batch_size=3, max_input_len=128, max_kv_cache_capacity=256,
                     engine_sampling=True)  # fmt: skip
    assert exports.build(omni_ckpt, engine_dir, args,
                         ["llm", "talker", "code_predictor", "code2wav"])  # fmt: skip
    return engine_dir


def _requests(sampling: dict) -> list:
    body = {**sampling, "max_generate_length": 8,
            "requests": [{"messages": ref.messages_for(p)} for p in PROMPTS]}  # fmt: skip
    return parse_request_file(body)[0]


def _run(engine: Path, sampling: dict, *, host: bool, monkeypatch) -> list:
    """``host``: every frame drawn on the host (one two-token call, then the steps); otherwise
    the engine draws, its frame's prefill split in two one-token calls as on a GPU."""
    pipe = Pipeline(engine)
    with monkeypatch.context() as m:
        if host:
            m.setattr(CodePredictor, "engine_frame", lambda *a, **k: None)
        outcomes = pipe.run(_requests(sampling), batch_size=3)
    for o in outcomes:
        assert o.entry["ok"], o.entry
    return outcomes


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_engine_draws_equal_host_draws(sampling_engine, monkeypatch, sampling) -> None:
    engine = _run(sampling_engine, sampling, host=False, monkeypatch=monkeypatch)
    host = _run(sampling_engine, sampling, host=True, monkeypatch=monkeypatch)
    for a, b in zip(engine, host, strict=True):
        talker = a.entry["stages"]["talker"]
        assert talker["code_predictor_draws"] == "engine"
        assert talker["code_predictor_host_frames"] == 0
        assert b.entry["stages"]["talker"]["code_predictor_host_frames"] >= len(b.codes) > 0
        np.testing.assert_array_equal(a.codes, b.codes)
    if sampling is SAMPLED:  # it did sample: the residual codes are not the greedy ones
        greedy = _run(sampling_engine, GREEDY, host=False, monkeypatch=monkeypatch)
        assert any(
            not np.array_equal(a.codes[:, 1:], g.codes[: len(a.codes), 1:])
            for a, g in zip(engine, greedy, strict=True)
        )


def test_an_undecided_frame_is_drawn_again_on_the_host(sampling_engine, monkeypatch) -> None:
    """A row the engine's top-K cannot decide comes out as -1; that frame is drawn again on the
    host from the same uniform numbers, and the run's codes are the host's."""
    host = _run(sampling_engine, SAMPLED, host=True, monkeypatch=monkeypatch)
    calls = [0]
    buffer = StepOutputs.buffer

    def undecided(self, name):  # noqa: ANN001, ANN202
        out = buffer(self, name)
        if name == "sampled_ids":
            calls[0] += 1
            if calls[0] % 37 == 0:  # now and then one row's draw is undecided
                out = out.copy()
                out[calls[0] % len(out)] = -1
        return out

    monkeypatch.setattr(StepOutputs, "buffer", undecided)
    engine = _run(sampling_engine, SAMPLED, host=False, monkeypatch=monkeypatch)
    redrawn = {o.entry["stages"]["talker"]["code_predictor_host_frames"] for o in engine}
    assert redrawn and min(redrawn) > 0
    for a, b in zip(engine, host, strict=True):
        np.testing.assert_array_equal(a.codes, b.codes)


def test_a_frame_summed_where_it_was_drawn_gives_the_host_codes(sampling_engine, monkeypatch):
    """Where the code predictor's engine sums a frame where it draws it (the fused backend on a
    GPU: tests/test_fused_gpu.py), the talker's next step reads that sum as its whole input and
    the host reads the frame's codes once, after the step (SpeechTalker.confirm). Emulated
    here with the CPU engine's frames: the codes are the host path's; a frame the engine could
    not decide (a row -1, its queued sum left wrong) is drawn again on the host and the talker's
    step runs again on the host's sum."""
    from edgeomni.runtime.speech.code_predictor import QueuedFrame

    host = _run(sampling_engine, SAMPLED, host=True, monkeypatch=monkeypatch)
    queued = [0]
    init = CodePredictor.__init__

    def summing(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        init(self, *args, **kwargs)
        self.sums_frames = True

    def queue_frame(self, cp, last_hidden, code0, e0, add, params, rngs, dtype):  # noqa: ANN001, ANN202
        saved = [r.bit_generator.state for r in rngs]
        hidden = np.array(self.engine.buffers.to_host(last_hidden))  # the graph keeps a copy
        codes, embed, _ = self.frame(cp, last_hidden, code0, e0, params, rngs)
        drawn, summed = codes[:, 1:].T.copy(), (embed + add)[:, None, :].astype(dtype)
        queued[0] += 1
        if queued[0] % 4 == 0:  # now and then a row the engine could not decide
            drawn[queued[0] % len(drawn), queued[0] % len(code0)] = -1
            summed[...] = 0
        reader = self._reader(drawn.shape)  # what a GPU's frame queues its codes' read with
        reader.queue(drawn)
        return QueuedFrame(self, cp, hidden, code0, e0, add, params, list(rngs), saved, reader,
                           summed)  # fmt: skip

    monkeypatch.setattr(CodePredictor, "__init__", summing)
    monkeypatch.setattr(CodePredictor, "queue_frame", queue_frame)
    summed = _run(sampling_engine, SAMPLED, host=False, monkeypatch=monkeypatch)
    assert queued[0] >= 8, queued
    talker = [o.entry["stages"]["talker"] for o in summed]
    redrawn = queued[0] // 4  # every queued frame held every request
    assert [t["code_predictor_host_frames"] for t in talker] == [redrawn] * len(summed)
    assert [t["frames_summed_on_device"] for t in talker] == [queued[0] - redrawn] * len(summed)
    for a, b in zip(summed, host, strict=True):
        np.testing.assert_array_equal(a.codes, b.codes)


def test_requests_the_engine_cannot_sample_are_drawn_on_the_host(
    sampling_engine, monkeypatch
) -> None:
    """A residual top-k the engine's top-K cannot hold (0: off, or K and more) is drawn on the
    host for the whole run, as before."""
    sampling = {**SAMPLED, "cp_top_k": 0, "cp_top_p": 0.9}
    outcomes = _run(sampling_engine, sampling, host=False, monkeypatch=monkeypatch)
    talker = outcomes[0].entry["stages"]["talker"]
    assert talker["code_predictor_draws"] == "host"
    assert talker["code_predictor_host_frames"] == 0


def test_each_call_draws_what_the_host_draws_from_its_top_k(sampling_engine, monkeypatch):
    """Call by call: the engine's draw from its top-K and uniform number is the host sampler's
    (the GPU test runs the same check on CUDA engines)."""
    import draw_check

    compared = draw_check.engine_draws_match_host(
        sampling_engine, monkeypatch, bodies=(draw_check.BODY, draw_check.OTHER)
    )
    assert compared >= 2 * 3 * 15 * 12, compared


@pytest.mark.parametrize("residual", [{}, {"cp_top_k": 0, "cp_top_p": 0.9},
                                      {"cp_top_k": 0, "cp_top_p": 1.0}],
                         ids=["top-k-50", "top-p-alone", "full-vocabulary"])  # fmt: skip
def test_a_cpu_build_draws_each_frame_in_one_call_with_the_same_codes(
    omni_engine, sampling_engine, monkeypatch, residual
) -> None:
    """The default CPU build's code predictor is a frame engine (export/common/predictor_frame.py:
    a frame's steps, heads and draws in one call): the same codes as the steps engine drawing on
    the host, for settings a top-K cannot hold too (top-p alone; neither, walked in id order)."""
    import json

    import onnx

    assert json.loads((omni_engine / "code_predictor" / "config.json").read_text())["calls"] == "frame"
    for engine, outputs in ((omni_engine, {"frame_codes", "frame_embeds"}),
                            (sampling_engine, {"sampled_ids"})):  # fmt: skip
        model = onnx.load(str(engine / "code_predictor" / "llm.onnx"), load_external_data=False)
        assert outputs <= {o.name for o in model.graph.output}
    sampling = {**SAMPLED, **residual}
    frame = _run(omni_engine, sampling, host=False, monkeypatch=monkeypatch)
    host = _run(sampling_engine, sampling, host=True, monkeypatch=monkeypatch)
    for a, b in zip(frame, host, strict=True):
        assert a.entry["stages"]["talker"]["code_predictor_draws"] == "engine"
        assert a.entry["stages"]["talker"]["code_predictor_host_frames"] == 0
        np.testing.assert_array_equal(a.codes, b.codes)
    # it did sample: the residual codes are not the greedy ones
    greedy = _run(omni_engine, {**sampling, "cp_temperature": 0.0}, host=False,
                  monkeypatch=monkeypatch)  # fmt: skip
    assert any(not np.array_equal(a.codes[:, 1:], g.codes[:, 1:])
               for a, g in zip(frame, greedy, strict=True))  # fmt: skip


class FakeDevice:
    """A device buffer on the host (memory.DeviceArray faked): views share its data; each
    upload is recorded (the array sent and the buffer's dtype) in ``uploads``."""

    uploads: list[tuple[np.ndarray, np.dtype]] = []

    def __init__(self, shape, dtype, data=None):  # noqa: ANN001
        self.shape, self.dtype, self.lane = tuple(shape), np.dtype(dtype), 0
        self.data = np.zeros(shape, dtype) if data is None else data

    @classmethod
    def zeros(cls, shape, dtype, device=0, lane=0):  # noqa: ANN001, ANN206
        return cls(shape, dtype)

    def rows(self, n: int, start: int = 0) -> FakeDevice:
        return FakeDevice((n, *self.shape[1:]), self.dtype, self.data[start : start + n])

    def view(self, shape: tuple[int, ...]) -> FakeDevice:
        return FakeDevice(shape, self.dtype, self.data.reshape(shape))

    def upload(self, array: np.ndarray) -> None:  # converted to its dtype, as DeviceArray's
        assert array.shape == self.shape
        self.data[...] = array
        FakeDevice.uploads.append((np.array(array), self.dtype))

    def copy_from(self, src: FakeDevice) -> None:
        self.data[...] = src.data


@pytest.fixture
def fake_device(monkeypatch) -> list[tuple[np.ndarray, np.dtype]]:
    """memory.DeviceArray faked by FakeDevice; the uploads made."""
    from edgeomni.runtime import memory

    monkeypatch.setattr(memory, "DeviceArray", FakeDevice)
    monkeypatch.setattr(FakeDevice, "uploads", [])
    return FakeDevice.uploads


def test_a_gpu_frame_stages_its_host_inputs_once(fake_device) -> None:
    """On a GPU (faked here) a frame's uniform numbers and E(c0) go to the device in one upload
    each, before its first call, into buffers kept per cohort size; each step reads its row
    there (two uploads a frame, not two a step). Where the device drew the first codes, E(c0)
    is not sent: its draw wrote it into the same buffer (``first_inputs``)."""
    from types import SimpleNamespace

    cp = CodePredictor.__new__(CodePredictor)
    cp.engine = SimpleNamespace(buffers=DeviceBuffers(),
                                input_types={"inputs_embeds": np.dtype(np.float16)})  # fmt: skip
    cp.hidden_size, cp._staging = 4, {}
    rng = np.random.default_rng(0)
    staged = []
    for _ in range(2):
        uniforms, e0 = rng.random((15, 3)), rng.standard_normal((3, 4)).astype(np.float32)
        rows, first = cp._staged(uniforms, e0)
        assert len(rows) == 15 and all(r.shape == (3,) for r in rows)
        for i, row in enumerate(rows):
            np.testing.assert_array_equal(row.data, uniforms[i])
        np.testing.assert_array_equal(first.data, e0[:, None, :].astype(np.float16))
        staged.append(first)
    # two uploads a frame, none per step, each already in its buffer's type
    assert [a.shape for a, _ in fake_device] == [(15, 3), (3, 1, 4)] * 2
    assert all(a.dtype == dtype for a, dtype in fake_device)
    assert staged[0] is staged[1] and len(cp._staging) == 1  # the same buffers, reused
    fake_device.clear()
    cp._sums, cp.groups = {}, 16
    first, _ = cp.first_inputs(3, np.float16)
    assert first is staged[0]  # where the device's draw writes E(c0) for the frame
    rows, got = cp._staged(uniforms, None)
    assert got is first and [a.shape for a, _ in fake_device] == [(15, 3)]  # numbers only
    cpu = CodePredictor.__new__(CodePredictor)
    cpu.engine = SimpleNamespace(buffers=HostBuffers())
    rows, first = cpu._staged(uniforms, e0)  # a CPU engine: host arrays, nothing staged
    assert isinstance(first, np.ndarray) and first.shape == (3, 1, 4)
    np.testing.assert_array_equal(np.stack(rows), uniforms)


def test_a_frame_graph_is_captured_once_a_cohort_shape(fake_device) -> None:
    """Where the engine captures sequences of calls (the fused backend, faked here), a frame's
    calls are captured as one graph at a cohort shape's first frame and launched for each frame
    after; every frame copies the talker's hidden state into the buffer the graph reads, the
    draw settings go to the device only when they change, and a graph whose buffers changed
    is captured again."""
    from types import SimpleNamespace

    from edgeomni.runtime.sampling import SamplingParams

    class Graph:
        def __init__(self, queue) -> None:  # noqa: ANN001
            self.queue, self.ok, self.launches = queue, True, 0

        def valid(self) -> bool:
            return self.ok

        def launch(self) -> None:
            self.launches += 1

    graphs: list[Graph] = []
    cp = CodePredictor.__new__(CodePredictor)
    cp.engine = SimpleNamespace(
        buffers=DeviceBuffers(),
        input_types={"inputs_embeds": np.dtype(np.float16), "sample_temperature": np.dtype(np.float64)},
        sequence_graph=lambda queue: graphs.append(Graph(queue)) or graphs[-1],
    )  # fmt: skip
    cp.hidden_size, cp._frames, cp._settings, cp._settings_sent = 4, {}, {}, ()
    queued: list[tuple] = []
    cp._queue_frame = lambda *args: queued.append(args)  # what a capture would queue
    rows = [FakeDevice((3,), np.float64) for _ in range(15)]
    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(0.9, 50, 0.8)

    def frame(n: int, params: SamplingParams, value: float) -> None:
        # the talker's output buffer (a new one), or its rows' states gathered on the host
        last = (FakeDevice((n, 4), np.float16, np.full((n, 4), value, np.float16)) if value != 2
                else np.full((n, 4), value, np.float32))  # fmt: skip
        cp._graphed_frame(SimpleNamespace(rows=n, first_row=0), last, "e0", np.ones(n, np.int32),
                          params, rows, ["drawn"])  # fmt: skip

    for i, params in enumerate((greedy, greedy, sampled, sampled)):
        frame(3, params, i)
    assert len(graphs) == 1 and graphs[0].launches == 4
    settings = [tuple(a.ravel()) for a, _ in fake_device if a.size == 1]
    assert settings == [(1.0,), (1,), (1.0,), (0.9,), (50,), (0.8,)]  # greedy: top-k 1 at 1.0
    graphs[0].queue()
    session, hidden, e0, _, draw, uniform_rows, drawn, summed = queued[0]
    assert summed is None  # the frame's embedding sum is not asked for
    assert hidden is cp._frames[(3, 0, 3, None)][1] and np.all(hidden.data == 3)  # the last's
    assert hidden.shape == (3, 1, 4) and hidden.dtype == np.float16
    assert (e0, drawn) == ("e0", ["drawn"])
    assert draw["sample_uniform"] is rows[0] and uniform_rows is rows
    assert {k: v.data.item() for k, v in draw.items() if k != "sample_uniform"} == {
        "sample_temperature": 0.9, "sample_top_k": 50, "sample_top_p": 0.8}
    frame(1, sampled, 0)  # another cohort shape: its own graph
    assert len(graphs) == 2 and graphs[1].launches == 1
    graphs[0].ok = False  # a binding reallocated a buffer the graph reads
    frame(3, sampled, 0)
    assert len(graphs) == 3 and graphs[0].launches == 4 and graphs[2].launches == 1
