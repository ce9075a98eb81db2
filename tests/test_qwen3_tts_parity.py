"""Qwen3-TTS engines built by edge-build == upstream qwen-tts 0.1.1, request by request.

The reference fixture runs upstream, unmodified, in its own venv on tiny seeded CustomVoice
(0.6B-style, and 1.7B-style with an instruction) and VoiceDesign checkpoints, greedy with the
release's repetition penalty (1.05), 12 talker steps (the codec EOS row is zeroed, so a run
makes 11 frames, but in STOPPED, whose talker chooses EOS by itself). Here the same checkpoints go through
edge-build and edge-infer's pipeline with the same request: the codes must be identical and the
audio within AUDIO_ATOL. Batched requests with different voices, languages and text modes must
each equal the request alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.requests import parse_request_file

MODES = (
    "cv_plain_stream", "cv_plain_nonstream", "cv_dialect_stream", "cv_dialect_nonstream",
    "vd_stream", "vd_nonstream", "cv_instruct_stream", "cv_instruct_nonstream",
    "base_xvec_stream", "base_xvec_nonstream", "base_icl_stream", "base_icl_nonstream",
    "base_icl2_stream", "base_icl2_nonstream",
)  # fmt: skip
STOPPED = "cv_instruct_nonstream"  # its talker ends on EOS by itself (make_reference.py)
SAMPLES_PER_FRAME = 1920
# ORT code2wav against upstream's torch decode of the same codes: 1.7e-6 measured (fp32 CPU);
# the margin covers other SIMD paths
AUDIO_ATOL = 1e-4
# upstream's greedy: the talker and the code predictor each told not to sample
GREEDY = {"talker_do_sample": 0, "subtalker_dosample": 0}


def tts_request(mode: dict[str, Any]) -> dict[str, Any]:
    """A qwen3_tts_inference request for one reference mode."""
    req: dict[str, Any] = {
        "messages": [{"role": "assistant", "content": mode["text"]}],
        "language": mode["language"],
        "sampling": {"talker_non_streaming_mode": int(mode["non_streaming_mode"])},
    }
    if mode.get("speaker"):
        req["speaker"] = mode["speaker"]
    if mode.get("instruct"):
        req["instruct"] = mode["instruct"]
    if mode["kind"] == "base":  # a clone: x-vector only without ref_text, ICL with it
        req["ref_audio"] = mode["ref_wav"]
        if mode.get("ref_text"):
            req["ref_text"] = mode["ref_text"]
    return req


def run(engine: Path, requests: list[dict], manifest: dict, batch_size: int = 1, **kw: Any):
    obj = {**GREEDY, "talker_max_new_tokens": manifest["talker_steps"], "requests": requests}
    parsed, _ = parse_request_file(obj)
    return Pipeline(engine, **kw).run(parsed, batch_size=batch_size)


def reference(manifest: dict, mode: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(manifest["modes"][mode]["npz"]) as z:
        return z["codes"], z["wav"]


def engine_for(qwen_tts_engines, manifest: dict, mode: str) -> Path:
    return qwen_tts_engines(manifest["modes"][mode]["kind"])


def assert_matches(outcome: Any, manifest: dict, mode: str) -> None:
    assert outcome.entry["ok"], outcome.entry["error"]
    codes, wav = reference(manifest, mode)
    np.testing.assert_array_equal(outcome.codes, codes)
    assert outcome.audio.shape == (len(codes) * SAMPLES_PER_FRAME,) == wav.shape
    np.testing.assert_allclose(outcome.audio, wav, rtol=0, atol=AUDIO_ATOL)
    assert outcome.sample_rate == 24000


@pytest.mark.parametrize("mode", MODES)
def test_mode_matches_upstream(qwen_tts_reference: dict, qwen_tts_engines, mode: str) -> None:
    engine = engine_for(qwen_tts_engines, qwen_tts_reference, mode)
    [out] = run(engine, [tts_request(qwen_tts_reference["modes"][mode])], qwen_tts_reference)
    assert_matches(out, qwen_tts_reference, mode)
    talker = out.entry["stages"]["talker"]
    if mode == STOPPED:
        assert talker["finish_reason"] == "eos"
        assert 2 <= talker["frames"] < qwen_tts_reference["talker_steps"] - 1
        assert out.entry["finish_reason"] == "end-of-sequence"
    else:  # the other tiny checkpoints never choose EOS
        assert talker["finish_reason"] == "length"
        assert talker["frames"] == qwen_tts_reference["talker_steps"] - 1


@pytest.mark.parametrize("batching", ["inflight", "cohort"])
def test_batch_of_different_voices_equals_each_alone(
    qwen_tts_reference: dict, qwen_tts_engines, batching: str
) -> None:
    """Four requests, two voices, two languages, both text modes, three rows: each equals
    upstream's run of it alone (in flight the fourth joins when a row frees up)."""
    modes = ["cv_plain_stream", "cv_dialect_nonstream", "cv_plain_nonstream", "cv_dialect_stream"]
    engine = qwen_tts_engines("custom_voice")
    requests = [tts_request(qwen_tts_reference["modes"][m]) for m in modes]
    outs = run(engine, requests, qwen_tts_reference, batch_size=3, batching=batching)
    for out, mode in zip(outs, modes, strict=True):
        assert_matches(out, qwen_tts_reference, mode)


