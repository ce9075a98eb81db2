"""Qwen3-ASR's text side against transformers, without an engine: the transcription form's
messages render as ``Qwen3ASRProcessor.apply_transcription_request`` renders them, its parser is
the processor's, its language names are the processor's; the generic pieces the family needs
(``continue_final_message`` as transformers' ``apply_chat_template`` does it, ``{% generation %}``
blocks, the ``language`` control two families declare, the feature extractor's minimum length)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest

from edgeomni.runtime.families.qwen3_asr.transcription import (
    LANGUAGE_CODE_TO_NAME,
    Transcription,
    language_name,
)
from edgeomni.runtime.tokenizer import TextTokenizer

hf_processing = pytest.importorskip("transformers.models.qwen3_asr.processing_qwen3_asr")


def test_language_names_are_the_processors() -> None:
    assert LANGUAGE_CODE_TO_NAME == hf_processing.LANGUAGE_CODE_TO_NAME
    from transformers.audio_utils import resolve_language

    for value in ("en", "EN", "english", "English", "yue", "Cantonese", " fil "):
        assert language_name(value) == resolve_language(
            value.strip(), LANGUAGE_CODE_TO_NAME, return_code=False
        )
    with pytest.raises(ValueError, match=r"unknown language 'Klingon' for Qwen3-ASR; known: "
                                         r"Arabic \(ar\), Cantonese \(yue\)"):  # fmt: skip
        language_name("Klingon")


def _texts(seed: int, n: int) -> list[str]:
    """Replies as a model might write them: markers, language lines, newlines, repetitions."""
    rng = random.Random(seed)
    pieces = ["language ", "English", "None", "<asr_text>", "assistant\n", "\n", " ", "ab",
              "x", "hello ", "language", "Chinese\n", "  ", "ok"]  # fmt: skip
    out = []
    for _ in range(n):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
        if rng.random() < 0.4:  # a character or a pattern repeated past the fix's threshold
            unit = rng.choice(["a", "ab", "xyz ", "word, ", "0123456789abcdefghij"])
            text += unit * rng.randint(15, 45) + rng.choice(["", "end", "<asr_text>tail"])
        out.append(text)
    return out


def test_parse_is_the_processors() -> None:
    fixed = ["", "   ", "language English<asr_text>Hello there.", "language None<asr_text>",
             "LANGUAGE none<asr_text> hi ", "language <asr_text>x", "German\nfoo<asr_text>bar",
             "\n\nlanguage French \n<asr_text> oui", "no marker at all", "a<asr_text>b<asr_text>c",
             "system\nx\nassistant\nlanguage English<asr_text>" + "ha" * 30 + "!",
             "zzzzzzzzzzzzzzzzzzzzzzzzz" * 3]  # fmt: skip
    for text in fixed + _texts(0, 400):
        want = hf_processing._parse_single_output(text)
        assert Transcription.parse(text) == (want["language"], want["transcription"]), text


def test_messages_render_as_apply_transcription_request(asr_ckpt: Path) -> None:
    """The form's messages through the runtime's chat template (text parts as strings, as the
    text model's runner passes them, the last message continued) are the processor's prompt
    text, for each language and context prompt."""
    from transformers import Qwen3ASRProcessor

    from edgeomni.runtime.runners.llm import template_message

    proc = Qwen3ASRProcessor.from_pretrained(asr_ckpt)
    tok = TextTokenizer(asr_ckpt)
    for language, prompt in ((None, None), ("en", None), ("zh", ""), (None, "hot words")):
        messages = Transcription.messages("clip.wav", language, prompt)
        ours = tok.apply_chat_template(
            [template_message(m) for m in messages], continue_final_message=True
        )
        want = proc.apply_transcription_request(
            audio="clip.wav", language=language, prompt=prompt, tokenize=False
        )[0]
        assert ours == want, (language, prompt)
    with pytest.raises(ValueError, match="unknown language"):
        Transcription.messages("clip.wav", "xx")


def test_language_control_starts_the_reply() -> None:
    user = {"role": "user", "content": [{"type": "audio", "audio": "a.wav"}]}
    assert Transcription.request_messages([user], {}) is None
    assert Transcription.request_messages([user], {"language": "de"}) == [
        user, {"role": "assistant", "content": "language German<asr_text>"}]  # fmt: skip
    with pytest.raises(ValueError, match="already an assistant's"):
        Transcription.request_messages([user, {"role": "assistant", "content": "x"}],
                                       {"language": "de"})  # fmt: skip


@pytest.mark.parametrize(
    "final",
    ["Sure, the answer is", "", [{"type": "text", "text": "part one"}],
     [{"type": "text", "text": "a"}, {"type": "text", "text": "b "}]],
)  # fmt: skip
def test_continue_final_message_is_transformers(qwen3_ckpt: Path, asr_ckpt: Path, final) -> None:
    """The prompt ends inside the last message as transformers' apply_chat_template
    (continue_final_message=True) ends it, for a plain ChatML template and Qwen3-ASR's."""
    from transformers import AutoTokenizer

    for ckpt in (qwen3_ckpt, asr_ckpt):
        messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": final}]
        if ckpt == qwen3_ckpt and not isinstance(final, str):
            continue  # the plain template takes string content only
        want = AutoTokenizer.from_pretrained(ckpt).apply_chat_template(
            messages, tokenize=False, continue_final_message=True
        )
        ours = TextTokenizer(ckpt).apply_chat_template(messages, continue_final_message=True)
        assert ours == want, (ckpt.name, final)
        assert not ours.endswith("<|im_end|>\n")


def test_continue_final_message_refuses_a_template_that_drops_it(tmp_path: Path,
                                                                 qwen3_ckpt: Path) -> None:  # fmt: skip
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((qwen3_ckpt / name).read_bytes())
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}<|im_end|>{% endfor %}"
    )
    tok = TextTokenizer(tmp_path)
    with pytest.raises(ValueError, match="does not render the last message's text"):
        tok.apply_chat_template([{"role": "user", "content": "x"}], continue_final_message=True)
    with pytest.raises(ValueError, match="no text to continue"):
        tok.apply_chat_template([{"role": "user", "content": [{"type": "audio", "audio": "a"}]}],
                                continue_final_message=True)  # fmt: skip


