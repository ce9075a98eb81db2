"""edge-infer's audio files come from the event stream: a request's WAV and codes are written
the moment its vocoder finishes it, from its chunks and frames, as upstream names them."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeomni.runtime import cli
from edgeomni.runtime.audio import read_wav
from edgeomni.runtime.events import AudioChunk, CodecFrames, Failed, Finished, TextDelta
from edgeomni.runtime.outputs import AudioWriter
from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.safetensors_np import load

sys.path.insert(0, str(Path(__file__).parent))
import omni_reference as ref  # noqa: E402

RATE = 24000


def writer(tmp_path: Path, **kw: Any) -> AudioWriter:
    return AudioWriter({"code2wav"}, {"talker"}, out_dir=tmp_path / "a", **kw)


def speak(w: AudioWriter, index: int, pieces: list[np.ndarray], frames: np.ndarray) -> None:
    w(CodecFrames(index, "talker", frames[:2]))
    offset = 0
    for piece in pieces:
        w(AudioChunk(index, "code2wav", piece, offset, RATE))
        offset += len(piece)
    w(CodecFrames(index, "talker", frames[2:]))
    w(Finished(index, "talker", "eos"))


def test_a_request_is_written_when_its_vocoder_finishes(tmp_path: Path) -> None:
    w = writer(tmp_path)
    rng = np.random.default_rng(0)
    pieces = [rng.uniform(-0.5, 0.5, n).astype(np.float32) for n in (1920, 3840, 960)]
    frames = rng.integers(0, 2048, (5, 16))
    speak(w, 3, pieces, frames)
    w(TextDelta(3, "thinker", "hi", (1,)))  # other stages' events are not audio
    assert not (tmp_path / "a").exists()  # not before code2wav finished it
    w(Finished(3, "code2wav", "complete"))
    wav, codes = tmp_path / "a" / "audio_req3.wav", tmp_path / "a" / "rvq_req3.safetensors"
    assert w.fields == {3: {
        "rvq_file": str(codes), "audio_file": str(wav), "audio_samples": 6720,
        "audio_sample_rate": RATE, "audio_duration_ms": 280,
    }}  # fmt: skip
    audio, rate = read_wav(wav)
    assert rate == RATE
    np.testing.assert_allclose(audio, np.concatenate(pieces), atol=1 / 32767)  # 16-bit PCM
    rvq = load(codes)["rvq_codes"]
    assert rvq.dtype == np.int32
    np.testing.assert_array_equal(rvq, frames)


def test_an_utterance_of_no_audio_is_an_empty_wav(tmp_path: Path) -> None:
    w = AudioWriter({"code2wav"}, {"talker"}, out_audio=tmp_path / "one.wav")
    w(AudioChunk(0, "code2wav", np.zeros(0, np.float32), 0, RATE))
    w(Finished(0, "code2wav", "complete"))
    assert w.fields[0]["audio_samples"] == 0 and (tmp_path / "one.wav").is_file()
    assert "rvq_file" not in w.fields[0]  # one file: --out-audio writes no codes


def test_a_failed_request_writes_nothing_and_chunks_must_follow_on(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w(AudioChunk(0, "code2wav", np.ones(10, np.float32), 0, RATE))
    w(Failed(0, "talker", "boom"))
    w(Finished(0, "code2wav", "complete"))  # nothing left of it to write
    assert w.fields == {} and not (tmp_path / "a").exists()
    w(AudioChunk(1, "code2wav", np.ones(10, np.float32), 0, RATE))
    with pytest.raises(RuntimeError, match="chunk at sample 20, expected 10"):
        w(AudioChunk(1, "code2wav", np.ones(10, np.float32), 20, RATE))


def test_the_first_failed_write_is_kept_and_stops_the_writing(tmp_path: Path, monkeypatch) -> None:
    def full(*args: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("edgeomni.runtime.outputs.write_wav", full)
    w = writer(tmp_path)
    for i in range(2):
        w(AudioChunk(i, "code2wav", np.ones(10, np.float32), 0, RATE))
        w(Finished(i, "code2wav", "complete"))
    assert isinstance(w.error, OSError) and w.error.errno == errno.ENOSPC
    assert w.fields == {}


def test_edge_infer_writes_each_wav_while_the_others_still_run(
    omni_engine: Path, tmp_path: Path, monkeypatch
) -> None:
    """Three requests, one row per stage, in flight: each request's WAV is on disk when its
    vocoder's Finished has been heard, before the last request has been spoken; the files and
    the entries are what the run's outcomes hold."""
    out = tmp_path / "a"
    seen: list[tuple[Any, set[str]]] = []
    outcomes: list[Any] = []
    real = Pipeline.run

    def run(self, requests, **kw):  # noqa: ANN001, ANN202
        listener = kw["listener"]

        def hear(event: Any) -> None:
            listener(event)
            seen.append((event, {p.name for p in out.glob("*.wav")} if out.exists() else set()))

        outcomes.extend(real(self, requests, **{**kw, "listener": hear}))
        return outcomes

    monkeypatch.setattr(Pipeline, "run", run)
    prompts = ["Hello! How are you today?", "Hi", "The quick brown fox."]
    body = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 12, "max_generate_length": 6,
            "requests": [{"messages": ref.messages_for(p)} for p in prompts]}  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps(body))
    code = cli.main(["--config", str(omni_engine), "--input-file", str(tmp_path / "r.json"),
                     "--output-file", str(tmp_path / "p.json"), "--output-audio-dir", str(out),
                     "--batch-size", "1"])  # fmt: skip
    assert code == cli.EXIT_OK
    last_spoken = next(n for n, (e, _) in enumerate(seen)
                       if isinstance(e, Finished) and e.index == 2 and e.stage == "talker")  # fmt: skip
    spoken = {e.index: n for n, (e, _) in enumerate(seen)
              if isinstance(e, Finished) and e.stage == "code2wav"}  # fmt: skip
    assert spoken[0] < last_spoken
    for i, n in spoken.items():
        assert f"audio_req{i}.wav" in seen[n][1]
    entries = json.loads((tmp_path / "p.json").read_text())["responses"]
    for i, (entry, outcome) in enumerate(zip(entries, outcomes, strict=True)):
        audio, rate = read_wav(entry["audio_file"])
        assert rate == RATE and entry["audio_samples"] == len(outcome.audio) == len(audio)
        np.testing.assert_allclose(audio, outcome.audio, atol=1 / 32767)
        codes = load(entry["rvq_file"])["rvq_codes"]
        np.testing.assert_array_equal(codes, outcome.codes)
        assert entry["rvq_file"].endswith(f"rvq_req{i}.safetensors")


