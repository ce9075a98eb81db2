"""Audio in numpy, soundfile and soxr: WAV input and output, resampling, and log-mel features.

The embedded board has no torch, so the features transformers' ``WhisperFeatureExtractor``
computes are rebuilt here from its numpy path (``_np_extract_fbank_features``), step for step and
in the same dtypes, so an audio encoder sees the numbers it was exported against. What a model's
processor does around them (its settings, padding, placeholder counts) is its family's
(runtime/families/).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from edgeomni.runtime.media import MediaError

__all__ = ["encoded", "log_mel", "mel_filter_bank", "pcm16", "read_wav", "resample", "write_wav"]

# WhisperFeatureExtractor hard-codes the mel range to [0, 8000] Hz whatever the sampling rate.
_MEL_F_MIN = 0.0
_MEL_F_MAX = 8000.0
# Frames per STFT block: bounds the float64 frame matrix (~3 MB) for arbitrarily long audio.
_STFT_BLOCK_FRAMES = 1024


# --------------------------------------------------------------------------------------------
# WAV input / output
# --------------------------------------------------------------------------------------------


def read_wav(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """Read any file libsndfile decodes (WAV, FLAC, ...) as mono float32 in [-1, 1] plus its rate.

    Channels are averaged (the usual mono mix-down); float files with samples outside [-1, 1]
    are clipped so every caller sees the same range as from a PCM file. A missing path raises
    ``FileNotFoundError``; a file that cannot be decoded, holds no samples or holds a sample
    that is no finite number (a float file's NaN or infinity, which would turn every feature
    of the clip to NaN) raises ``MediaError`` naming the path. Every path that decodes audio
    reads it here, so each refuses such a file alike.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"audio file not found: {p}")
    try:
        data, rate = sf.read(str(p), dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError, TypeError) as exc:
        said = str(exc).replace(repr(str(p)), "").replace(str(p), "").replace(" :", ":")
        raise MediaError("audio", p, f"not audio libsndfile decodes ({said.strip()})") from None
    if data.shape[0] == 0 or data.shape[1] == 0:
        raise MediaError("audio", p, "holds no samples")
    bad = data.size - int(np.isfinite(data).sum())
    if bad:
        raise MediaError("audio", p, f"{bad} of its {data.size} samples are not finite numbers "
                         "(NaN or infinity)")  # fmt: skip
    mono = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float64)
    mono = np.clip(mono, -1.0, 1.0).astype(np.float32, copy=False)
    return np.ascontiguousarray(mono), int(rate)


def write_wav(path: str | os.PathLike[str], audio: np.ndarray, rate: int) -> None:
    """Write mono 16-bit PCM WAV, clipping to [-1, 1], atomically.

    The data goes to a temp file in the destination's directory and is ``os.replace``-d onto
    ``path``, so a reader (or a crash) never sees a half-written file. NaNs are written as 0
    (PCM has no NaN). The file gets mode 0644.
    """
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise ValueError(f"rate must be a positive integer, got {rate!r}")
    x = np.asarray(audio)
    if x.ndim == 2 and 1 in x.shape:
        x = x.reshape(-1)
    if x.ndim != 1:
        raise ValueError(f"write_wav takes mono audio (1-D), got shape {x.shape}")
    data = encoded(x, rate, "wav")
    dest = Path(os.path.realpath(path))  # through a symlink to its file, as ``>`` writes
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _clipped(audio: np.ndarray) -> np.ndarray:
    """float64 samples in [-1, 1], NaN as 0 (PCM has no NaN)."""
    return np.clip(np.nan_to_num(np.asarray(audio, np.float64), nan=0.0), -1.0, 1.0)


def pcm16(audio: np.ndarray) -> bytes:
    """Samples as raw 16-bit little-endian PCM: those ``write_wav`` writes (libsndfile's
    conversion, floor(x * 32768) clipped)."""
    return np.clip(np.floor(_clipped(audio) * 32768.0), -32768, 32767).astype("<i2").tobytes()


def encoded(audio: np.ndarray, rate: int, fmt: str) -> bytes:
    """A whole utterance as 16-bit ``fmt``: "pcm" (raw), "wav" or "flac"."""
    if fmt == "pcm":
        return pcm16(audio)
    buf = io.BytesIO()
    sf.write(buf, _clipped(audio), int(rate), format=fmt.upper(), subtype="PCM_16")
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# Resampling
# --------------------------------------------------------------------------------------------


