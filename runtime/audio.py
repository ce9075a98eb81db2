"""Audio in numpy + soundfile: WAV input and output, band-limited resampling, and Whisper-style
log-mel features.

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
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

from edgeomni.runtime.media import MediaError

__all__ = ["encoded", "log_mel", "mel_filter_bank", "pcm16", "read_wav", "resample", "write_wav"]

# WhisperFeatureExtractor hard-codes the mel range to [0, 8000] Hz whatever the sampling rate.
_MEL_F_MIN = 0.0
_MEL_F_MAX = 8000.0
# Frames per STFT block: bounds the float64 frame matrix (~3 MB) for arbitrarily long audio.
_STFT_BLOCK_FRAMES = 1024

# Resampler design. A Kaiser-windowed sinc with beta 8.6 has ~86 dB stopband and ~1e-4 ripple;
# 32 zero crossings each side make the transition ~17% of the target Nyquist wide, and the
# cutoff at 0.92 * Nyquist puts the stopband edge just above the new Nyquist, so downsampling
# aliases nothing above ~-80 dB while the band up to ~0.83 * Nyquist stays flat.
_KAISER_BETA = 8.6
_ZERO_CROSSINGS = 32
_ROLLOFF = 0.92
# Output samples per polyphase block: bounds the gathered [block, taps] matrix.
_RESAMPLE_BLOCK = 4096


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


@functools.lru_cache(maxsize=16)
def _polyphase_filter(up: int, down: int) -> tuple[np.ndarray, int]:
    """Kaiser-windowed sinc low-pass for an ``up``/``down`` change, split into ``up`` phases.

    Returns ``(phases [up, taps], half_len)``; ``phases[p, i] = h[p + i * up]`` with ``h`` the
    zero-phase filter of length ``2 * half_len + 1`` (gain ``up`` so upsampling keeps level).
    """
    m = max(up, down)
    half_len = _ZERO_CROSSINGS * m
    n = np.arange(-half_len, half_len + 1, dtype=np.float64)
    cutoff = _ROLLOFF / m  # in units of the upsampled Nyquist
    h = cutoff * np.sinc(cutoff * n) * np.kaiser(2 * half_len + 1, _KAISER_BETA)
    h *= up / h.sum()  # unity DC gain, times up for the zeros upsampling inserts
    taps = -(-h.size // up)
    padded = np.zeros(taps * up, dtype=np.float64)
    padded[: h.size] = h
    phases = np.ascontiguousarray(padded.reshape(taps, up).T)
    phases.flags.writeable = False
    return phases, half_len


def resample(x: np.ndarray, src_rate: int, dst_rate: int) -> np.ndarray:
    """Band-limited resampling of a 1-D signal from ``src_rate`` to ``dst_rate`` Hz (float32 out).

    Polyphase windowed-sinc (Kaiser, beta 8.6, 32 zero crossings per side at the lower rate)
    with rational factors ``up/down = dst/src`` reduced by their gcd; the cutoff sits at 0.92 of
    the lower of the two Nyquists, so when downsampling everything above the new Nyquist is
    removed (stopband > ~80 dB) instead of aliasing. Outside the signal is zero (as in
    ``scipy.signal.resample_poly``), so the first/last ~32 output samples see the edge.

    Output length rule: ``floor(len(x) * dst_rate / src_rate + 1/2)`` (round half up, exact
    integer arithmetic). Output sample ``m`` is the band-limited signal at input time
    ``m * src_rate / dst_rate``. Equal rates return a float32 copy of ``x`` unchanged.
    """
    for name, rate in (("src_rate", src_rate), ("dst_rate", dst_rate)):
        if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
            raise ValueError(f"{name} must be a positive integer, got {rate!r}")
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"resample takes a 1-D signal, got shape {x.shape}")
    if src_rate == dst_rate:
        return x.astype(np.float32, copy=True)
    g = math.gcd(int(src_rate), int(dst_rate))
    up, down = int(dst_rate) // g, int(src_rate) // g
    n_in = x.shape[0]
    n_out = (2 * n_in * up + down) // (2 * down)
    if n_out == 0:
        return np.zeros(0, dtype=np.float32)

    phases, half_len = _polyphase_filter(up, down)
    taps = phases.shape[1]
    # y[m] = sum_k x[k] h[m*down - k*up + half_len]. With t = m*down + half_len the terms are
    # k = t//up - i, tap index (t % up) + i*up, for i in [0, taps). Pad x with zeros on both sides
    # so every gathered index is valid.
    lead = taps
    last_k = ((n_out - 1) * down + half_len) // up
    trail = max(0, last_k - n_in + 1)
    xp = np.concatenate([np.zeros(lead), x.astype(np.float64, copy=False), np.zeros(trail)])
    out = np.empty(n_out, dtype=np.float32)
    i = np.arange(taps, dtype=np.int64)
    for start in range(0, n_out, _RESAMPLE_BLOCK):
        m = np.arange(start, min(start + _RESAMPLE_BLOCK, n_out), dtype=np.int64)
        t = m * down + half_len
        k = (t // up)[:, None] - i[None, :] + lead
        out[start : start + m.size] = np.einsum("ij,ij->i", xp[k], phases[t % up])
    return out


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
