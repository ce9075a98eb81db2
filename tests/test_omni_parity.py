"""Qwen3-Omni through edge-infer reproduces transformers on a tiny random checkpoint: thinker
tokens and all 16 code groups identical (greedy), audio within 1e-4 of transformers' waveform."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeomni.runtime import cli
from edgeomni.runtime.audio import read_wav
from edgeomni.runtime.safetensors_np import load

sys.path.insert(0, str(Path(__file__).parent))
import omni_reference as ref  # noqa: E402

# the tiny talker runs the first prompt to the frame cap and stops the second with codec EOS
PROMPTS = ["Hello! How are you today?", "The quick brown fox.", "What is the capital of France?"]
MAX_NEW, MAX_FRAMES = 16, 30
GREEDY = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": MAX_FRAMES + 1}
# ORT and torch differ by ~1e-5 on code2wav (float32 rounding); audio peaks near 0.5
AUDIO_ATOL = 1e-4


@pytest.fixture(scope="module")
def bundle(omni_ckpt: Path) -> ref.OmniBundle:
    """transformers' model of the checkpoint (loaded once: the references and media share it)."""
    return ref.load_bundle(omni_ckpt)


@pytest.fixture(scope="module")
def references(bundle: ref.OmniBundle) -> list[ref.OmniReference]:
    return [
        ref.reference_text(bundle, p, max_new_tokens=MAX_NEW, max_frames=MAX_FRAMES)
        for p in PROMPTS
    ]


def run(
    engine: Path, tmp: Path, requests: list[dict], *flags: str, sampling=GREEDY
) -> tuple[int, list[dict]]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "r.json").write_text(json.dumps({"max_generate_length": MAX_NEW, "requests": requests}))
    code = cli.main(
        ["--config", str(engine), "--input-file", str(tmp / "r.json"),
         "--output-file", str(tmp / "p.json"), "--sampling", json.dumps(sampling), *flags]
    )  # fmt: skip
    return code, json.loads((tmp / "p.json").read_text())["responses"]


def requests_for(prompts: list[str], **extra) -> list[dict]:
    return [{"messages": ref.messages_for(p), **extra} for p in prompts]


@pytest.mark.parametrize("batching", ["inflight", "cohort"])
@pytest.mark.parametrize("flags", [(), ("--stage-streaming",)])
def test_text_to_speech_matches_transformers(
    omni_engine, references, tmp_path, flags, batching
) -> None:
    code, entries = run(
        omni_engine, tmp_path, requests_for(PROMPTS), "--output-audio-dir", str(tmp_path / "a"),
        "--batching", batching, *flags,
    )  # fmt: skip
    assert code == cli.EXIT_OK
    for entry, expected in zip(entries, references, strict=True):
        assert entry["stages"]["thinker"]["output_tokens"] == expected.thinker_tokens
        assert entry["output_text"] == expected.text
        codes = np.asarray(load(entry["rvq_file"])["rvq_codes"])
        assert codes.shape == expected.codes.shape and codes.shape[1] == 16
        np.testing.assert_array_equal(codes, expected.codes)
        audio, rate = read_wav(entry["audio_file"])
        assert rate == entry["audio_sample_rate"] == 24000
        assert entry["audio_samples"] == len(expected.wav)
        # the WAV is 16-bit: compare the float audio through the codes' own decode instead
        assert np.abs(audio - expected.wav).max() < 2 / 32768 + AUDIO_ATOL
    finishes = {e["stages"]["talker"]["finish_reason"] for e in entries}
    assert finishes == {"eos", "length"}  # both ways a talker stops are exercised


@pytest.mark.parametrize("batching", ["inflight", "cohort"])
def test_cohort_equals_requests_alone(omni_engine, references, tmp_path, batching) -> None:
    """Three prompts of different lengths in one cohort (or running batch) give each request's
    solo codes."""
    code, entries = run(
        omni_engine, tmp_path, requests_for(PROMPTS), "--batch-size", "3",
        "--output-audio-dir", str(tmp_path / "a"), "--batching", batching,
    )  # fmt: skip
    assert code == cli.EXIT_OK
    assert {e["stages"]["talker"]["cohort_size"] for e in entries} == {3}
    for entry, expected in zip(entries, references, strict=True):
        assert entry["stages"]["thinker"]["output_tokens"] == expected.thinker_tokens
        np.testing.assert_array_equal(
            np.asarray(load(entry["rvq_file"])["rvq_codes"]), expected.codes
        )


