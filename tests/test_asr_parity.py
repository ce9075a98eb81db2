"""Qwen3-ASR through edge-infer reproduces transformers on a tiny random checkpoint
(export/tiny_asr.py: windows of 200 mel frames, 2 s): greedy tokens identical to
``Qwen3ASRForConditionalGeneration.generate`` on the processor's ``apply_transcription_request``
inputs, for one clip, clips of different lengths batched in flight with a text-only request, a
clip exactly at the window boundary and one past it, a clip below the extractor's minimum
length, and a forced language with a context prompt; the encoder's rows within 2e-6 of
transformers' ``get_audio_features``. Also: --validate-config, --graph-only, a clip past the
build's prompt length, and an int4 build.

The reference runs each clip alone: transformers' processor pads a batch's shorter clip with
zero samples, which changes its last mel frames (and, for a length not a multiple of 160, its
frame count), so a batched reference would not be the clip's own transcription; edgeomni
gives every request what it gives alone, which the batch test checks against these.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from export_store import ExportStore

from edgeomni.runtime import cli
from edgeomni.runtime.audio import read_wav, write_wav

MAX_NEW = 12
GREEDY = {"top_k": 1}
# samples at 16 kHz: 1.5 s (150 frames, a partial chunk), exactly n_window_infer (200 frames:
# one whole attention window), past it (250 frames: a second window), and 0.25 s (below the
# extractor's 8000-sample minimum, zero-padded to it)
CLIPS = {"short": 24000, "boundary": 32000, "past": 40000, "tiny": 4000}
# the encoder's rows: ONNX Runtime vs transformers eager on the same features, float32
ENCODER_RTOL = 2e-6
# our numpy log-mel vs the extractor's torch STFT (runtime/media/audio_input.py)
FEATURES_ATOL = 1e-4
CONTEXT = "Edge devices, fast models."


def signal(n: int, seed: int) -> np.ndarray:
    """A chirp over noise: the mel differs frame to frame, so a wrong frame would show."""
    t = np.arange(n) / 16000
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(2 * np.pi * (200 + 300 * seed) * t * (1 + t))
            + 0.05 * rng.standard_normal(n)).astype(np.float32)  # fmt: skip


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("asr-clips")
    out = {}
    for seed, (name, n) in enumerate(CLIPS.items()):
        out[name] = root / f"{name}.wav"
        write_wav(out[name], signal(n, seed), 16000)
    return out


@pytest.fixture(scope="module")
def hf(asr_ckpt: Path) -> Any:
    from transformers import Qwen3ASRForConditionalGeneration, Qwen3ASRProcessor

    model = Qwen3ASRForConditionalGeneration.from_pretrained(asr_ckpt).eval()
    return model, Qwen3ASRProcessor.from_pretrained(asr_ckpt)


def reference(hf: Any, wav: Path | None, language: str | None = None, prompt: str | None = None,
              text: str | None = None) -> dict[str, Any]:  # fmt: skip
    """transformers' greedy run of one request: the processor's transcription request for a
    clip (the samples edge-infer reads from the WAV), or a text-only user message."""
    model, proc = hf
    if wav is not None:
        x, rate = read_wav(wav)
        assert rate == 16000
        inputs = proc.apply_transcription_request(audio=[x], language=language, prompt=prompt)
        rendered = proc.apply_transcription_request(
            audio=[str(wav)], language=language, prompt=prompt, tokenize=False
        )[0]
    else:
        messages = [{"role": "user", "content": text}]
        rendered = proc.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        inputs = proc.tokenizer(rendered, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    tokens = out[0, inputs["input_ids"].shape[1] :].tolist()
    return {"tokens": tokens, "prompt": rendered,
            "parsed": proc.decode(tokens, return_format="parsed")}  # fmt: skip


def audio_message(wav: Path) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "audio", "audio": str(wav)}]}


def run(engine: Path, tmp: Path, requests: list[dict], *flags: str, **top: Any) -> tuple[int, list]:
    tmp.mkdir(parents=True, exist_ok=True)
    body = {"max_generate_length": MAX_NEW, **top, "requests": requests}
    (tmp / "r.json").write_text(json.dumps(body))
    code = cli.main(["--config", str(engine), "--input-file", str(tmp / "r.json"),
                     "--output-file", str(tmp / "p.json"), "--sampling", json.dumps(GREEDY),
                     *flags])  # fmt: skip
    return code, json.loads((tmp / "p.json").read_text())["responses"]


def tokens(entry: dict) -> list[int]:
    assert entry["ok"], entry["error"]
    return entry["stages"]["llm"]["output_tokens"]


def test_one_clip_matches_transformers(asr_engine: Path, hf: Any, clips: dict, tmp_path) -> None:
    """A transcription request as the family's form writes it (edge-serve's), and a plain
    user turn with the clip: the processor's prompt, its tokens, its parse of the reply."""
    from edgeomni.runtime.families.qwen3_asr.transcription import Transcription

    want = reference(hf, clips["short"])
    code, (endpoint,) = run(asr_engine, tmp_path / "a",
                            [{"messages": Transcription.messages(str(clips["short"]))}],
                            continue_final_message=True)  # fmt: skip
    assert code == cli.EXIT_OK
    _, (plain,) = run(asr_engine, tmp_path / "b", [{"messages": [audio_message(clips["short"])]}])
    for entry in (endpoint, plain):
        assert tokens(entry) == want["tokens"] and len(want["tokens"]) > 0
        assert entry["formatted_complete_request"] == want["prompt"]
        assert (entry["language"], entry["transcript"]) == (
            want["parsed"]["language"], want["parsed"]["transcription"])  # fmt: skip
        assert entry["output_text"] == hf[1].decode(want["tokens"], skip_special_tokens=True)


