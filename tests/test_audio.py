"""runtime/audio.py and Qwen3-Omni's audio input (runtime/media/audio_input.py)
against their references: transformers' Whisper extractor and Qwen3-Omni processor (log-mel),
an ideal sine (resampling), soundfile (WAV I/O)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from edgeomni.runtime import audio
from edgeomni.runtime.media import MediaError, audio_input

SR = 16000
# 0.3 s, 1.7 s and 4 s, plus a length that is not a multiple of the hop (frames = len // 160).
LENGTHS = [4800, 27200, 64000, 27211]


def _signal(kind: str, n: int) -> np.ndarray:
    """Random noise or a 100 Hz -> 7 kHz linear chirp, float32, n samples at 16 kHz."""
    if kind == "noise":
        return (np.random.default_rng(n).standard_normal(n) * 0.1).astype(np.float32)
    t = np.arange(n) / SR
    dur = n / SR
    return (0.5 * np.sin(2 * np.pi * (100.0 * t + (7000.0 - 100.0) * t**2 / (2 * dur)))).astype(
        np.float32
    )


@pytest.fixture(scope="module")
def whisper_fe():
    transformers = pytest.importorskip("transformers")
    return transformers.WhisperFeatureExtractor(
        feature_size=128, sampling_rate=SR, hop_length=160, n_fft=400
    )


# --------------------------------------------------------------------------------------------
# log-mel: transformers' WhisperFeatureExtractor and Qwen3OmniMoeProcessor
# --------------------------------------------------------------------------------------------


def test_mel_filter_bank_equals_transformers(whisper_fe) -> None:
    ours = audio.mel_filter_bank(128, SR, 400)
    assert ours.shape == whisper_fe.mel_filters.shape == (201, 128)
    np.testing.assert_allclose(ours, whisper_fe.mel_filters, rtol=0, atol=1e-12)
    assert audio.mel_filter_bank(128, SR, 400) is ours  # built once, cached
    assert not ours.flags.writeable


@pytest.mark.parametrize("kind", ["noise", "chirp"])
def test_log_mel_equals_whisper_feature_extractor(whisper_fe, kind: str) -> None:
    for n in LENGTHS:
        x = _signal(kind, n)
        ours = audio.log_mel(x)
        assert ours.dtype == np.float32 and ours.shape == (128, n // 160)
        # The numpy path the runtime reproduces, step for step.
        ref_np = whisper_fe._np_extract_fbank_features(x[None], "cpu")[0]
        assert ref_np.shape == ours.shape
        assert np.abs(ours - ref_np).max() < 1e-5, (kind, n)
        # The public call (torch STFT when torch is installed), unpadded and untruncated.
        ref = whisper_fe(
            x, sampling_rate=SR, padding="longest", truncation=False, return_tensors="np"
        )["input_features"][0]
        assert ref.shape == ours.shape
        assert np.abs(ours - ref).max() < 1e-4, (kind, n)


def _bare_qwen3_omni_processor(fe):
    """The real Qwen3OmniMoeProcessor.__call__ with a tiny word-level tokenizer and no
    image/video processors (they need PIL/torchvision): only its audio path is exercised."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
        Qwen3OmniMoeProcessor,
    )

    specials = {
        "image_token": "<|image_pad|>",
        "audio_token": "<|audio_pad|>",
        "video_token": "<|video_pad|>",
        "vision_bos_token": "<|vision_start|>",
        "vision_eos_token": "<|vision_end|>",
        "audio_bos_token": "<|audio_start|>",
        "audio_eos_token": "<|audio_end|>",
    }
    vocab = {"<unk>": 0, "hi": 1, **{tok: i + 2 for i, tok in enumerate(specials.values())}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<unk>",
        extra_special_tokens=specials,
    )
    proc = Qwen3OmniMoeProcessor.__new__(Qwen3OmniMoeProcessor)
    proc.tokenizer, proc.feature_extractor, proc.chat_template = tok, fe, None
    for name in list(specials) + ["image_token_id", "audio_token_id", "video_token_id"]:
        setattr(proc, name, getattr(tok, name))
    return proc


