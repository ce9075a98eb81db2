"""Context reuse end to end (runtime/context_cache.py through the decoder stage): requests that
begin alike take their prefix from the cache, and every output equals the uncached run's:
greedy text for Qwen3, Qwen3.5 (its recurrent state resumed at a block boundary) and Qwen3-VL
(an image asked about twice), text, codes and audio for Qwen3-Omni and Qwen3-TTS (a CustomVoice
speaker, a Base clone's reference), with requests joining and leaving the batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeomni.runtime.audio import write_wav
from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.requests import parse_request_file

SYSTEM = "Be brief and kind."
QUESTIONS = ["Two plus two?", "A colour?", "Two plus two?", "Hi.", "Why blue?"]
LENGTHS = [6, 3, 6, 9, 4]  # different reply lengths: rows free up at different steps


def run(engine: Path, obj: dict, batch_size: int, mb: float, **kw: Any) -> tuple[list, Pipeline]:
    requests, _ = parse_request_file(obj)
    pipe = Pipeline(engine, context_cache_mb=mb, **kw)
    return pipe.run(requests, batch_size=batch_size), pipe


def chat(questions: list[str], lengths: list[int], **extra: Any) -> dict:
    return {
        "top_k": 1,
        "requests": [
            {"messages": [{"role": "system", "content": SYSTEM},
                          {"role": "user", "content": q}], "max_generate_length": n}
            for q, n in zip(questions, lengths, strict=True)
        ],  # fmt: skip
        **extra,
    }


def cached(outcomes: list, stage: str) -> list[int]:
    return [o.entry["stages"][stage]["cached_tokens"] for o in outcomes]


def same_text(got: list, want: list, stage: str) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.entry["ok"], g.entry.get("error")
        assert g.entry["stages"][stage]["output_tokens"] == w.entry["stages"][stage]["output_tokens"]
        assert g.entry["output_text"] == w.entry["output_text"]


@pytest.mark.parametrize("batch", [1, 2])
def test_qwen3_shared_system_prompt(qwen3_engine: Path, batch: int) -> None:
    obj = chat(QUESTIONS, LENGTHS)
    off, _ = run(qwen3_engine, obj, batch, 0)
    on, pipe = run(qwen3_engine, obj, batch, 16)
    same_text(on, off, "llm")
    hits = cached(on, "llm")
    assert all(n == 0 for n in cached(off, "llm"))
    assert hits[0] == 0 and all(n > 0 for n in hits[batch:]), hits
    # the repeated question finds all its prompt but the last position's block
    prompt = on[2].entry["stages"]["llm"]["prompt_tokens"]
    assert hits[2] == (prompt - 1) // 8 * 8
    stats = pipe.context_cache.as_dict()["stages"]["llm"]
    assert stats["cached_tokens"] == sum(hits) and stats["hits"] == sum(n > 0 for n in hits)


def test_qwen35_resumes_its_recurrent_state_at_a_boundary(qwen35_engine: Path) -> None:
    """The first request publishes kv; the second finds kv without a state where they part,
    splits its prefill there and keeps one; the third on resume at it."""
    obj = chat(QUESTIONS, LENGTHS)
    off, _ = run(qwen35_engine, obj, 1, 0)
    on, _ = run(qwen35_engine, obj, 1, 16)
    same_text(on, off, "llm")
    hits = cached(on, "llm")
    assert hits[:2] == [0, 0] and hits[2] > 0 and hits[3] > 0, hits
    both, _ = run(qwen35_engine, obj, 2, 16)  # joining and leaving, rows sitting calls out
    same_text(both, off, "llm")
    assert sum(cached(both, "llm")) > 0


def test_qwen3_vl_same_image_twice(vl_engine: Path, tmp_path: Path) -> None:
    pytest.importorskip("PIL", reason="images are read with Pillow")
    from PIL import Image

    path = tmp_path / "photo.png"
    Image.linear_gradient("L").resize((64, 48)).convert("RGB").save(path)
    other = tmp_path / "other.png"
    Image.linear_gradient("L").rotate(90).resize((64, 48)).convert("RGB").save(other)

    def ask(image: Path, q: str) -> dict:
        return {"messages": [{"role": "user", "content": [
            {"type": "image", "image": str(image)}, {"type": "text", "text": q}]}],
            "max_generate_length": 5}  # fmt: skip

    obj = {"top_k": 1, "requests": [ask(path, "Describe it."), ask(other, "Describe it."),
                                    ask(path, "What colour is it?"), ask(path, "Describe it.")]}
    off, _ = run(vl_engine, obj, 2, 0)
    on, _ = run(vl_engine, obj, 2, 32)
    same_text(on, off, "llm")
    hits = cached(on, "llm")
    image_tokens = on[0].entry["stages"]["llm"]["prompt_tokens"] - 10
    assert hits[2] >= image_tokens - 8 and hits[3] >= hits[2], hits


def test_qwen3_omni_thinker_prompt_with_an_image_then_speech(omni_engine: Path,
                                                            tmp_path: Path) -> None:  # fmt: skip
    """The thinker hands its talker a prompt's media states: cached positions hand theirs
    from the cache. Text, codes and audio equal the uncached run's."""
    pytest.importorskip("PIL", reason="images are read with Pillow")
    from PIL import Image

    path = tmp_path / "photo.png"
    Image.linear_gradient("L").resize((32, 32)).convert("RGB").save(path)

    def ask(q: str, n: int) -> dict:
        return {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": [
            {"type": "image", "image": str(path)}, {"type": "text", "text": q}]}],
            "max_generate_length": n}  # fmt: skip

    obj = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 12, "voice": "ethan",
           "requests": [ask("Hello there.", 6), ask("Count to three.", 4),
                        ask("Hello there.", 6)]}  # fmt: skip
    off, _ = run(omni_engine, obj, 2, 0)
    on, pipe = run(omni_engine, obj, 2, 32)
    same_text(on, off, "thinker")
    for g, w in zip(on, off, strict=True):
        np.testing.assert_array_equal(g.codes, w.codes)
        np.testing.assert_allclose(g.audio, w.audio, atol=1e-5)
    assert cached(on, "thinker")[2] > 0
    assert cached(on, "talker")[2] > 0, "the talker's prompt of the same reply and voice"


