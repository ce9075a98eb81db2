"""The speaker encoder's input: qwen-tts 0.1.1's ``mel_spectrogram`` as
``extract_speaker_embedding`` calls it (24 kHz, n_fft 1024, hop 256, 128 mels over 0..12 kHz),
on runtime/audio.py's mel front end.

Upstream's steps: reflect-pad ``(n_fft - hop) // 2`` samples each side, ``torch.stft`` with
``center=False`` and a periodic Hann window, magnitude ``sqrt(re^2 + im^2 + 1e-9)``, librosa's
mel filterbank (slaney scale and norm, float32), then ``log(clamp(x, min=1e-5))``.
"""

from __future__ import annotations

import numpy as np

from edgeomni.runtime.audio import mel_filter_bank, mel_spectrogram

MAGNITUDE_EPSILON = 1e-9  # added to re^2 + im^2 before the square root
LOG_FLOOR = 1e-5  # dynamic_range_compression_torch's clip_val


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
    The STFT runs in float64 here (upstream: float32), so values agree to float32 rounding.
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
    filters = mel_filter_bank(num_mels, sample_rate, n_fft, float(fmax), float(fmin), np.float32)
    return mel_spectrogram(w, filters, n_fft=n_fft, hop_length=hop_size, pad=pad,
                           win_length=win_size, power=1.0, eps=MAGNITUDE_EPSILON,
                           floor=LOG_FLOOR, log=np.log)  # fmt: skip