@pytest.mark.parametrize("batching", ["inflight", "cohort"])
def test_batch_of_clones_keeps_each_voice(
    qwen_tts_reference: dict, qwen_tts_engines, batching: str
) -> None:
    """Clones of two reference clips (one 8 frames, one 10), x-vector only and in-context,
    three rows: each request equals upstream's run of it alone."""
    modes = ["base_icl2_stream", "base_icl_nonstream", "base_xvec_stream", "base_icl2_nonstream",
             "base_icl_stream"]  # fmt: skip
    engine = qwen_tts_engines("base")
    requests = [tts_request(qwen_tts_reference["modes"][m]) for m in modes]
    outs = run(engine, requests, qwen_tts_reference, batch_size=3, batching=batching)
    for out, mode in zip(outs, modes, strict=True):
        assert_matches(out, qwen_tts_reference, mode)
        stages = out.entry["stages"]
        assert "speaker_encoder" in stages
        # only an in-context prompt reads the reference codes: x-vector clones skip the stage
        assert ("speech_tokenizer_encoder" in stages) == ("icl" in mode)
        if "icl" in mode:
            assert (
                stages["code2wav"]["prompt_frames"]
                == qwen_tts_reference["modes"][mode]["ref_frames"]
            )


def test_whole_utterance_equals_windowed(qwen_tts_reference: dict, qwen_tts_engines) -> None:
    engine = qwen_tts_engines("voice_design")
    req = tts_request(qwen_tts_reference["modes"]["vd_stream"])
    [out] = run(engine, [req], qwen_tts_reference, whole_utterance=True)
    assert_matches(out, qwen_tts_reference, "vd_stream")


def test_clone_whole_utterance_cuts_the_reference(
    qwen_tts_reference: dict, qwen_tts_engines
) -> None:
    req = tts_request(qwen_tts_reference["modes"]["base_icl2_nonstream"])
    [out] = run(qwen_tts_engines("base"), [req], qwen_tts_reference, whole_utterance=True)
    assert_matches(out, qwen_tts_reference, "base_icl2_nonstream")


def test_base_graph_plans_the_encoders_only_for_clones(qwen_tts_engines) -> None:
    engine = qwen_tts_engines("base")
    graph = json.loads((engine / "multistage_config.json").read_text())
    ids = [s["id"] for s in graph["stages"]]
    assert ids == ["speaker_encoder", "speech_tokenizer_encoder", "talker", "code2wav"]
    from edgeomni import graph_schema

    g = graph_schema.load(engine / "multistage_config.json")
    assert graph_schema.plan(g, {"messages", "ref_audio"}).stages == (
        "speaker_encoder", "talker", "code2wav")  # fmt: skip
    assert graph_schema.plan(g, {"messages", "ref_audio", "ref_text"}).stages == tuple(ids)
    Pipeline(engine).check()