def test_audio_features_equal_qwen3_omni_processor(whisper_fe) -> None:
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import (
        Qwen3OmniMoeProcessor,
        _get_feat_extract_output_lengths,
    )

    # The kwargs the module docstring relies on: no padding for one clip, no truncation.
    kw = Qwen3OmniMoeProcessor.audio_kwargs
    assert kw["padding"] is True and kw["truncation"] is False
    assert kw["return_attention_mask"] is True and kw["sampling_rate"] == SR

    proc = _bare_qwen3_omni_processor(whisper_fe)
    for kind in ("noise", "chirp"):
        for n in LENGTHS:
            x = _signal(kind, n)
            out = proc(
                text="hi <|audio_start|> <|audio_pad|> <|audio_end|>",
                audio=[x],
                return_tensors="np",
            )
            feats, n_frames = audio_input.audio_features(x)
            assert n_frames == n // 160
            # Not padded to 30 s (3000 frames): exactly the clip.
            assert out["input_features"].shape == (1, 128, n_frames)
            assert int(out["feature_attention_mask"].sum()) == n_frames
            assert np.abs(out["input_features"][0] - feats).max() < 1e-4, (kind, n)
            n_tokens = int((out["input_ids"] == proc.audio_token_id).sum())
            assert audio_input.audio_token_count(n_frames) == n_tokens
            assert n_tokens == int(_get_feat_extract_output_lengths(np.array(n_frames)))


def test_audio_token_count_equals_processor_formula() -> None:
    mod = pytest.importorskip("transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe")
    frames = np.arange(1, 3001)
    ref = mod._get_feat_extract_output_lengths(frames, 50)
    ours = np.array([audio_input.audio_token_count(int(f)) for f in frames])
    np.testing.assert_array_equal(ours, ref)
    assert audio_input.audio_token_count(100) == 13  # one full 2 * n_window chunk


def test_log_mel_rejects_inputs_without_frames() -> None:
    with pytest.raises(ValueError, match="shorter than one hop"):
        audio.log_mel(np.zeros(159, dtype=np.float32))
    with pytest.raises(ValueError, match="1-D"):
        audio.log_mel(np.zeros((2, 1600), dtype=np.float32))
    assert audio.log_mel(np.zeros(160, dtype=np.float32)).shape == (128, 1)


def test_runtime_audio_imports_no_torch_or_transformers() -> None:
    code = (
        "import sys, edgeomni.runtime.audio;"
        "bad = [m for m in ('torch', 'transformers', 'scipy') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------------------------
# read_wav / write_wav
# --------------------------------------------------------------------------------------------


def test_read_wav_stereo_44k_mixes_to_mono(tmp_path: Path) -> None:
    rate = 44100
    t = np.arange(rate // 2) / rate
    left = 0.6 * np.sin(2 * np.pi * 440 * t)
    right = -0.2 * np.sin(2 * np.pi * 1000 * t)
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, right], axis=1), rate, subtype="PCM_16")
    x, got_rate = audio.read_wav(path)
    assert got_rate == rate
    assert x.dtype == np.float32 and x.ndim == 1 and x.shape[0] == left.shape[0]
    np.testing.assert_allclose(x, (left + right) / 2, atol=2.0 / 32768)
    # FLAC goes through the same reader.
    flac = tmp_path / "mono.flac"
    sf.write(flac, left, 16000, subtype="PCM_16")
    y, flac_rate = audio.read_wav(flac)
    assert flac_rate == 16000
    np.testing.assert_allclose(y, left, atol=1.0 / 32768)


def test_read_wav_clips_float_files_to_unit_range(tmp_path: Path) -> None:
    path = tmp_path / "hot.wav"
    sf.write(path, np.array([1.5, -2.0, 0.25]), 8000, subtype="FLOAT")
    x, _ = audio.read_wav(path)
    np.testing.assert_allclose(x, [1.0, -1.0, 0.25])