def _speech(outcomes_on: list, outcomes_off: list) -> None:
    for g, w in zip(outcomes_on, outcomes_off, strict=True):
        assert g.entry["ok"], g.entry.get("error")
        np.testing.assert_array_equal(g.codes, w.codes)
        np.testing.assert_allclose(g.audio, w.audio, atol=1e-5)


def test_qwen3_tts_custom_voice(tts_engine: Path) -> None:
    say = ["Hello there, nice to meet you.", "Good morning.", "Hello there, nice to meet you."]
    obj = {"talker_do_sample": 0, "subtalker_dosample": 0, "talker_max_new_tokens": 10,
           "voice": "vivian", "language": "english",
           "requests": [{"messages": [{"role": "assistant", "content": t}]} for t in say]}  # fmt: skip
    off, _ = run(tts_engine, obj, 2, 0)
    on, _ = run(tts_engine, obj, 2, 16)
    _speech(on, off)
    hits = cached(on, "talker")
    assert hits[2] > 0 and hits[1] >= 0, hits


@pytest.mark.parametrize("vocoder_threads", [None, 1])
def test_qwen3_tts_base_clone_reference_seen_before(tts_base_engine: Path, tmp_path: Path,
                                                    vocoder_threads: int | None) -> None:  # fmt: skip
    """The clip is encoded once, the talker's prompt of the reference is reused, and the
    vocoder resumes after the reference's codes (on the loop's thread, and on its own)."""
    rng = np.random.default_rng(0)
    clip = tmp_path / "ref.wav"
    write_wav(clip, (0.1 * rng.standard_normal(24000)).astype(np.float32), 24000)
    ref_text = "This is the reference clip, spoken slowly and clearly for the cloning test."
    say = ["Hello there.", "The weather is fine today.", "Hello there."]
    obj = {"talker_do_sample": 0, "subtalker_dosample": 0, "talker_max_new_tokens": 10,
           "language": "english",
           "requests": [{"messages": [{"role": "assistant", "content": t}],
                         "ref_audio": str(clip), "ref_text": ref_text} for t in say]}  # fmt: skip
    off, _ = run(tts_base_engine, obj, 1, 0, vocoder_threads=vocoder_threads)
    on, _ = run(tts_base_engine, obj, 1, 16, vocoder_threads=vocoder_threads)
    _speech(on, off)
    hits = cached(on, "talker")
    # the reference's part of the prompt is shared (here, with a transcript longer than the
    # clip's frames, all of it: the target text comes after, one row a frame)
    prompt = on[2].entry["stages"]["talker"]["prompt_tokens"]
    assert hits[0] == 0 and hits[1] > 0 and hits[2] == (prompt - 1) // 8 * 8, hits
    assert [o.entry["stages"]["speaker_encoder"]["cached"] for o in on] == [False, True, True]
    # the vocoder's state after the reference codes (vocoded in front, cut off) is kept too
    assert [o.entry["stages"]["code2wav"]["prompt_cached"] for o in on] == [False, True, True]
    assert not any(o.entry["stages"]["code2wav"]["prompt_cached"] for o in off)