def test_graph_has_no_thinker(qwen_tts_engines) -> None:
    engine = qwen_tts_engines("custom_voice")
    graph = json.loads((engine / "multistage_config.json").read_text())
    assert [s["id"] for s in graph["stages"]] == ["talker", "code2wav"]
    assert graph["terminals"] == ["code2wav:audio"]
    talker = graph["stages"][0]
    assert {i["name"]: i["from"] for i in talker["inputs"]}["text"] == "request:messages"
    Pipeline(engine).check()  # what --validate-config checks


PLAIN = {"messages": [{"role": "assistant", "content": "Hello world."}], "language": "English"}


@pytest.mark.parametrize(
    ("kind", "request_", "error"),
    [
        ("custom_voice", {**PLAIN}, "needs a voice (speaker): one of aiden, dylan"),
        ("custom_voice", {**PLAIN, "speaker": "nobody"}, "unknown voice 'nobody'"),
        ("custom_voice", {**PLAIN, "speaker": "vivian", "language": "klingon"},
         "unknown language 'klingon'; this model's languages: auto, beijing_dialect"),
        ("custom_voice", {**PLAIN, "speaker": "vivian", "instruct": "Shout."},
         "takes no instruction"),
        ("custom_voice", {**PLAIN, "speaker": "vivian", "ref_audio": "x.wav"},
         "ref_audio: no stage of this graph reads it"),
        ("voice_design", {**PLAIN, "speaker": "vivian"}, "has no named speakers"),
        ("voice_design", {**PLAIN, "messages": [{"role": "assistant", "content": ""}]},
         "the text to speak is empty"),
        ("voice_design", {**PLAIN, "messages": [{"role": "user", "content": [
            {"type": "image", "image": "x.png"}]}]}, "speaks text only"),
        ("voice_design", {**PLAIN, "messages": [{"role": "assistant", "content": "x " * 200}]},
         "over the build's max_input_len 128"),
        ("base", {**PLAIN}, "a Base checkpoint clones the voice of ref_audio"),
        ("base", {**PLAIN, "ref_text": "Hi."}, "the request has no ref_audio"),
        ("base", {**PLAIN, "ref_audio": "/no/such.wav"}, "ref_audio: audio file not found"),
        ("base", {**PLAIN, "ref_audio": "REF", "speaker": "vivian"}, "has no named speakers"),
        ("base", {**PLAIN, "ref_audio": "REF", "instruct": "Calm."}, "takes no instruction"),
    ],
)  # fmt: skip
def test_requests_it_cannot_speak_fail_alone(
    qwen_tts_reference: dict, qwen_tts_engines, kind: str, request_: dict, error: str
) -> None:
    engine = qwen_tts_engines(kind)
    good_mode = {"custom_voice": "cv_plain_stream", "voice_design": "vd_stream",
                 "base": "base_xvec_stream"}[kind]  # fmt: skip
    good = tts_request(qwen_tts_reference["modes"][good_mode])
    if request_.get("ref_audio") == "REF":
        request_ = {**request_, "ref_audio": good["ref_audio"]}
    bad, ok = run(engine, [request_, good], qwen_tts_reference, batch_size=2)
    assert not bad.entry["ok"]
    assert error in bad.entry["error"]
    assert ok.entry["ok"], ok.entry["error"]


def test_a_user_message_is_spoken_when_there_is_no_assistant_one(
    qwen_tts_reference: dict, qwen_tts_engines
) -> None:
    """``--prompt`` makes a user message: on a TTS graph that is the text spoken."""
    mode = qwen_tts_reference["modes"]["vd_nonstream"]
    req = tts_request(mode)
    req["messages"] = [{"role": "user", "content": mode["text"]}]
    [out] = run(qwen_tts_engines("voice_design"), [req], qwen_tts_reference)
    assert_matches(out, qwen_tts_reference, "vd_nonstream")


# -- the command line ----------------------------------------------------------------------------
PCM16_ATOL = AUDIO_ATOL + 1 / 32768  # WAV files hold 16-bit PCM