def test_generation_blocks_render_their_body(tmp_path: Path, qwen3_ckpt: Path) -> None:
    """transformers' {% generation %} tag compiles at build and run time, as its body."""
    from edgeomni.export.common.text_files import compile_template

    template = (
        "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
    )
    assert compile_template(template).render(messages=[{"content": "a"}]) == "[a]"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((qwen3_ckpt / name).read_bytes())
    (tmp_path / "chat_template.jinja").write_text(template)
    out = TextTokenizer(tmp_path).apply_chat_template([{"role": "user", "content": "a"}])
    assert out == "[a]"


def test_request_files_continue_the_final_message() -> None:
    from edgeomni.runtime.requests import parse_request_file

    (plain,), _ = parse_request_file({"requests": [{"prompt": "x"}]})
    assert not plain.continue_final_message
    (cont,), settings = parse_request_file(
        {"continue_final_message": True, "requests": [{"prompt": "x"}]}
    )
    assert cont.continue_final_message and settings["continue_final_message"] is True
    assert cont.batch_settings != plain.batch_settings  # never one cohort with plain requests
    with pytest.raises(ValueError, match="continue_final_message and add_generation_prompt"):
        parse_request_file({"continue_final_message": True, "add_generation_prompt": True,
                            "requests": []})  # fmt: skip


def test_language_is_one_control_of_two_families() -> None:
    """Qwen3-TTS's and Qwen3-ASR's ``language``: one key, one --language flag, read by either
    family's stage; a declaration that disagrees with another family's is refused."""
    from edgeomni.runtime import families
    from edgeomni.runtime.family import RequestKey, RuntimeFamily

    key = families.REQUEST_KEYS["language"]
    assert key.flag == "--language" and key.speech_field == "language"
    assert not key.speaks  # an ASR stage reads it without speaking
    assert "Qwen3-TTS" in key.meaning and "Qwen3-ASR" in key.meaning
    assert set(families.KEY_LABELS["language"].split(" or ")) == {"Qwen3-TTS", "Qwen3-ASR"}
    a = RuntimeFamily("a", request_keys={"k": RequestKey("one", flag="--k")})
    b = RuntimeFamily("b", request_keys={"k": RequestKey("two", flag="--kk")})
    with pytest.raises(RuntimeError, match=r"request key 'k': a and b declare it differently "
                                           r"\(flag\)"):  # fmt: skip
        families.merged_keys((a, b))
    c = dataclasses.replace(b, request_keys={"k": RequestKey("two", flag="--k")})
    assert families.merged_keys((a, c))["k"].meaning == "one; two"