def test_edge_infer_flag_profile_and_predictions(qwen3_engine: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:  # fmt: skip
    """edge-infer --context-cache-mb: the predictions' cached_tokens, --dump-profile's
    context_cache; 0 turns it off (and a context_cache_key then warns it changes nothing); a
    negative budget is refused before any engine loads."""
    import json

    from edgeomni.runtime import cli

    obj = chat(QUESTIONS[:3], LENGTHS[:3], context_cache_key="app")
    (tmp_path / "r.json").write_text(json.dumps(obj))
    base = ["--config", str(qwen3_engine), "--input-file", str(tmp_path / "r.json"),
            "--batch-size", "1"]  # fmt: skip
    out = tmp_path / "p.json"
    code = cli.main([*base, "--output-file", str(out), "--context-cache-mb", "8",
                     "--dump-profile"])  # fmt: skip
    assert code == cli.EXIT_OK
    err = capsys.readouterr().err
    profile = json.loads(err[err.index('{\n  "wall_ms"') :])
    entries = json.loads(out.read_text())["responses"]
    hits = [e["stages"]["llm"]["cached_tokens"] for e in entries]
    stats = profile["context_cache"]
    assert stats["budget_mb"] == 8 and stats["entries"] > 0
    assert stats["stages"]["llm"]["cached_tokens"] == sum(hits) > 0
    code = cli.main([*base, "--output-file", str(tmp_path / "q.json"), "--context-cache-mb", "0"])
    assert code == cli.EXIT_OK
    assert "context_cache_key" in capsys.readouterr().err
    off = json.loads((tmp_path / "q.json").read_text())["responses"]
    assert [e["output_text"] for e in off] == [e["output_text"] for e in entries]
    assert cli.main([*base, "--context-cache-mb", "-1"]) == 2
    assert "--context-cache-mb must be" in capsys.readouterr().err


def test_engines_that_take_one_row_with_past_prefill_each_request_alone(
    qwen3_engine: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime before 1.32 refuses GroupQueryAttention with past context for more than one
    row of several tokens (the engine's ``rows_with_past``): requests that join together then
    prefill one by one, and no call holds two rows with past context."""
    from edgeomni.runtime import decoder

    calls: list[tuple[int, int]] = []  # (rows with past context, the call's width)
    real = decoder.DecoderSession.run

    def spy(self, embeds, positions, past_lens, query_lens, last, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append((int((np.asarray(past_lens) > 0).sum()), embeds.shape[1]))
        return real(self, embeds, positions, past_lens, query_lens, last, **kw)

    obj = chat(QUESTIONS, LENGTHS)
    off, _ = run(qwen3_engine, obj, 3, 0)
    requests, _ = parse_request_file(obj)
    pipe = Pipeline(qwen3_engine, context_cache_mb=16)
    pipe.open({"llm"})
    monkeypatch.setattr(pipe.runner("llm").engine, "rows_with_past", 1, raising=False)
    monkeypatch.setattr(decoder.DecoderSession, "run", spy)
    on = pipe.run(requests[:1], batch_size=3)  # the first leaves the system prompt's blocks
    on += pipe.run(requests[1:], batch_size=3)  # the others join together and find them
    same_text(on, off, "llm")
    assert all(n > 0 for n in cached(on, "llm")[1:])
    assert all(rows <= 1 for rows, width in calls if width > 1), calls


def test_the_default_keeps_gpu_decoders_out(qwen3_engine: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The default budget attaches no decoder whose rows live on a GPU (measured slower there:
    docs/benchmarks.md); a budget given attaches it; on the CPU the default attaches it."""
    from edgeomni.runtime import pipeline
    from edgeomni.runtime.decoder_stage import DecoderStage

    monkeypatch.setattr(pipeline, "auto_budget_mb", lambda: 64)
    assert Pipeline(qwen3_engine).slot_stage("llm").prefix is not None
    monkeypatch.setattr(DecoderStage, "on_host", property(lambda self: False))
    assert Pipeline(qwen3_engine).slot_stage("llm").prefix is None
    assert Pipeline(qwen3_engine, context_cache_mb=8).slot_stage("llm").prefix is not None