@pytest.mark.parametrize("batch", [1, 3])
def test_clips_of_different_lengths_batched_in_flight(
    asr_engine: Path, hf: Any, clips: dict, tmp_path: Path, batch: int
) -> None:
    """Five requests on three rows (or one): clips of 1.5, 2 (one whole window), 2.5 (two
    windows) and 0.25 s, one with a forced language, and a text-only request: each gives its
    own reference's tokens, alone or sharing the rows."""
    cases = [("short", None), ("boundary", None), ("past", None), ("tiny", None),
             ("boundary", "en")]  # fmt: skip
    requests: list[dict] = [
        {"messages": [audio_message(clips[name])], **({"language": lang} if lang else {})}
        for name, lang in cases
    ]
    requests.insert(2, {"prompt": "Hello there"})
    wants = [reference(hf, clips[name], language=lang) for name, lang in cases]
    wants.insert(2, reference(hf, None, text="Hello there"))
    code, entries = run(asr_engine, tmp_path, requests, "--batch-size", str(batch))
    assert code == cli.EXIT_OK
    for entry, want in zip(entries, wants, strict=True):
        assert tokens(entry) == want["tokens"], entry["request_idx"]
        assert entry["formatted_complete_request"] == want["prompt"]
    widest = max(e["stages"]["llm"]["cohort_size"] for e in entries)
    assert widest == batch  # rows were shared (or not) as asked


def test_forced_language_and_context(asr_engine: Path, hf: Any, clips: dict, tmp_path) -> None:
    """language "en" and a context prompt: the processor's assistant prefill
    ``language English<asr_text>`` continued, through the form's messages and through the
    request's ``language`` control with a system turn; the entry's language is the forced one."""
    from edgeomni.runtime.families.qwen3_asr.transcription import Transcription

    want = reference(hf, clips["past"], language="en", prompt=CONTEXT)
    assert want["prompt"].endswith("<|im_start|>assistant\nlanguage English<asr_text>")
    form = {"messages": Transcription.messages(str(clips["past"]), "en", CONTEXT)}
    code, (a,) = run(asr_engine, tmp_path / "a", [form], continue_final_message=True)
    assert code == cli.EXIT_OK
    keyed = {"messages": [{"role": "system", "content": CONTEXT}, audio_message(clips["past"])],
             "language": "English"}  # fmt: skip
    _, (b,) = run(asr_engine, tmp_path / "b", [keyed])
    for entry in (a, b):
        assert tokens(entry) == want["tokens"]
        assert entry["formatted_complete_request"] == want["prompt"]
        assert entry["language"] == "English"
        assert entry["transcript"] == want["parsed"]["transcription"]
    code, (bad,) = run(asr_engine, tmp_path / "c", [{**keyed, "language": "Klingon"}])
    assert code == cli.EXIT_REQUESTS_FAILED and "unknown language 'Klingon'" in bad["error"]