@pytest.mark.parametrize("n", [1600, 4000, 7999, 8000, 8001, 16160, 24000, 32000, 40123])
def test_audio_features_are_the_feature_extractors(n: int) -> None:
    """Qwen3ASRFeatureExtractor (padding=True, as the processor calls it) on one clip: its mask
    covers our frames (a clip below min_length zero-padded to 8000 samples), its features equal
    ours there and are zero frames after, up to whole 100-frame chunks."""
    from transformers import Qwen3ASRFeatureExtractor

    from edgeomni.runtime.media.audio_input import audio_features

    t = np.arange(n) / 16000
    x = (0.3 * np.sin(2 * np.pi * 330 * t * (1 + t))).astype(np.float32)
    out = Qwen3ASRFeatureExtractor()(x, sampling_rate=16000, padding=True,
                                     return_attention_mask=True, return_tensors="np")  # fmt: skip
    feats, frames = audio_features(x, min_samples=8000)
    assert frames == int(out["attention_mask"].sum()) == max(n, 8000) // 160
    assert out["input_features"].shape[-1] == -(-frames // 100) * 100
    assert np.abs(out["input_features"][0, :, :frames] - feats).max() < 1e-4
    assert not out["input_features"][0, :, frames:].any()


LONG = "Hello there, world. This transcript is long enough to be streamed."


@pytest.mark.parametrize(
    ("reply", "lag"),
    [(f"language English<asr_text> {LONG}", 40), (LONG, 40),
     (f"language English<asr_text>{'stem' * 30} and then the end of the reply.", 40),
     ("language None<asr_text>", 0), ("lang", None), ("language German", None)],
)  # fmt: skip
def test_partial_transcripts_only_grow_into_the_parse(reply: str, lag: int | None) -> None:
    """edge-serve streams what ``partial`` gives as the reply grows: each is the last one
    extended, none is header text, and all are the start of the final parse's transcript,
    repetitions folded as the parse folds them (the last ``lag`` characters wait, since they
    may still start a repetition); a reply that never left what may be a header streams
    nothing (the end sends it whole). The property over random replies: test_settled_*."""
    sent = ""
    for n in range(len(reply) + 1):
        so_far = Transcription.partial(reply[:n])
        if so_far is not None:
            assert so_far.rstrip().startswith(sent) and "language" not in so_far
            sent = so_far.rstrip()
    final = Transcription.parse(reply)[1]
    assert final.startswith(sent)
    if lag is None:
        assert sent == ""
    else:
        assert len(final) - len(sent) <= lag
    if "stem" in reply:
        assert sent.count("stem") == 1  # folded, never sent unfolded


def test_settled_replies_are_the_start_of_every_parse() -> None:
    """Over random replies full of repetitions: each prefix's partial transcript only grows
    and is the start of the whole reply's parse."""
    rng = random.Random(1)
    pieces = ["a", "b", "ab", "abc ", "hi ", "x", " ", "stem", "word, ", ".", "z"]
    for _ in range(200):
        body = ""
        while len(body) < rng.randint(0, 240):
            unit = rng.choice(pieces)
            body += unit * rng.randint(1, 45) if rng.random() < 0.3 else unit
        reply = rng.choice(["language English<asr_text>", "", "language None<asr_text>"]) + body
        final, sent = Transcription.parse(reply)[1], ""
        for n in range(len(reply) + 1):
            so_far = Transcription.partial(reply[:n])
            if so_far is not None:
                assert so_far.rstrip().startswith(sent), (reply, n)
                sent = so_far.rstrip()
        assert final.startswith(sent), reply


def test_build_refuses_feature_settings_it_does_not_compute(
    asr_ckpt: Path, tmp_path: Path, capsys
) -> None:
    """edge-build checks the feature extractor's settings before any export: one its log-mel
    does not compute, or none at all, is exit 2 naming the file."""
    import json
    import shutil

    from edgeomni.builder import cli as build_cli

    ckpt = shutil.copytree(asr_ckpt, tmp_path / "ckpt")
    config = ckpt / "processor_config.json"
    data = json.loads(config.read_text())
    data["feature_extractor"]["hop_length"] = 320
    config.write_text(json.dumps(data))
    argv = ["--model-dir", str(ckpt), "--engine-dir", str(tmp_path / "eng")]
    assert build_cli.main(argv) == build_cli.EXIT_BAD_INPUT
    assert f"{config}: hop_length is 320; edgeomni's log-mel takes 160" in capsys.readouterr().err
    config.unlink()
    assert build_cli.main(argv) == build_cli.EXIT_BAD_INPUT
    assert "no feature extractor settings" in capsys.readouterr().err
    assert not (tmp_path / "eng").exists()