def test_text_only_request_runs_no_speech_stage(omni_engine, references, tmp_path) -> None:
    code, entries = run(omni_engine, tmp_path, requests_for(PROMPTS[:1]))
    assert code == cli.EXIT_OK
    assert set(entries[0]["stages"]) == {"thinker"}
    assert "audio_file" not in entries[0]
    assert entries[0]["stages"]["thinker"]["output_tokens"] == references[0].thinker_tokens


def test_windowed_audio_equals_whole_utterance(omni_engine, references, tmp_path) -> None:
    """With windows of 8 frames (several per utterance) vocoded while the talker runs, the joined
    audio equals one pass over the whole utterance."""
    eng = ref.engine_with_vocoder(omni_engine, tmp_path / "eng", window_frames=8,
                                  left_context_frames=25)  # fmt: skip
    long_prompt = PROMPTS[0]  # the one that runs to the frame cap
    _, windowed = run(
        eng, tmp_path / "w", requests_for([long_prompt]), "--output-audio-dir", str(tmp_path / "w")
    )
    _, whole = run(
        eng, tmp_path / "u", requests_for([long_prompt]), "--output-audio-dir", str(tmp_path / "u"),
        "--whole-utterance",
    )  # fmt: skip
    w, u = windowed[0]["stages"]["code2wav"], whole[0]["stages"]["code2wav"]
    assert (w["mode"], u["mode"]) == ("streamed", "whole")
    assert w["windows"] >= 3 and u["windows"] == 1
    # streamed windows are vocoded while the talker runs, so audio starts before it finishes
    assert w["first_audio_ms"] < u["first_audio_ms"]
    assert w["stall_ms"] >= 0 and u["stall_ms"] == 0  # whole: all audio at once
    a, _ = read_wav(windowed[0]["audio_file"])
    b, _ = read_wav(whole[0]["audio_file"])
    assert len(a) == len(b) == len(references[0].wav)
    assert np.abs(a - b).max() <= 2 / 32768


@pytest.mark.parametrize("batching", ["inflight", "cohort"])
def test_cohort_windows_are_vocoded_together(omni_engine, tmp_path, monkeypatch, batching) -> None:
    """Requests stepping together complete their windows on the same frames: each step's
    windows go to code2wav as one batched call, and every request's audio equals its own run
    alone."""
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file
    from edgeomni.runtime.speech import code2wav

    windows = {"window_frames": 6, "first_window_frames": 3, "left_context_frames": 25}
    eng = ref.engine_with_vocoder(omni_engine, tmp_path / "eng", **windows)
    batches: list[int] = []
    decode_batch = code2wav.Code2Wav.decode_batch

    def counted(self, codes):  # noqa: ANN001, ANN202
        batches.append(len(codes))
        return decode_batch(self, codes)

    monkeypatch.setattr(code2wav.Code2Wav, "decode_batch", counted)
    looks = [0]
    pending = code2wav.WindowedVocoder.pending

    def looked(self):  # noqa: ANN001, ANN202
        looks[0] += 1
        return pending(self)

    monkeypatch.setattr(code2wav.WindowedVocoder, "pending", looked)
    body = {**GREEDY, "max_generate_length": MAX_NEW, "talker_max_new_tokens": 16,
            "talker_min_new_tokens": 16,
            "requests": requests_for(PROMPTS)}  # fmt: skip
    requests, _ = parse_request_file(body)
    together = Pipeline(eng, batching=batching).run(requests, batch_size=3)
    assert batches == [3, 3, 3]  # 15 frames: windows end at frames 3, 9 and 15, all rows at once
    # each row's stream is looked at about once a frame, not once per row's end_step (3 x 3)
    assert looks[0] <= 2 * 3 * 15
    alone = [Pipeline(eng, batching=batching).run([r], batch_size=1)[0] for r in requests]
    assert batches[3:] == [1] * 9
    # a cap splits each step's windows
    capped_eng = ref.engine_with_vocoder(omni_engine, tmp_path / "capped", **windows,
                                         max_windows_per_call=2)  # fmt: skip
    del batches[:]
    capped = Pipeline(capped_eng, batching=batching).run(requests, batch_size=3)
    assert batches == [2, 1] * 3
    talker = together[0].entry["stages"]["talker"]  # the vocoder is a stage, timed apart
    assert together[0].entry["stages"]["code2wav"]["vocode_ms"] > 0
    assert 0 < talker["talker_engine_ms"] <= talker["talker_ms"]
    assert 0 < talker["code_predictor_engine_ms"] <= talker["code_predictor_ms"]
    for a, b, c in zip(together, alone, capped, strict=True):
        assert a.entry["stages"]["code2wav"]["mode"] == "streamed"
        np.testing.assert_array_equal(a.codes, b.codes)
        np.testing.assert_allclose(a.audio, b.audio, atol=1e-5)
        np.testing.assert_allclose(c.audio, b.audio, atol=1e-5)