def test_prompt_flag_with_audio_and_language(
    asr_engine: Path, hf: Any, clips: dict, capsys
) -> None:
    """edge-infer --prompt "" --audio CLIP --language en prints the reply (the transcript)."""
    want = reference(hf, clips["short"], language="en")
    code = cli.main(["--config", str(asr_engine), "--prompt", "", "--audio", str(clips["short"]),
                     "--language", "en", "--sampling", json.dumps(GREEDY),
                     "--max-generate-length", str(MAX_NEW)])  # fmt: skip
    assert code == cli.EXIT_OK
    text = hf[1].decode(want["tokens"], skip_special_tokens=True)
    assert capsys.readouterr().out.rstrip("\n") == text


def test_encoder_rows_match_get_audio_features(asr_engine: Path, hf: Any, clips: dict) -> None:
    """The audio engine on the extractor's features gives get_audio_features' rows (the
    projector's); our log-mel equals the extractor's within FEATURES_ATOL, frame for frame."""
    from edgeomni.runtime.media.audio_encoder import AudioEncoder
    from edgeomni.runtime.media.audio_input import audio_features

    model, proc = hf
    encoder = AudioEncoder(asr_engine / "audio", threads=1)
    assert (encoder.chunk_padding, encoder.min_samples) == ("full", 8000)
    for name, wav in clips.items():
        x, _ = read_wav(wav)
        inputs = proc.feature_extractor(x, sampling_rate=16000, padding=True,
                                        return_attention_mask=True)  # fmt: skip
        feats, mask = inputs["input_features"], inputs["attention_mask"]
        with torch.no_grad():
            want = model.get_audio_features(feats, mask).pooler_output.numpy()
        frames = int(mask.sum())
        ours, n = audio_features(x, min_samples=encoder.min_samples)
        assert n == frames == max(CLIPS[name], 8000) // 160, name
        assert np.abs(ours - feats[0, :, :n].numpy()).max() < FEATURES_ATOL, name
        got = encoder.encode(feats[0, :, :n].numpy())
        assert got.shape == want.shape == (encoder.token_count(n), 64), name
        assert np.abs(got - want).max() <= ENCODER_RTOL * np.abs(want).max(), name


def test_audio_past_the_build_fails_the_request(asr_engine: Path, clips: dict, tmp_path) -> None:
    """10 s of audio makes 130 audio tokens; the build takes prompts of 128: the request fails
    before its audio is encoded, saying how much audio fits, and the others run."""
    long = tmp_path / "long.wav"
    write_wav(long, signal(160000, 7), 16000)
    code, entries = run(
        asr_engine,
        tmp_path,
        [{"messages": [audio_message(long)]}, {"messages": [audio_message(clips["short"])]}],
    )
    assert code == cli.EXIT_REQUESTS_FAILED
    assert not entries[0]["ok"] and entries[1]["ok"]
    assert entries[0]["error"] == (
        f"audio {long}: 10.00 s of audio makes 130 audio tokens; the engine was built for at "
        "most 128 prompt tokens (--max-input-len), about 9.8 s of audio"
    )
    # a clip that fits but leaves the prompt too long is the text model's usual error
    _, (entry,) = run(
        asr_engine,
        tmp_path / "b",
        [{"messages": [{"role": "system", "content": "word " * 40}, audio_message(clips["past"])]}],
    )
    assert "the engine was built for at most 128 (--max-input-len)" in entry["error"]