def test_cli_prompt_speaks_into_out_audio(
    qwen_tts_reference: dict, qwen_tts_engines, tmp_path: Path, capsys
) -> None:
    import soundfile as sf

    from edgeomni.runtime import cli

    mode = qwen_tts_reference["modes"]["cv_dialect_stream"]
    wav = tmp_path / "out.wav"
    sampling = {**GREEDY, "talker_max_new_tokens": qwen_tts_reference["talker_steps"],
                "talker_non_streaming_mode": 0}  # fmt: skip
    argv = ["--config", str(qwen_tts_engines("custom_voice")), "--prompt", mode["text"],
            "--voice", "Dylan", "--language", "Chinese", "--out-audio", str(wav),
            "--sampling", json.dumps(sampling)]  # fmt: skip
    assert cli.main(argv) == cli.EXIT_OK
    assert f"wrote {wav} (0.88 s of audio)" in capsys.readouterr().err
    got, rate = sf.read(wav, dtype="float32")
    _, ref = reference(qwen_tts_reference, "cv_dialect_stream")
    assert rate == 24000 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=0, atol=PCM16_ATOL)


def test_cli_prompt_on_an_audio_only_graph_needs_out_audio(qwen_tts_engines, capsys) -> None:
    from edgeomni.runtime import cli

    argv = ["--config", str(qwen_tts_engines("voice_design")), "--prompt", "Hi"]
    assert cli.main(argv) == cli.EXIT_BAD_CONFIG
    assert "this graph makes audio only: give --out-audio" in capsys.readouterr().err


def test_cli_request_file_writes_upstreams_outputs(
    qwen_tts_reference: dict, qwen_tts_engines, tmp_path: Path
) -> None:
    """qwen3_tts_inference's outputs: audio_req<i>.wav, rvq_req<i>.safetensors (rvq_codes int32
    [frames, 16]) and the entry fields, for a file of two requests."""
    from safetensors.numpy import load_file

    from edgeomni.runtime import cli

    modes = ["vd_stream", "vd_nonstream"]
    body = {**GREEDY, "talker_max_new_tokens": qwen_tts_reference["talker_steps"],
            "requests": [tts_request(qwen_tts_reference["modes"][m]) for m in modes]}  # fmt: skip
    (tmp_path / "req.json").write_text(json.dumps(body))
    out = tmp_path / "audio"
    out.mkdir()
    argv = ["--config", str(qwen_tts_engines("voice_design")), "--input-file",
            str(tmp_path / "req.json"), "--output-file", str(tmp_path / "pred.json"),
            "--output-audio-dir", str(out), "--batch-size", "2"]  # fmt: skip
    assert cli.main(argv) == cli.EXIT_OK
    entries = json.loads((tmp_path / "pred.json").read_text())["responses"]
    for i, (entry, mode) in enumerate(zip(entries, modes, strict=True)):
        codes, wav = reference(qwen_tts_reference, mode)
        assert entry["ok"] and entry["audio_file"] == str(out / f"audio_req{i}.wav")
        assert entry["audio_samples"] == len(codes) * SAMPLES_PER_FRAME == len(wav)
        assert entry["audio_sample_rate"] == 24000
        assert entry["audio_duration_ms"] == round(1e3 * len(wav) / 24000)
        rvq = load_file(entry["rvq_file"])["rvq_codes"]
        assert rvq.dtype == np.int32
        np.testing.assert_array_equal(rvq, codes)


def test_cli_prompt_clones_ref_audio(qwen_tts_reference: dict, qwen_tts_engines, tmp_path) -> None:
    import soundfile as sf

    from edgeomni.runtime import cli

    mode = qwen_tts_reference["modes"]["base_icl2_stream"]
    wav = tmp_path / "clone.wav"
    sampling = {**GREEDY, "talker_max_new_tokens": qwen_tts_reference["talker_steps"]}
    argv = ["--config", str(qwen_tts_engines("base")), "--prompt", mode["text"],
            "--language", "chinese", "--ref-audio", mode["ref_wav"], "--ref-text",
            mode["ref_text"], "--out-audio", str(wav), "--sampling", json.dumps(sampling)]  # fmt: skip
    assert cli.main(argv) == cli.EXIT_OK
    got, _ = sf.read(wav, dtype="float32")
    _, ref = reference(qwen_tts_reference, "base_icl2_stream")
    np.testing.assert_allclose(got, ref, rtol=0, atol=PCM16_ATOL)
