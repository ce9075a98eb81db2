"""What the upstream Qwen3-TTS reference gives (qwen-tts 0.1.1 on transformers 4.57.3, own venv).

Later parity tests compare edgeomni's Qwen3-TTS pipeline against these runs, so this file pins
down their shape and their properties: every mode makes ``talker_steps - 1`` frames of 16 codes
(but STOPPED, whose talker ends on EOS by itself) and exactly 1920 samples a frame of finite, audible audio; runs are deterministic (the same
checkpoint twice, and a checkpoint rebuilt from its seed); streaming and non-streaming text
input give different codes; Base's speaker embedding is one talker-width vector.

The fixtures (tests/conftest.py) make the venv once (cached under ~/.cache/edgeomni) and run
tests/qwen_tts_reference/make_reference.py once per session.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from qwen_tts_reference.harness import Reference

BASE_MODES = ("cv_plain", "cv_dialect", "base_xvec", "base_icl", "base_icl2", "vd", "cv_instruct")
STOPPED = "cv_instruct_nonstream"  # make_reference.make_stopping: EOS wins near frame 5
MODES = tuple(f"{m}_{s}" for m in BASE_MODES for s in ("stream", "nonstream"))
NUM_CODE_GROUPS = 16
CODEBOOK = 2048
SAMPLES_PER_FRAME = 1920
SAMPLE_RATE = 24000
REF_FRAMES = 10  # make_reference.py's reference WAV: 10 * 1920 samples


def load(manifest: dict, mode: str) -> dict[str, np.ndarray]:
    with np.load(manifest["modes"][mode]["npz"]) as z:
        return {k: z[k] for k in z.files}


def test_manifest(qwen_tts_reference: dict) -> None:
    m = qwen_tts_reference
    assert sorted(m["modes"]) == sorted(MODES)
    assert m["versions"]["qwen-tts"] == "0.1.1"
    assert m["versions"]["transformers"] == "4.57.3"
    assert m["sample_rate"] == SAMPLE_RATE and m["samples_per_frame"] == SAMPLES_PER_FRAME
    gen = m["generation"]
    assert gen["do_sample"] is False and gen["subtalker_dosample"] is False
    assert gen["max_new_tokens"] == m["talker_steps"]


@pytest.mark.parametrize("kind", ["custom_voice", "base", "voice_design", "custom_voice_1b7"])
def test_release_layout(qwen_tts_reference: dict, kind: str) -> None:
    ckpt = Path(qwen_tts_reference["checkpoints"][kind]["dir"])
    names = {p.name for p in ckpt.iterdir()}
    assert names == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "vocab.json",
        "merges.txt",
        "tokenizer_config.json",
        "preprocessor_config.json",
        "speech_tokenizer",
    }
    codec = {p.name for p in (ckpt / "speech_tokenizer").iterdir()}
    assert codec == {
        "config.json",
        "configuration.json",
        "model.safetensors",
        "preprocessor_config.json",
    }
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_tts"
    assert cfg["tts_model_type"] == kind.removesuffix("_1b7")
    assert cfg["tts_model_size"] == ("0b6" if kind in ("custom_voice", "base") else "1b7")
    assert "model_type" not in cfg["speaker_encoder_config"]  # the save_pretrained pitfall
    gen = json.loads((ckpt / "generation_config.json").read_text())
    assert gen["do_sample"] is True and gen["subtalker_dosample"] is True  # release defaults
    codec_cfg = json.loads((ckpt / "speech_tokenizer" / "config.json").read_text())
    assert codec_cfg["model_type"] == "qwen3_tts_tokenizer_12hz"
    assert codec_cfg["decoder_config"]["num_quantizers"] == NUM_CODE_GROUPS


@pytest.mark.parametrize("mode", MODES)
def test_codes_and_audio(qwen_tts_reference: dict, mode: str) -> None:
    m = qwen_tts_reference
    info = m["modes"][mode]
    arrays = load(m, mode)
    codes, wav = arrays["codes"], arrays["wav"]
    # N talker forwards give N - 1 frames: the prefill makes no frame, and the last sampled
    # code is never fed back (codec EOS is never chosen: make_reference zeroes its head row, but
    # in STOPPED, which ends on EOS after at least the 2 frames upstream's min_new_tokens keeps)
    frames = m["talker_steps"] - 1
    if mode == STOPPED:
        frames = info["frames"]
        assert 2 <= frames < m["talker_steps"] - 1
    assert codes.dtype == np.int64 and codes.shape == (frames, NUM_CODE_GROUPS)
    assert info["frames"] == frames
    assert codes.min() >= 0 and codes.max() < CODEBOOK
    assert len({tuple(row) for row in codes}) > 1, "the talker repeats one frame"
    assert wav.dtype == np.float32 and wav.ndim == 1
    # Also for ICL, where the reference frames are decoded in front and cut off again.
    assert wav.shape[0] == frames * SAMPLES_PER_FRAME == info["samples"]
    assert np.isfinite(wav).all()
    assert np.abs(wav).max() <= 1.0
    assert wav.std() > 0.01, "silent audio: are the RVQ embedding_sum tables random?"


@pytest.mark.parametrize("mode", BASE_MODES)
def test_streaming_text_changes_the_codes(qwen_tts_reference: dict, mode: str) -> None:
    """Streaming and non-streaming text input give different codes, from the first frame on.

    They are different prompts, not two schedules of one computation: streaming prefills only
    the first text token (over codec_bos) and adds one more text embedding to each step's input;
    non-streaming prefills the whole text + tts_eos over codec_pad, then tts_pad + codec_bos, and
    adds tts_pad to every step (ICL: text over reference codes vs. text before them). The
    talker's inputs differ, so its greedy choices do too.
    """
    stream = load(qwen_tts_reference, f"{mode}_stream")["codes"]
    nonstream = load(qwen_tts_reference, f"{mode}_nonstream")["codes"]
    if STOPPED not in (f"{mode}_stream", f"{mode}_nonstream"):
        assert stream.shape == nonstream.shape
    assert not np.array_equal(stream[0], nonstream[0])


def test_speaker_embedding(qwen_tts_reference: dict) -> None:
    m = qwen_tts_reference
    cfg = json.loads((Path(m["checkpoints"]["base"]["dir"]) / "config.json").read_text())
    hidden = cfg["talker_config"]["hidden_size"]
    assert cfg["speaker_encoder_config"]["enc_dim"] == hidden
    embeddings = []
    for mode in (
        "base_xvec_stream",
        "base_xvec_nonstream",
        "base_icl_stream",
        "base_icl_nonstream",
    ):
        spk = load(m, mode)["spk_embedding"]
        assert spk.dtype == np.float32 and spk.shape == (hidden,)
        assert np.isfinite(spk).all() and np.abs(spk).max() > 0
        embeddings.append(spk)
    for spk in embeddings[1:]:  # one reference WAV: one embedding
        np.testing.assert_array_equal(spk, embeddings[0])
    for mode in MODES:
        if not mode.startswith("base"):
            assert "spk_embedding" not in load(m, mode)


def test_reference_codes(qwen_tts_reference: dict) -> None:
    m = qwen_tts_reference
    ref = [load(m, mode)["ref_codes"] for mode in ("base_icl_stream", "base_icl_nonstream")]
    assert ref[0].dtype == np.int64 and ref[0].shape == (REF_FRAMES, NUM_CODE_GROUPS)
    assert ref[0].min() >= 0 and ref[0].max() < CODEBOOK
    assert len({tuple(row) for row in ref[0]}) > 1, "all-equal codes: is Mimi's embed_sum random?"
    np.testing.assert_array_equal(ref[0], ref[1])
    assert m["modes"]["base_icl_stream"]["ref_frames"] == REF_FRAMES
    assert "ref_codes" not in load(m, "base_xvec_stream")  # x-vector only: no ICL prompt
    # the second reference: another voice, 8 frames (its last one partial)
    other = load(m, "base_icl2_stream")
    assert other["ref_codes"].shape == (8, NUM_CODE_GROUPS)
    assert m["modes"]["base_icl2_stream"]["ref_wav"] != m["modes"]["base_icl_stream"]["ref_wav"]
    assert np.abs(other["spk_embedding"] - load(m, "base_icl_stream")["spk_embedding"]).max() > 0.1


def test_modes_differ(qwen_tts_reference: dict) -> None:
    """Speaker, dialect, cloning prompt and instruct each reach the codes."""
    firsts = {mode: load(qwen_tts_reference, f"{mode}_stream")["codes"] for mode in BASE_MODES}
    names = list(firsts)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not np.array_equal(firsts[a], firsts[b]), (a, b)


@pytest.fixture(scope="module")
def reruns(qwen_tts_python: Path, qwen_tts_reference: dict, tmp_path_factory) -> dict:
    """Two more processes, side by side: ``again`` on the first run's checkpoints (same
    checkpoint, same requests), ``rebuilt`` making its checkpoints afresh from their seeds."""
    only = ["cv_plain_stream", "base_icl_stream", "vd_nonstream"]
    earlier = qwen_tts_reference["out_dir"]
    runs = [Reference(qwen_tts_python, tmp_path_factory.mktemp("qwen-tts-rerun"),
                      "--checkpoints", earlier, "--only", *only)]  # fmt: skip
    try:
        runs.append(Reference(qwen_tts_python, tmp_path_factory.mktemp("qwen-tts-rebuilt"),
                              "--only", "cv_plain_stream"))  # fmt: skip
        return {"again": runs[0].manifest(), "rebuilt": runs[1].manifest()}
    finally:
        for run in runs:  # one that failed leaves the other running
            run.stop()


def test_deterministic_on_the_same_checkpoint(qwen_tts_reference: dict, reruns: dict) -> None:
    rerun = reruns["again"]
    assert sorted(rerun["modes"]) == ["base_icl_stream", "cv_plain_stream", "vd_nonstream"]
    for mode in rerun["modes"]:
        first, again = load(qwen_tts_reference, mode), load(rerun, mode)
        assert sorted(first) == sorted(again)
        for key in first:  # codes, wav, and for Base the embedding and reference codes
            np.testing.assert_array_equal(again[key], first[key], err_msg=f"{mode}: {key}")


def test_checkpoints_rebuild_bit_identical(qwen_tts_reference: dict, reruns: dict) -> None:
    """Seeded: a fresh build gives the same weights, hence the same codes."""
    again = reruns["rebuilt"]
    for kind, ckpt in qwen_tts_reference["checkpoints"].items():
        assert again["checkpoints"][kind]["sha256"] == ckpt["sha256"], kind
    assert again["codec_sha256"] == qwen_tts_reference["codec_sha256"]
    first, second = load(qwen_tts_reference, "cv_plain_stream"), load(again, "cv_plain_stream")
    np.testing.assert_array_equal(second["codes"], first["codes"])
    np.testing.assert_array_equal(second["wav"], first["wav"])