def test_validate_config_and_graph_only(
    asr_engine: Path, asr_ckpt: Path, hf: Any, clips: dict, tmp_path: Path, capsys
) -> None:
    """--validate-config passes on the build; --graph-only writes its graph again from the
    engines alone, and for the llm moved into llm/ names the encoder's folder, which then
    runs as before."""
    from edgeomni.builder import cli as build_cli

    assert cli.main(["--config", str(asr_engine), "--validate-config"]) == cli.EXIT_OK
    assert "valid (1 stages, terminals llm:text)" in capsys.readouterr().out
    graph = json.loads((asr_engine / "multistage_config.json").read_text())
    assert "config" not in graph["stages"][0]  # the encoder is found beside the llm
    eng = tmp_path / "eng"
    shutil.copytree(asr_engine, eng, ignore=shutil.ignore_patterns("multistage_config.json"))
    args = ["--graph-only", "--model-dir", str(asr_ckpt), "--engine-dir", str(eng)]
    assert build_cli.main(args) == 0
    assert json.loads((eng / "multistage_config.json").read_text()) == graph
    (eng / "multistage_config.json").unlink()
    (eng / "edgeomni_manifest.json").unlink()  # another tool's layout: no manifest
    (eng / "llm").mkdir()
    for f in [p for p in eng.iterdir() if p.is_file()]:
        f.rename(eng / "llm" / f.name)
    assert build_cli.main(args) == 0
    moved = json.loads((eng / "multistage_config.json").read_text())["stages"][0]
    assert (moved["artifact"], moved["config"]) == ("llm", {"encoders": {"audio": "../audio"}})
    assert cli.main(["--config", str(eng), "--validate-config"]) == cli.EXIT_OK
    _, (entry,) = run(eng, tmp_path / "run", [{"messages": [audio_message(clips["short"])]}])
    assert tokens(entry) == reference(hf, clips["short"])["tokens"]


def test_int4_build_transcribes(
    asr_ckpt: Path, clips: dict, tmp_path: Path, exports: ExportStore
) -> None:
    """--quantization int4_rtn: the llm's linear layers are int4 (the encoder stays float) and
    the build transcribes a clip."""
    from edgeomni.export.family import BuildArgs

    eng = tmp_path / "eng"
    args = BuildArgs(max_batch_size=2, max_input_len=128, max_kv_cache_capacity=256,
                     quantization="int4_rtn")  # fmt: skip
    assert exports.build(asr_ckpt, eng, args) is not None
    assert json.loads((eng / "config.json").read_text())["quantization"]["method"] == "int4_rtn"
    assert json.loads((eng / "audio" / "config.json").read_text()).get("quantization") is None
    code, (entry,) = run(eng, tmp_path / "run", [{"messages": [audio_message(clips["past"])]}])
    assert code == cli.EXIT_OK and len(tokens(entry)) > 0


def test_served_transcriptions_equal_edge_infers(
    asr_engine: Path, clips: dict, tmp_path: Path
) -> None:
    """edge-serve's /v1/audio/transcriptions on the ASR graph, through OpenAI's client: the
    transcript (plain, forced to English, streamed) is edge-infer's ``transcript`` for the same
    clip, language and prompt, and a forced language is verbose_json's."""
    pytest.importorskip("openai")
    pytest.importorskip("python_multipart")
    from test_serve import MODEL, client, start

    from edgeomni.runtime.families.qwen3_asr.transcription import Transcription

    audio = clips["past"].read_bytes()
    wanted = {}
    for language in (None, "en"):
        form = {"messages": Transcription.messages(str(clips["past"]), language, CONTEXT)}
        _, (entry,) = run(asr_engine, tmp_path / str(language), [form],
                          continue_final_message=True, max_generate_length=48)  # fmt: skip
        wanted[language] = entry
    served = start(asr_engine, batch_size=2, max_queue=4)
    try:
        c = client(served)
        got = c.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), prompt=CONTEXT,
                                            temperature=0)  # fmt: skip
        assert got.text == wanted[None]["transcript"]
        forced = c.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en",
                                               prompt=CONTEXT, response_format="verbose_json")  # fmt: skip
        assert forced.text == wanted["en"]["transcript"] and wanted["en"]["language"] == "English"
        assert forced.language == "english"  # OpenAI's form of the forced language's name
        events = list(c.audio.transcriptions.create(model=MODEL, file=("a.wav", audio),
                                                    prompt=CONTEXT, stream=True))  # fmt: skip
        assert "".join(e.delta for e in events[:-1]) == events[-1].text == got.text
    finally:
        served.stop()
