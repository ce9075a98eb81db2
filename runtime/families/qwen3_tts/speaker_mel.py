"""The speaker encoder's input, in numpy: qwen-tts 0.1.1's ``mel_spectrogram`` as
``extract_speaker_embedding`` calls it (24 kHz, n_fft 1024, hop 256, 128 mels over 0..12 kHz).

Upstream's steps, each kept: reflect-pad ``(n_fft - hop) // 2`` samples each side, ``torch.stft``
with ``center=False`` and a periodic Hann window, magnitude ``sqrt(re^2 + im^2 + 1e-9)``,
librosa's mel filterbank (``librosa.filters.mel`` defaults: slaney scale, slaney norm, float32),
then ``log(clamp(x, min=1e-5))``. The filterbank is built here: runtime/audio.py's
``mel_filter_bank`` is the same construction but fixed to Whisper's 0..8 kHz band.
"""

from __future__ import annotations

import functools

import numpy as np

MAGNITUDE_EPSILON = 1e-9  # added to re^2 + im^2 before the square root
LOG_FLOOR = 1e-5  # dynamic_range_compression_torch's clip_val
# Frames per STFT block: bounds the float64 frame matrix (~8 MB) for arbitrarily long audio.
_BLOCK_FRAMES = 1024


# librosa's slaney mel scale (htk=False): linear below 1 kHz, logarithmic above
_F_SP = 200.0 / 3
_MIN_LOG_MEL = 1000.0 / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def _hz_to_mel(freq: np.ndarray) -> np.ndarray:
    """librosa's hz_to_mel (htk=False)."""
    freq = np.asarray(freq, dtype=np.float64)
    log_mels = _MIN_LOG_MEL + np.log(np.maximum(freq, 1e-300) / 1000.0) / _LOGSTEP
    return np.where(freq >= 1000.0, log_mels, freq / _F_SP)


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    """librosa's mel_to_hz (htk=False), the inverse of :func:`_hz_to_mel`."""
    mels = np.asarray(mels, dtype=np.float64)
    return np.where(
        mels >= _MIN_LOG_MEL, 1000.0 * np.exp(_LOGSTEP * (mels - _MIN_LOG_MEL)), _F_SP * mels
    )


@functools.lru_cache(maxsize=8)
def mel_filters(
    sample_rate: int, n_fft: int, num_mels: int, fmin: float, fmax: float
) -> np.ndarray:
    """``librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax)`` (htk=False, norm="slaney"):
    float32 ``[num_mels, n_fft // 2 + 1]``, computed in float64 and rounded as librosa does.
    Cached read-only."""
    fft_freqs = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), num_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    # librosa stores the triangles in its float32 array, then scales that array in place: two
    # roundings to float32, kept so the filters are librosa's to the bit
    weights = np.maximum(0.0, np.minimum(lower, upper)).astype(np.float32)
    enorm = 2.0 / (mel_f[2 : num_mels + 2] - mel_f[:num_mels])
    out = (weights * enorm[:, None]).astype(np.float32)
    out.flags.writeable = False
    return out


@functools.lru_cache(maxsize=8)
def _hann_periodic(win_size: int) -> np.ndarray:
    """``torch.hann_window(win_size)`` (periodic), float64."""
    w = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(win_size) / win_size)
    w.flags.writeable = False
    return w


def speaker_mel(
    wav: np.ndarray,
    *,
    sample_rate: int = 24000,
    n_fft: int = 1024,
    num_mels: int = 128,
    hop_size: int = 256,
    win_size: int = 1024,
    fmin: float = 0.0,
    fmax: float = 12000.0,
) -> np.ndarray:
    """Log-mel ``[frames, num_mels]`` float32 of a mono waveform at ``sample_rate`` (the speaker
    encoder's ``mels`` input, one row), ``frames = 1 + (len(wav) + 2 * pad - n_fft) // hop_size``
    with ``pad = (n_fft - hop_size) // 2``.

    Raises ``ValueError`` for a waveform that is not 1-D, or too short: upstream's reflect pad
    needs more than ``pad`` samples and its STFT one full ``n_fft`` window after padding.
    The waveform is taken as float32 (as upstream's ``torch.from_numpy``); the STFT runs in
    float64 here (upstream: float32), so values agree to float32 rounding, not bit for bit.
    """
    w = np.asarray(wav)
    if w.ndim != 1:
        raise ValueError(f"speaker_mel takes a 1-D waveform, got shape {w.shape}")
    if win_size > n_fft:
        raise ValueError(f"win_size {win_size} is larger than n_fft {n_fft}")
    pad = (n_fft - hop_size) // 2
    need = max(pad + 1, n_fft - 2 * pad)
    if w.shape[0] < need:
        raise ValueError(
            f"audio of {w.shape[0]} samples is too short for the speaker encoder's STFT: it "
            f"needs at least {need} (reflect pad of {pad} each side, then one {n_fft}-sample "
            f"window)"
        )
    w = w.astype(np.float32, copy=False).astype(np.float64)
    padded = np.pad(w, (pad, pad), mode="reflect")
    frames = 1 + (padded.shape[0] - n_fft) // hop_size
    # torch.stft centres a shorter window inside the n_fft frame
    window = np.zeros(n_fft)
    left = (n_fft - win_size) // 2
    window[left : left + win_size] = _hann_periodic(win_size)
    fb = mel_filters(sample_rate, n_fft, num_mels, float(fmin), float(fmax)).astype(np.float64)
    out = np.empty((frames, num_mels), dtype=np.float32)
    for start in range(0, frames, _BLOCK_FRAMES):
        count = min(_BLOCK_FRAMES, frames - start)
        index = np.arange(n_fft)[None, :] + hop_size * np.arange(start, start + count)[:, None]
        spec = np.fft.rfft(padded[index] * window, axis=-1)  # [count, n_fft // 2 + 1]
        magnitude = np.sqrt(spec.real**2 + spec.imag**2 + MAGNITUDE_EPSILON)
        out[start : start + count] = np.log(np.maximum(magnitude @ fb.T, LOG_FLOOR))
    return out