def test_an_utterance_of_no_frames_gives_empty_codes_and_audio(tmp_path: Path) -> None:
    """A talker that ends speech at its first code still reports its (empty) codes, and the
    request's files are written: no frames, no samples."""
    from types import SimpleNamespace

    from edgeomni.runtime.decoder_stage import DecoderStage, Slot
    from edgeomni.runtime.speech.talker import SpeechTalker, _Speech

    talker = SpeechTalker.__new__(SpeechTalker)  # its spec's rules, no engine
    talker.stage_id, talker.consumes, talker.ids, talker.groups = (
        "talker",
        False,
        {"codec_eos": 5},
        16,
    )
    slot = Slot(SimpleNamespace(index=3), 0, _Speech(None, None, max_frames=10, min_frames=0),
                None, None, length=4, generated=[5])  # fmt: skip
    events = DecoderStage(talker).update(slot, True)
    assert slot.finish == "eos" and [type(e) for e in events] == [CodecFrames, Finished]
    assert events[0].codes.shape == (0, 16) and events[0].index == 3
    w = writer(tmp_path)
    w(events[0])
    w(AudioChunk(3, "code2wav", np.zeros(0, np.float32), 0, RATE))
    w(Finished(3, "code2wav", "complete"))
    assert w.fields[3]["audio_samples"] == 0
    assert load(w.fields[3]["rvq_file"])["rvq_codes"].shape == (0, 16)
