"""The talker's first codes drawn on the device (SpeechTalker.draw, the fused backend on a GPU:
plugins/speech_draw_cuda.py and tests/test_fused_gpu.py), each step's draw followed by the next
step's frame queued before the host reads the draw. Emulated here on the CPU build of the tiny
Qwen3-Omni with a top-K: the engine's draw by the kernel's numpy reference, the frame summed
where it was drawn by the code predictor's own calls. The codes equal the host's draws, greedy
and sampled, with requests ending at different steps and more requests than rows (a frame
queued ahead for rows that change is dropped, its numbers drawn again), and where the top K
cannot decide a row (the host draws that step)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from export_store import ExportStore

from edgeomni.plugins import speech_draw_cuda as sdc
from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.requests import parse_request_file
from edgeomni.runtime.speech.code_predictor import CodePredictor, QueuedFrame
from edgeomni.runtime.speech.talker import SpeechTalker

sys.path.insert(0, str(Path(__file__).parent))
import omni_reference as ref  # noqa: E402

PROMPTS = ["Hello! How are you today?", "The quick brown fox.", "What is the capital of France?"]
FRAMES = (12, 7, 10)  # each request's frame limit
GREEDY = {"top_k": 1, "talker_top_k": 1}
SAMPLED = {"top_k": 1, "talker_temperature": 0.9, "talker_top_k": 50, "talker_seed": 1234,
           "talker_repetition_penalty": 1.3}  # fmt: skip


@pytest.fixture(scope="module")
def topk_engine(
    omni_ckpt: Path, exports: ExportStore, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny Qwen3-Omni built for the CPU with the GPU build's outputs: the talker's top 64
    (its control band kept out) and the code predictor's sampler."""
    from edgeomni.export.family import BuildArgs

    engine_dir = tmp_path_factory.mktemp("omni-engine-topk") / "eng"
    args = BuildArgs(max_batch_size=3, max_input_len=128, max_kv_cache_capacity=256,
                     engine_sampling=True, logits_topk=64)  # fmt: skip
    assert exports.build(omni_ckpt, engine_dir, args,
                         ["llm", "talker", "code_predictor", "code2wav"])  # fmt: skip
    return engine_dir


def _run(engine: Path, sampling: dict, batch_size: int) -> list:
    """The prompts, each with its own frame limit: rows finish at different steps."""
    body = {**sampling, "max_generate_length": 8,
            "requests": [{"messages": ref.messages_for(p),
                          "sampling": {"talker_max_new_tokens": frames}}
                         for p, frames in zip(PROMPTS, FRAMES, strict=True)]}  # fmt: skip
    outcomes = Pipeline(engine).run(parse_request_file(body)[0], batch_size=batch_size)
    for o in outcomes:
        assert o.entry["ok"], o.entry
    return outcomes