def test_read_wav_rejects_non_audio_and_empty_files(tmp_path: Path) -> None:
    junk = tmp_path / "notes.wav"
    junk.write_text("this is not audio\n" * 20)
    with pytest.raises(ValueError, match="notes.wav"):
        audio.read_wav(junk)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0), 16000, subtype="PCM_16")
    with pytest.raises(ValueError, match="empty.wav"):
        audio.read_wav(empty)
    with pytest.raises(FileNotFoundError, match="missing.wav"):
        audio.read_wav(tmp_path / "missing.wav")


def test_read_wav_says_which_file_holds_no_samples(tmp_path: Path) -> None:
    """One line naming the file once: "audio PATH: holds no samples" (edge-serve puts the
    field in PATH: never "audio file file holds no samples")."""
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0), 16000, subtype="PCM_16")
    with pytest.raises(MediaError) as got:
        audio.read_wav(empty)
    assert str(got.value) == f"audio {empty}: holds no samples"
    assert got.value.reason == "holds no samples"


@pytest.mark.parametrize(
    ("samples", "bad"),
    [
        (np.full((800, 1), np.nan), 800),  # all NaN
        (np.concatenate([np.zeros((798, 1)), [[np.inf], [-np.inf]]]), 2),  # two infinities
        (np.stack([np.zeros(800), np.r_[np.nan, np.zeros(799)]], axis=1), 1),  # one channel
    ],
)
def test_read_wav_refuses_samples_that_are_not_finite(
    tmp_path: Path, samples: np.ndarray, bad: int
) -> None:
    """A float file's NaN or infinity would turn the clip's every feature to NaN (and an
    infinity be clipped to full scale): refused, naming the file and how many."""
    path = tmp_path / "nan.wav"
    sf.write(path, samples, 16000, subtype="FLOAT")
    with pytest.raises(MediaError) as got:
        audio.read_wav(path)
    assert str(got.value) == (
        f"audio {path}: {bad} of its {samples.size} samples are not finite numbers "
        "(NaN or infinity)"
    )


def test_write_wav_round_trip_pcm16_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rate = 24000
    t = np.arange(rate) / rate
    x = (0.8 * np.sin(2 * np.pi * 330 * t)).astype(np.float32)
    x[:3] = [1.7, -3.0, np.nan]  # clipped, clipped, written as 0
    path = tmp_path / "out.wav"
    audio.write_wav(path, x, rate)
    info = sf.info(path)
    assert (info.format, info.subtype, info.channels, info.samplerate) == (
        "WAV",
        "PCM_16",
        1,
        rate,
    )
    y, got_rate = audio.read_wav(path)
    assert got_rate == rate and y.shape == x.shape
    expect = np.clip(np.nan_to_num(x), -1.0, 1.0)
    np.testing.assert_allclose(y, expect, atol=1.0 / 16384)
    assert y[0] > 0.999 and y[1] == -1.0 and y[2] == 0.0
    assert sorted(os.listdir(tmp_path)) == ["out.wav"]  # no temp file left

    # Overwrite in place: a failed write leaves the old file intact and no temp file behind.
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    with monkeypatch.context() as mp:
        mp.setattr(audio.sf, "write", boom)
        with pytest.raises(RuntimeError, match="disk full"):
            audio.write_wav(path, np.zeros(10), rate)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["out.wav"]

    audio.write_wav(path, np.zeros(10), rate)  # a successful overwrite replaces it
    assert sf.info(path).frames == 10


def test_write_wav_rejects_multichannel_and_bad_rate(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="mono"):
        audio.write_wav(tmp_path / "a.wav", np.zeros((10, 2)), 16000)
    with pytest.raises(ValueError, match="rate"):
        audio.write_wav(tmp_path / "a.wav", np.zeros(10), 0)
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------------------------
# resample
# --------------------------------------------------------------------------------------------

EDGE = 200  # output samples skipped at each end (the filter sees the zero padding there)


def _tone(freqs_amps: list[tuple[float, float]], rate: int, n: int) -> np.ndarray:
    t = np.arange(n) / rate
    return sum(a * np.sin(2 * np.pi * f * t + 0.3) for f, a in freqs_amps)


