"""Audio in numpy, soundfile and soxr: WAV input and output, resampling, and log-mel features.

The embedded board has no torch or librosa, so the log-mel features upstream computes (transformers'
``WhisperFeatureExtractor``'s numpy path, qwen-tts's speaker mel) are rebuilt here on one
front end, ``mel_spectrogram`` over librosa's slaney filters, so an audio encoder sees the
numbers it was exported against. What a model's processor does around them (its settings,
padding, placeholder counts) is its family's (runtime/families/).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from edgeomni.runtime.media import MediaError

__all__ = ["encoded", "log_mel", "mel_filter_bank", "mel_spectrogram", "pcm16", "read_wav",
           "resample", "write_wav"]

# Frames per STFT block: bounds the float64 frame matrix (3-8 MB) for arbitrarily long audio.
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
# Log-mel features: one front end for Whisper's extractor and qwen-tts's speaker mel
# --------------------------------------------------------------------------------------------

# librosa's slaney mel scale (htk=False): linear below 1 kHz, logarithmic above
_F_SP = 200.0 / 3
_MIN_LOG_MEL = 1000.0 / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def _hz_to_mel(freq: float) -> float:
    """librosa's hz_to_mel (htk=False)."""
    if freq < 1000.0:
        return freq / _F_SP
    return float(_MIN_LOG_MEL + np.log(freq / 1000.0) / _LOGSTEP)


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    """librosa's mel_to_hz (htk=False), the inverse of :func:`_hz_to_mel`."""
    return np.where(
        mels >= _MIN_LOG_MEL, 1000.0 * np.exp(_LOGSTEP * (mels - _MIN_LOG_MEL)), _F_SP * mels
    )


@functools.lru_cache(maxsize=8)
def mel_filter_bank(
    n_mels: int,
    sampling_rate: int,
    n_fft: int,
    f_max: float = 8000.0,
    f_min: float = 0.0,
    dtype: type[np.floating] = np.float64,
) -> np.ndarray:
    """Slaney-scale, slaney-normalised triangular filters ``[n_fft // 2 + 1, n_mels]`` over
    ``f_min..f_max`` Hz: ``librosa.filters.mel(htk=False, norm="slaney", dtype=dtype)``,
    transposed, to the bit (librosa rounds the triangles to ``dtype``, then the scaled array;
    both kept). In float64 over 0..8 kHz it is the bank Whisper's extractor builds (transformers'
    ``mel_filter_bank(norm="slaney", mel_scale="slaney")``, to 5e-16). Cached read-only."""
    fft_freqs = np.fft.rfftfreq(n_fft, 1.0 / sampling_rate)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(f_min), _hz_to_mel(f_max), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower, upper = -ramps[:-2] / fdiff[:-1, None], ramps[2:] / fdiff[1:, None]
    triangles = np.maximum(0.0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels])
    fb = np.ascontiguousarray((triangles.astype(dtype) * enorm[:, None]).astype(dtype).T)
    fb.flags.writeable = False
    return fb


def mel_spectrogram(
    x: np.ndarray,
    filters: np.ndarray,
    *,
    n_fft: int,
    hop_length: int,
    pad: int,
    win_length: int | None = None,
    power: float = 2.0,
    eps: float = 0.0,
    floor: float = 1e-10,
    log: Callable[[np.ndarray], np.ndarray] = np.log10,
) -> np.ndarray:
    """Log-mel frames ``[1 + (len(x) + 2 * pad - n_fft) // hop_length, n_mels]`` float32 of a
    1-D waveform through ``filters`` ``[n_fft // 2 + 1, n_mels]``.

    The waveform taken as float32, reflect-padded by ``pad`` samples each side, a periodic
    Hann window (``win_length``, centred in ``n_fft``, as ``torch.stft`` places it) every
    ``hop_length``, rFFT in float64, ``(|X|^2 + eps) ** (power / 2)``, the filters, then
    ``log(max(., floor))``. Whisper's extractor: power 2, log10, floor 1e-10; qwen-tts's
    speaker mel: magnitude (power 1, eps 1e-9), natural log, floor 1e-5.
    """
    w = np.asarray(x).astype(np.float32, copy=False).astype(np.float64)
    padded = np.pad(w, (pad, pad), mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop_length]
    win = win_length or n_fft
    window = np.zeros(n_fft)
    left = (n_fft - win) // 2
    window[left : left + win] = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(win) / win)
    out = np.empty((frames.shape[0], filters.shape[1]), dtype=np.float32)
    for s in range(0, frames.shape[0], _STFT_BLOCK_FRAMES):
        spec = np.fft.rfft(frames[s : s + _STFT_BLOCK_FRAMES] * window, axis=-1)
        spectrum = (spec.real**2 + spec.imag**2 + eps) ** (power / 2)
        out[s : s + spec.shape[0]] = log(np.maximum(spectrum @ filters, floor))
    return out


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

    ``WhisperFeatureExtractor._np_extract_fbank_features`` (dither 0): the mel front end above
    centred (reflect pad ``n_fft // 2``) with the power spectrum and log10, last frame dropped,
    floor at ``max - 8``, then ``(v + 4) / 4``. It differs from the extractor's by rounding
    only (measured max 1.2e-7, one float32 step: the extractor stores the spectrum as
    complex64). The floor uses the maximum of this whole clip, so features depend on the clip
    as a unit. Raises ``ValueError`` when ``x`` is shorter than one hop (no frame would remain).
    """
    w = np.asarray(x)
    if w.ndim != 1:
        raise ValueError(f"log_mel takes a 1-D waveform, got shape {w.shape}")
    if w.shape[0] < hop_length:
        raise ValueError(
            f"audio of {w.shape[0]} samples is shorter than one hop ({hop_length}): no frames"
        )
    filters = mel_filter_bank(n_mels, sampling_rate, n_fft)
    out = mel_spectrogram(w, filters, n_fft=n_fft, hop_length=hop_length, pad=n_fft // 2)[:-1]
    out = np.maximum(out, out.max() - np.float32(8.0))
    return np.ascontiguousarray(((out + np.float32(4.0)) / np.float32(4.0)).T)