@pytest.mark.parametrize("batching", ["inflight", "cohort"])
def test_talker_streams_the_thinker_reply(omni_engine, batching) -> None:
    """With stage streaming the talker starts at the reply's first token and reads the
    thinker's later tokens as they come (both stages step in one loop, in a cohort too); text
    and codes are those of running the stages one after the other (audio to float rounding: a
    token projected alone may round differently), for requests whose replies end at different
    steps."""
    from edgeomni.runtime.events import CodecFrames, Finished
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    lengths_asked = (16, 6, 11)
    reqs = [
        {**r, "max_generate_length": n}
        for r, n in zip(requests_for(PROMPTS), lengths_asked, strict=True)
    ]
    requests, _ = parse_request_file({**GREEDY, "requests": reqs})
    events: list = []
    streamed = Pipeline(omni_engine, stream_stages=True, batching=batching).run(
        requests, batch_size=3, listener=events.append
    )
    serial = Pipeline(omni_engine, batching=batching).run(requests, batch_size=3)
    lengths = set()
    for a, b in zip(streamed, serial, strict=True):
        assert a.entry["ok"] and b.entry["ok"], (a.entry, b.entry)
        assert a.entry["output_text"] == b.entry["output_text"]
        lengths.add(a.entry["stages"]["thinker"]["generated_tokens"])
        np.testing.assert_array_equal(a.codes, b.codes)
        np.testing.assert_allclose(a.audio, b.audio, atol=1e-5)
        assert a.entry["stages"]["talker"]["cohort_size"] == 3
    assert len(lengths) == 3
    # either batching: the longest reply was spoken while it was still written
    frames = [n for n, e in enumerate(events) if isinstance(e, CodecFrames) and e.index == 0]
    done = [n for n, e in enumerate(events)
            if isinstance(e, Finished) and (e.index, e.stage) == (0, "thinker")]  # fmt: skip
    assert frames and frames[0] < done[0]


def test_streamed_request_without_reply_fails_alone(omni_engine, references) -> None:
    """Streamed, a reply the talker cannot speak (one token, which the thinker never feeds)
    fails its request with the reason once the thinker finishes it; its cohort still speaks."""
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    reqs = requests_for(PROMPTS[:2])
    reqs[1]["max_generate_length"] = 1
    requests, _ = parse_request_file({**GREEDY, "max_generate_length": MAX_NEW, "requests": reqs})
    outcomes = Pipeline(omni_engine, stream_stages=True).run(requests, batch_size=2)
    assert outcomes[0].entry["ok"], outcomes[0].entry
    np.testing.assert_array_equal(outcomes[0].codes, references[0].codes)
    assert not outcomes[1].entry["ok"]
    assert "the thinker wrote no text for the talker to speak" in outcomes[1].entry["error"]


def test_placeholder_tokens_without_media_fail_the_request(omni_engine, tmp_path) -> None:
    """Typed media placeholder tokens have no encoder states for the talker to read: that
    request fails with the reason; the other speaks."""
    prompts = ["Say <|audio_pad|> please.", "Hello there."]
    code, entries = run(omni_engine, tmp_path, requests_for(prompts),
                        "--output-audio-dir", str(tmp_path / "a"))  # fmt: skip
    assert code == cli.EXIT_REQUESTS_FAILED
    assert (
        not entries[0]["ok"] and "placeholder tokens but no audio or image" in entries[0]["error"]
    )
    assert entries[1]["ok"]


def test_unknown_voice_lists_the_voices(omni_engine, tmp_path) -> None:
    reqs = requests_for(PROMPTS[:1], voice="nobody") + requests_for(PROMPTS[:1], voice="Chelsie")
    code, entries = run(omni_engine, tmp_path, reqs, "--output-audio-dir", str(tmp_path / "a"))
    assert code == cli.EXIT_REQUESTS_FAILED
    assert not entries[0]["ok"] and "chelsie, ethan" in entries[0]["error"]
    assert entries[1]["ok"] and entries[1]["stages"]["talker"]["voice"] == "chelsie"


