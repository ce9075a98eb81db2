"""Qwen3-Omni under in-flight batching (scheduler.run_graph over the thinker's, talker's and
code2wav's slot stages): requests join each stage's running batch as rows free up, move on to
the next stage the step they finish, and give what each gives alone: text, all 16 code groups
and audio; their events arrive in order and make their outputs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeomni.runtime.events import AudioChunk, CodecFrames, Failed, Finished, TextDelta
from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.requests import parse_request_file

sys.path.insert(0, str(Path(__file__).parent))
import omni_reference as ref  # noqa: E402

PROMPTS = [
    "Hello! How are you today?",
    "The quick brown fox.",
    "What is the capital of France?",
    "Hi",
    "Count to ten, slowly please.",
]
LENGTHS = [16, 5, 11, 3, 8]  # replies of different lengths: rows free up at different steps
GREEDY = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 24}
SPEECH = ("thinker", "talker", "code2wav")


def body(**extra: Any) -> dict:
    return {
        **GREEDY,
        "requests": [
            {"messages": ref.messages_for(p), "max_generate_length": n}
            for p, n in zip(PROMPTS, LENGTHS, strict=True)
        ],
        **extra,
    }


def run(engine: Path, obj: dict, batch_size: int, listener=None, **kw: Any) -> list:
    requests, _ = parse_request_file(obj)
    return Pipeline(engine, **kw).run(requests, batch_size=batch_size, listener=listener)


@pytest.fixture(scope="module")
def alone(omni_engine: Path) -> list:
    obj = body()
    return [run(omni_engine, {**obj, "requests": [r]}, 1)[0] for r in obj["requests"]]


def same(got: Any, want: Any) -> None:
    assert got.entry["ok"], got.entry["error"]
    assert got.entry["output_text"] == want.entry["output_text"]
    for sid in ("thinker", "talker"):
        assert (
            got.entry["stages"][sid]["finish_reason"] == want.entry["stages"][sid]["finish_reason"]
        )
    assert got.codes.shape[1] == 16
    np.testing.assert_array_equal(got.codes, want.codes)
    np.testing.assert_allclose(got.audio, want.audio, atol=1e-5)


@pytest.mark.parametrize("stream", [False, True])
def test_speech_inflight_equals_each_request_alone(omni_engine, alone, stream) -> None:
    """Five requests through two rows per stage: each request's text, codes and audio are what
    it gives alone, and a request starts speaking while another still speaks."""
    events: list[Any] = []
    got = run(omni_engine, body(), 2, events.append, stream_stages=stream)
    for g, a in zip(got, alone, strict=True):
        same(g, a)
        assert g.entry["stages"]["talker"]["batching"] == "inflight"
    assert max(o.entry["stages"]["talker"]["cohort_size"] for o in got) == 2
    # request j's first frame came while request i was still speaking, i started first
    first, last = {}, {}
    for n, e in enumerate(events):
        if isinstance(e, CodecFrames):
            first.setdefault(e.index, n)
        if isinstance(e, Finished) and e.stage == "talker":
            last[e.index] = n
    assert any(first[i] < first[j] < last[i] and j >= 2 for i in first for j in first)
    finishes = {o.entry["stages"]["talker"]["finish_reason"] for o in got}
    assert finishes == {"eos", "length"}  # both ways a talker stops, among rows in flight


@pytest.mark.parametrize("batching", ["inflight", "cohort"])
def test_speech_events_arrive_in_order_and_make_the_outputs(
    omni_engine, tmp_path, batching
) -> None:
    # windows of 6 frames (3 first): audio comes while the talker runs
    eng = ref.engine_with_vocoder(
        omni_engine, tmp_path / "eng", window_frames=6, first_window_frames=3,
        left_context_frames=25,
    )  # fmt: skip
    events: list[Any] = []
    got = run(eng, body(), 3, events.append, batching=batching)
    for i, outcome in enumerate(got):
        mine = [e for e in events if e.index == i]
        # every stage's own events end with its Finished (the talker's frames and code2wav's
        # audio interleave: the vocoder runs while the talker does)
        for sid in SPEECH:
            of_stage = [e for e in mine if e.stage == sid]
            assert isinstance(of_stage[-1], Finished)
            assert not any(isinstance(e, Finished) for e in of_stage[:-1])
        done = [e.stage for e in mine if isinstance(e, Finished)]
        assert done == list(SPEECH)
        assert mine[-1] == Finished(i, "code2wav", "complete")
        assert [e.reason for e in mine if isinstance(e, Finished)][:2] == [
            outcome.entry["stages"][sid]["finish_reason"] for sid in SPEECH[:2]
        ]
        text = "".join(e.text for e in mine if isinstance(e, TextDelta))
        assert text == outcome.entry["output_text"]
        frames = [e.codes for e in mine if isinstance(e, CodecFrames)]
        np.testing.assert_array_equal(np.concatenate(frames), outcome.codes)
        chunks = [e for e in mine if isinstance(e, AudioChunk)]
        assert [c.offset for c in chunks] == list(
            np.cumsum([0] + [c.samples.size for c in chunks[:-1]])
        )
        assert {c.sample_rate for c in chunks} == {24000}
        np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), outcome.audio)
        # the first audio came before the talker finished: vocoded while it ran
        talker_done = next(n for n, e in enumerate(mine)
                           if isinstance(e, Finished) and e.stage == "talker")  # fmt: skip
        if len(outcome.codes) > 3 and batching == "inflight":
            assert mine.index(chunks[0]) < talker_done


def test_speech_request_failing_mid_run_leaves_alone(omni_engine, alone, monkeypatch) -> None:
    """A request whose talker fails after a few frames fails alone: the others' text, codes and
    audio are unchanged, and its vocoder slot is dropped."""
    from edgeomni.runtime.decoder_stage import DecoderStage

    real = DecoderStage.update

    def update(self, slot, events):  # noqa: ANN001, ANN202
        if self.stage_id == "talker" and slot.state.index == 2 and slot.data.made == 3:
            raise RuntimeError("boom")
        return real(self, slot, events)

    monkeypatch.setattr(DecoderStage, "update", update)
    events: list[Any] = []
    got = run(omni_engine, body(), 2, events.append)
    assert [o.entry["ok"] for o in got] == [True, True, False, True, True]
    assert got[2].entry["error"] == "talker: RuntimeError: boom"
    assert got[2].audio is None and "code2wav" not in got[2].entry["stages"]
    assert [e for e in events if isinstance(e, Failed)] == [
        Failed(2, "talker", "talker: RuntimeError: boom")
    ]
    # what the vocoder streamed of the frames made before the failure may have gone out (the
    # stateful stream vocodes a first chunk of 2 frames at once); nothing more, and no Finished
    mine = [e for e in events if e.index == 2 and e.stage == "code2wav"]
    assert not [e for e in mine if isinstance(e, Finished)]
    assert sum(e.samples.size for e in mine) <= 3 * 1920
    for i in (0, 1, 3, 4):
        same(got[i], alone[i])


def test_whole_utterance_inflight_equals_alone(omni_engine, alone) -> None:
    """Vocoding whole utterances, a request joins code2wav once its codes are complete; its
    audio is its windowed audio to float rounding."""
    got = run(omni_engine, body(), 2, whole_utterance=True)
    for g, a in zip(got, alone, strict=True):
        assert g.entry["stages"]["code2wav"]["mode"] == "whole"
        np.testing.assert_array_equal(g.codes, a.codes)
        assert np.abs(g.audio - a.audio).max() <= 1e-4