def resample(x: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """A 1-D signal from ``src_rate`` to ``dst_rate`` Hz, float32, as upstream resamples its
    audio inputs (transformers' ``load_audio``, ``librosa.load`` and ``librosa.resample``, which
    qwen-tts calls): soxr at ``soxr_hq`` on the float32 samples, then zero-padded or cut to
    ``ceil(len(x) * dst_rate / src_rate)`` samples. Equal rates return a float32 copy."""
    x = np.asarray(x, dtype=np.float32)
    if src_rate == dst_rate:
        return x.copy()
    n = -(-x.shape[0] * int(dst_rate) // int(src_rate))
    y = soxr.resample(x, src_rate, dst_rate, quality="soxr_hq")
    return np.pad(y, (0, max(0, n - y.shape[0])))[:n]


# --------------------------------------------------------------------------------------------
# Log-mel features (WhisperFeatureExtractor, numpy path)
# --------------------------------------------------------------------------------------------


def _hz_to_mel_slaney(freq: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above (as transformers' hertz_to_mel)."""
    freq = np.asarray(freq, dtype=np.float64)
    mels = 3.0 * freq / 200.0
    log_region = freq >= 1000.0
    logstep = 27.0 / np.log(6.4)
    return np.where(log_region, 15.0 + np.log(np.maximum(freq, 1e-300) / 1000.0) * logstep, mels)


def _mel_to_hz_slaney(mels: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_hz_to_mel_slaney` (as transformers' mel_to_hertz)."""
    mels = np.asarray(mels, dtype=np.float64)
    freq = 200.0 * mels / 3.0
    logstep = np.log(6.4) / 27.0
    return np.where(mels >= 15.0, 1000.0 * np.exp(logstep * (mels - 15.0)), freq)


@functools.lru_cache(maxsize=8)
def mel_filter_bank(n_mels: int, sampling_rate: int, n_fft: int) -> np.ndarray:
    """Slaney-scale, slaney-normalised triangular filters ``[n_fft // 2 + 1, n_mels]`` (float64).

    Same construction as transformers' ``mel_filter_bank(norm="slaney", mel_scale="slaney",
    min_frequency=0, max_frequency=8000)``; built once per configuration and cached read-only.
    """
    n_freqs = 1 + n_fft // 2
    mel_pts = np.linspace(
        _hz_to_mel_slaney(np.float64(_MEL_F_MIN)),
        _hz_to_mel_slaney(np.float64(_MEL_F_MAX)),
        n_mels + 2,
    )
    filter_freqs = _mel_to_hz_slaney(mel_pts)
    fft_freqs = np.linspace(0, sampling_rate // 2, n_freqs)
    filter_diff = np.diff(filter_freqs)
    slopes = filter_freqs[None, :] - fft_freqs[:, None]
    down_slopes = -slopes[:, :-2] / filter_diff[:-1]
    up_slopes = slopes[:, 2:] / filter_diff[1:]
    fb = np.maximum(np.zeros(1), np.minimum(down_slopes, up_slopes))
    fb *= (2.0 / (filter_freqs[2 : n_mels + 2] - filter_freqs[:n_mels]))[None, :]
    fb.flags.writeable = False
    return fb


@functools.lru_cache(maxsize=8)
def _hann_periodic(n_fft: int) -> np.ndarray:
    """Periodic Hann window of length ``n_fft`` (``np.hanning(n_fft + 1)[:-1]``), float64."""
    w = np.hanning(n_fft + 1)[:-1]
    w.flags.writeable = False
    return w


def log_mel(
    x: np.ndarray,
    *,
    n_mels: int = 128,
    sampling_rate: int = 16000,
    n_fft: int = 400,
    hop_length: int = 160,
) -> np.ndarray:
    """Whisper log-mel spectrogram ``[n_mels, len(x) // hop_length]`` float32 of one waveform
    (the defaults: ``WhisperFeatureExtractor(feature_size=128)``'s 16 kHz STFT).

    Exactly ``WhisperFeatureExtractor._np_extract_fbank_features`` (dither 0): waveform taken as
    float32, reflect-padded by ``n_fft // 2``, periodic-Hann frames every ``hop_length``, float64
    rFFT stored as complex64, power ``|X|^2``, slaney mel filters, ``log10(max(., 1e-10))`` cast
    to float32, last frame dropped, floor at ``max - 8``, then ``(v + 4) / 4``. The floor uses the
    maximum of this whole clip, so features depend on the clip as a unit. Raises ``ValueError``
    when ``x`` is shorter than one hop (no frame would remain).
    """
    w = np.asarray(x)
    if w.ndim != 1:
        raise ValueError(f"log_mel takes a 1-D waveform, got shape {w.shape}")
    n_frames = w.shape[0] // hop_length
    if n_frames < 1:
        raise ValueError(
            f"audio of {w.shape[0]} samples is shorter than one hop ({hop_length}): no frames"
        )
    # The extractor hands the spectrogram float32 samples; promote to float64 after that cast.
    w = w.astype(np.float32, copy=False)
    pad = n_fft // 2
    padded = np.pad(w, (pad, pad), mode="reflect").astype(np.float64)
    window = _hann_periodic(n_fft)
    filters_t = mel_filter_bank(n_mels, sampling_rate, n_fft).T
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop_length]
    # 1 + len // hop frames exist; the extractor drops the last one, so never compute it.
    frames = frames[:n_frames]
    out = np.empty((n_mels, n_frames), dtype=np.float32)
    for s in range(0, n_frames, _STFT_BLOCK_FRAMES):
        block = frames[s : s + _STFT_BLOCK_FRAMES] * window
        spec = np.fft.rfft(block, axis=-1).astype(np.complex64)
        power = np.abs(spec, dtype=np.float64) ** 2.0
        mel = np.maximum(1e-10, filters_t @ power.T)
        out[:, s : s + block.shape[0]] = np.log10(mel)
    out = np.maximum(out, out.max() - np.float32(8.0))
    return (out + np.float32(4.0)) / np.float32(4.0)