@pytest.mark.parametrize(
    ("src", "dst"), [(44100, 16000), (48000, 16000), (24000, 16000), (16000, 24000), (8000, 16000)]
)
def test_resample_keeps_in_band_sines(src: int, dst: int) -> None:
    tones = [(440.0, 0.5), (2500.0, 0.3)]  # both well below min(src, dst) / 2
    y = audio.resample(_tone(tones, src, src), src, dst)
    assert y.dtype == np.float32 and y.shape == (dst,)
    ideal = _tone(tones, dst, dst)
    err = np.abs(y - ideal)[EDGE:-EDGE].max()
    assert err < 1e-3, err


def test_resample_removes_energy_above_new_nyquist() -> None:
    src, dst = 44100, 16000
    n = src
    in_band = _tone([(1000.0, 0.5)], src, n)
    # 9 kHz and 12 kHz would alias to 7 kHz and 4 kHz at 16 kHz.
    out_of_band = _tone([(9000.0, 0.4), (12000.0, 0.4)], src, n)
    y_out = audio.resample(out_of_band, src, dst)
    assert np.abs(y_out[EDGE:-EDGE]).max() < 1e-3
    y_mix = audio.resample(in_band + out_of_band, src, dst)
    ideal = _tone([(1000.0, 0.5)], dst, y_mix.shape[0])
    assert np.abs(y_mix - ideal)[EDGE:-EDGE].max() < 1e-3
    # Noise confined to 8.2-20 kHz (FFT-masked): all of it would fold into 0-8 kHz if not removed.
    spec = np.fft.rfft(np.random.default_rng(0).standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / src)
    spec[(freqs < 8200) | (freqs > 20000)] = 0
    hf_noise = np.fft.irfft(spec, n)
    y_noise = audio.resample(hf_noise, src, dst)
    rms_in = np.sqrt(np.mean(hf_noise**2))
    rms_out = np.sqrt(np.mean(y_noise[EDGE:-EDGE].astype(np.float64) ** 2))
    assert rms_out < 1e-3 * rms_in, (rms_out, rms_in)


@pytest.mark.parametrize(
    ("n", "src", "dst"),
    [(3, 2, 1), (1, 2, 1), (5, 4, 1), (441, 44100, 16000), (1000, 44100, 16000), (7, 16000, 24000)]
    + [(n, 48000, 22050) for n in (1, 2, 99, 100, 101)],
)
def test_resample_length_rule(n: int, src: int, dst: int) -> None:
    expect = math.ceil(Fraction(n * dst, src))  # librosa's and transformers' length
    y = audio.resample(np.ones(n), src, dst)
    assert y.shape == (expect,)


def test_resample_identity() -> None:
    x = np.random.default_rng(3).standard_normal(1000)
    y = audio.resample(x, 16000, 16000)
    assert y.dtype == np.float32 and y is not x
    np.testing.assert_array_equal(y, x.astype(np.float32))
    assert audio.resample(np.zeros(0), 44100, 16000).shape == (0,)


@pytest.mark.parametrize(
    ("src", "dst", "n"),
    [(44100, 16000, 44101), (48000, 16000, 4801), (16000, 24000, 16001), (22050, 24000, 2205),
     (8000, 16000, 7)],
)
def test_read_and_resample_equal_transformers_load_audio(
    tmp_path: Path, src: int, dst: int, n: int
) -> None:
    """read_wav + resample == transformers' load_audio (soundfile + soxr_hq, librosa.load's
    steps; qwen-tts's librosa.resample is the same soxr call): bit for bit (tolerance 0)."""
    from transformers.audio_utils import load_audio

    path = tmp_path / "a.wav"
    sf.write(path, np.random.default_rng(n).standard_normal(n) * 0.1, src, subtype="FLOAT")
    wav, rate = audio.read_wav(path)
    ref = load_audio(str(path), sampling_rate=dst, backend="soundfile")
    np.testing.assert_array_equal(audio.resample(wav, rate, dst), ref)
