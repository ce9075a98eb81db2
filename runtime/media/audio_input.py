"""The Qwen3 families' audio input: the features their processors give the audio encoder for
one clip, and the number of ``<|audio_pad|>`` placeholders the text gets for it.

What ``Qwen3OmniMoeProcessor`` (transformers 5.24) does with audio: it calls its
``WhisperFeatureExtractor(feature_size=128)`` with ``sampling_rate=16000, padding=True,
truncation=False, return_attention_mask=True``. ``padding=True`` is the "longest" strategy, so
ONE audio is never padded (not to 30 s, not to anything) and ``truncation=False`` never cuts it.
For ``L`` samples the STFT gives ``1 + L // 160`` centred frames and the last one is dropped, so
``input_features`` is ``[1, 128, L // 160]`` and ``feature_attention_mask`` is ``L // 160``
ones. The log-mel itself is the generic Whisper-style one (runtime/audio.py, ``log_mel``).

``Qwen3ASRProcessor``'s ``Qwen3ASRFeatureExtractor`` computes the same log-mel (the same
filters, floor and scaling, through torch's STFT) with the same ``padding=True``, after
zero-padding a clip shorter than its ``min_length`` samples (8000) to that length, which then
counts as audio (its mask covers it); it also pads the mel to whole ``2 * n_window`` chunks with
zero frames, which the audio encoder does here (its config's ``chunk_padding``: "full").
"""

from __future__ import annotations

import numpy as np

from edgeomni.runtime.audio import log_mel
from edgeomni.runtime.media.mrope import audio_output_length

__all__ = [
    "HOP_LENGTH",
    "N_FFT",
    "N_MELS",
    "N_WINDOW",
    "SAMPLING_RATE",
    "audio_features",
    "audio_token_count",
]

# Qwen3-Omni's preprocessor_config: WhisperFeatureExtractor with 128 mel bins at 16 kHz.
SAMPLING_RATE = 16000
N_MELS = 128
N_FFT = 400
HOP_LENGTH = 160
# Qwen3OmniMoeProcessor.n_window: the audio encoder's window (2 * n_window frames per chunk).
N_WINDOW = 50


def audio_features(x16k: np.ndarray, *, min_samples: int = 0) -> tuple[np.ndarray, int]:
    """What ``Qwen3OmniMoeProcessor`` (or, with ``min_samples``, ``Qwen3ASRProcessor``) gives
    the audio encoder for ONE 16 kHz clip.

    Returns ``(input_features [128, n_frames] float32, n_frames)`` with
    ``n_frames = len(x16k) // 160`` = ``feature_attention_mask.sum()``. The processor pads with
    ``padding=True`` (longest in the batch: a single clip is not padded, in particular not to
    30 s) and ``truncation=False``, so the features cover exactly the clip. A clip shorter than
    ``min_samples`` is zero-padded to it first (Qwen3-ASR's ``min_length``). Resample to 16 kHz
    first (runtime/audio.py, ``resample``); the extractor would reject any other rate.
    """
    x16k = np.asarray(x16k)
    if x16k.ndim == 1 and x16k.shape[0] < min_samples:
        x16k = np.pad(x16k, (0, min_samples - x16k.shape[0]))
    feats = log_mel(
        x16k, n_mels=N_MELS, sampling_rate=SAMPLING_RATE, n_fft=N_FFT, hop_length=HOP_LENGTH
    )
    return feats, int(feats.shape[1])


def audio_token_count(n_frames: int, n_window: int = N_WINDOW) -> int:
    """Audio placeholder tokens for ``n_frames`` mel frames (the processor's feat-extract
    lengths, transformers' ``_get_feat_extract_output_lengths``): the prompt must carry exactly
    this many ``<|audio_pad|>`` tokens for the clip. One rule with the rope index's
    (``mrope.audio_output_length``)."""
    return audio_output_length(n_frames, n_window)