def _on_the_device(monkeypatch, undecided_every: int = 0) -> dict[str, int]:  # noqa: ANN001
    """The talker engine drawing first codes and the code predictor summing frames, as the
    fused engines do, emulated with host arrays; every ``undecided_every``-th draw leaves one
    row undecided (-1). Returns the counts of draws and of frames queued."""
    counts = {"draws": 0, "undecided": 0, "ahead": 0, "ahead_used": 0}
    last: dict[str, np.ndarray] = {}

    def draw_first(values, ids, marks, uniform, table, drawn, base, first,  # noqa: ANN001
                   **settings) -> None:  # noqa: ANN003
        penalty = settings.pop("penalty")
        got, rows = sdc.first_draw_reference(values, ids, marks, penalty, uniform, table=table,
                                             **settings)
        counts["draws"] += 1
        if undecided_every and counts["draws"] % undecided_every == 0:
            got[counts["draws"] % len(got)] = -1
            counts["undecided"] += 1
        drawn[...] = got
        base[...] = rows
        first[...] = rows.reshape(first.shape).astype(first.dtype)
        last["code0"] = got.copy()

    init = SpeechTalker.__init__

    def drawing(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        init(self, *args, **kwargs)
        self.engine.draws_first = True
        self.engine.draw_first = draw_first
        self.cp.sums_frames = True

    def queue_frame(self, cp, last_hidden, code0, e0, add, params,  # noqa: ANN001, ANN202
                    rngs, dtype, before=None):  # noqa: ANN001
        n = len(add)
        if before is not None:  # the device's draw, queued right before the frame
            before()
        if e0 is None:  # the device's draw wrote E(c0) where the frame reads it
            e0 = np.array(self.first_inputs(n, dtype)[1])
            code0 = last["code0"]
            given = None
        else:
            given = code0, e0
        saved = [r.bit_generator.state for r in rngs]
        hidden = np.array(self.engine.buffers.to_host(last_hidden))  # the graph keeps a copy
        codes, embed, _ = self.frame(cp, last_hidden, code0, e0, params, rngs)
        drawn, summed = codes[:, 1:].T.copy(), (embed + add)[:, None, :].astype(dtype)
        reader = self._reader(drawn.shape)  # as a GPU's: one pinned buffer holds its last copy
        reader.queue(drawn)
        frame = QueuedFrame(self, cp, hidden, *(given or (None, None)), add, params, list(rngs),
                            saved, reader, summed)  # fmt: skip
        frame.ahead = given is None  # type: ignore[attr-defined]
        counts["ahead"] += frame.ahead  # type: ignore[attr-defined]
        return frame

    read = QueuedFrame.codes

    def codes(self):  # noqa: ANN001, ANN202
        counts["ahead_used"] += self.ahead
        return read(self)

    monkeypatch.setattr(SpeechTalker, "__init__", drawing)
    monkeypatch.setattr(CodePredictor, "queue_frame", queue_frame)
    monkeypatch.setattr(QueuedFrame, "codes", codes)
    return counts


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("batch_size", [3, 2], ids=["one-cohort", "in-flight"])
def test_first_codes_drawn_on_the_device_are_the_host_draws(
    topk_engine, monkeypatch, sampling, batch_size
) -> None:
    """Every step of a full cohort draws on the device (a step where rows differ from the
    frame queued ahead, the host: its numbers drawn again), and the codes are the host's."""
    host = _run(topk_engine, sampling, batch_size)
    for o in host:
        assert o.entry["stages"]["talker"]["first_codes_drawn_on_device"] == 0
    counts = _on_the_device(monkeypatch)
    device = _run(topk_engine, sampling, batch_size)
    drawn = [o.entry["stages"]["talker"]["first_codes_drawn_on_device"] for o in device]
    assert counts["draws"] > 0 and max(drawn) > 0, (counts, drawn)
    for a, b in zip(device, host, strict=True):
        np.testing.assert_array_equal(a.codes, b.codes)
    # most frames were queued ahead; where rows finished, the one queued for them went unused
    assert len({len(o.codes) for o in host}) == len(PROMPTS)
    assert 0 < counts["ahead_used"] < counts["ahead"], counts


def test_a_step_the_top_k_cannot_decide_is_drawn_on_the_host(topk_engine, monkeypatch) -> None:
    """A row drawn -1 sends the whole step to the host, from the same numbers: the codes are
    the host's, and those steps are not counted as drawn on the device."""
    host = _run(topk_engine, SAMPLED, 3)
    counts = _on_the_device(monkeypatch, undecided_every=3)
    device = _run(topk_engine, SAMPLED, 3)
    assert counts["undecided"] > 0
    drawn = max(o.entry["stages"]["talker"]["first_codes_drawn_on_device"] for o in device)
    assert 0 < drawn <= counts["draws"] - counts["undecided"]
    for a, b in zip(device, host, strict=True):
        np.testing.assert_array_equal(a.codes, b.codes)