def test_missing_required_input_fails_only_those_requests(omni_engine, tmp_path) -> None:
    """A graph whose talker requires a voice: requests without one fail alone, and text-only
    requests (which do not need the talker) still succeed."""
    eng = tmp_path / "eng"
    shutil.copytree(omni_engine, eng)
    graph = json.loads((eng / "multistage_config.json").read_text())
    talker = next(s for s in graph["stages"] if s["id"] == "talker")
    next(i for i in talker["inputs"] if i["name"] == "voice")["on_missing"] = "fail"
    (eng / "multistage_config.json").write_text(json.dumps(graph))
    reqs = requests_for(PROMPTS[:1]) + requests_for(PROMPTS[:1], voice="ethan")
    code, entries = run(eng, tmp_path, reqs, "--output-audio-dir", str(tmp_path / "a"))
    assert code == cli.EXIT_REQUESTS_FAILED
    assert not entries[0]["ok"] and "voice" in entries[0]["error"]
    assert entries[1]["ok"] and "audio_file" in entries[1]
    code, entries = run(eng, tmp_path / "t", requests_for(PROMPTS[:1]))  # text only: no talker
    assert code == cli.EXIT_OK and entries[0]["ok"]


@pytest.fixture(scope="module")
def media(bundle: ref.OmniBundle, tmp_path_factory) -> dict:
    """A 2 s, 16 kHz clip and a 64x96 image on disk, and transformers' answers to them."""
    from edgeomni.runtime.audio import write_wav

    pytest.importorskip("PIL", reason="image files are read with Pillow (the 'image' extra)")
    from PIL import Image

    folder = tmp_path_factory.mktemp("media")
    rng = np.random.default_rng(0)
    t = np.arange(32000) / 16000
    wave = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)).astype(
        np.float32
    )
    write_wav(folder / "q.wav", wave, 16000)
    heard, _ = read_wav(folder / "q.wav")  # the 16-bit file both sides read
    image = (rng.random((64, 96, 3)) * 255).astype(np.uint8)
    Image.fromarray(image).save(folder / "i.png")
    kw = dict(max_new_tokens=MAX_NEW, max_frames=MAX_FRAMES)
    return {
        "audio": (folder / "q.wav", ref.reference_audio(bundle, heard, "Listen.", **kw)),
        "image": (folder / "i.png", ref.reference_image(bundle, image, "Describe it.", **kw)),
    }


@pytest.mark.parametrize(
    ("kind", "flags"), [("audio", ()), ("image", ()), ("image", ("--stage-streaming",))]
)
def test_media_input_matches_transformers(omni_engine, media, tmp_path, kind, flags) -> None:
    """Audio through the audio encoder, an image through the vision encoder (3-D positions,
    DeepStack; streamed, the talker reads the image's hidden states while the thinker still
    decodes): thinker tokens, all 16 code groups and the audio equal transformers'."""
    path, expected = media[kind]
    prompt = "Listen." if kind == "audio" else "Describe it."
    content = [{"type": kind, kind: str(path)}, {"type": "text", "text": prompt}]
    code, entries = run(
        omni_engine, tmp_path, [{"messages": [{"role": "user", "content": content}]}],
        "--output-audio-dir", str(tmp_path / "a"), *flags,
    )  # fmt: skip
    assert code == cli.EXIT_OK, entries[0]["error"]
    entry = entries[0]
    assert entry["stages"]["thinker"]["prompt_tokens"] == len(expected.prompt_ids)
    assert entry["stages"]["thinker"]["output_tokens"] == expected.thinker_tokens
    np.testing.assert_array_equal(np.asarray(load(entry["rvq_file"])["rvq_codes"]), expected.codes)
    audio, _ = read_wav(entry["audio_file"])
    assert len(audio) == len(expected.wav)
    assert np.abs(audio - expected.wav).max() < 2 / 32768 + AUDIO_ATOL


@pytest.mark.parametrize("batching", ["inflight", "cohort"])
def test_voices_split_cohorts(omni_engine, tmp_path, batching) -> None:
    """In cohorts, requests with different voices go to different cohorts and equal voices
    share one; in flight each request holds its own voice in one running batch. Either way a
    request's codes are those of its voice alone."""
    reqs = requests_for(PROMPTS[:2], voice="ethan") + requests_for(PROMPTS[:1], voice="chelsie")
    code, entries = run(
        omni_engine, tmp_path, reqs, "--batch-size", "3", "--output-audio-dir", str(tmp_path / "a"),
        "--batching", batching,
    )  # fmt: skip
    assert code == cli.EXIT_OK
    sizes = [e["stages"]["talker"]["cohort_size"] for e in entries]
    voices = [e["stages"]["talker"]["voice"] for e in entries]
    assert voices == ["ethan", "ethan", "chelsie"]
    assert sizes == ([2, 2, 1] if batching == "cohort" else [3, 3, 3])
    _, alone = run(omni_engine, tmp_path / "c", reqs[2:], "--output-audio-dir", str(tmp_path / "c"))
    np.testing.assert_array_equal(
        load(entries[2]["rvq_file"])["rvq_codes"], load(alone[0]["rvq_file"])["rvq_codes"]
    )
