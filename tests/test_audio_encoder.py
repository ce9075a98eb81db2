"""Qwen3-Omni audio encoder: ONNX engine + numpy precompute == transformers' audio tower.

One tiny random encoder (d_model 32, 2 layers, 4 heads, output_dim 64, 128 mel bins,
n_window 50, n_window_infer 800: 100-frame chunks of 13 tokens, windows of 8 chunks) is exported
and built once per session.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from edgeomni.export.common import artifacts
from edgeomni.export.media import audio_encoder as audio_export
from edgeomni.runtime.media.audio_encoder import AudioEncoder, window_layout
from edgeomni.runtime.media.audio_input import audio_token_count

MELS, OUT_DIM = 128, 64
# Mel lengths: one short chunk, one full chunk, a ragged tail, several windows (8 chunks each).
FRAMES = [57, 100, 345, 1730, 3000]
PARITY_RTOL = 2e-6  # of max|out|; ORT vs HF eager, both float32


def tiny_model() -> Any:
    """Random weights at std 1/sqrt(fan_in), biases N(0, 0.1), norm gains N(1, 0.1): under HF
    init (std 0.02) the output barely depends on the input and a wrong mask would hide."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeAudioEncoderConfig,
    )
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeAudioEncoder,
    )

    cfg = Qwen3OmniMoeAudioEncoderConfig(
        d_model=32,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=64,
        output_dim=OUT_DIM,
        num_mel_bins=MELS,
        n_window=50,
        n_window_infer=800,
        downsample_hidden_size=8,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3OmniMoeAudioEncoder(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, 1 / math.sqrt(p[0].numel()))
            elif name.endswith("weight"):  # layer norm gains
                p.normal_(1, 0.1)
            else:
                p.normal_(0, 0.1)
    return model


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from edgeomni.builder.onnxruntime import build_engine
    from edgeomni.export.family import BuildArgs

    model = tiny_model()
    root = tmp_path_factory.mktemp("audio_encoder")
    # the export path: HF's tensors by checkpoint name, loaded into a fresh module
    state = {audio_export.PREFIX + k: v for k, v in model.state_dict().items()}
    loaded = audio_export.load_audio_tower(state.__getitem__, model.config.to_dict())
    raw = audio_export.export_audio_encoder(loaded, root / "raw" / audio_export.ENGINE)
    folder = root / "audio_encoder"
    folder.mkdir()
    build_engine(raw, folder / audio_export.ENGINE, BuildArgs(1, 1, 1))
    artifacts.write_engine_config(folder, audio_export.audio_engine_config(model.config))
    return {"model": model, "folder": folder, "encoder": AudioEncoder(folder, threads=2)}


def mel(frames: int, seed: int = 0) -> np.ndarray:
    """Log-mel-like features (Whisper's scaled log-mel lies roughly in [-1, 2])."""
    rng = np.random.default_rng(seed + frames)
    return (rng.standard_normal((MELS, frames)) * 0.6 + 0.3).astype(np.float32)


def hf_encode(model: Any, features: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_features=torch.from_numpy(features),
            feature_lens=torch.tensor([features.shape[1]]),
        ).last_hidden_state
    return out.numpy()


@pytest.mark.parametrize("frames", FRAMES)
def test_encode_matches_transformers(built: dict[str, Any], frames: int) -> None:
    features = mel(frames)
    want = hf_encode(built["model"], features)
    got = built["encoder"].encode(features)
    assert got.shape == want.shape == (audio_token_count(frames), OUT_DIM)
    diff = float(np.abs(got - want).max())
    assert diff <= PARITY_RTOL * float(np.abs(want).max()), diff


def test_pieces_equal_one_call(built: dict[str, Any]) -> None:
    """One window per call (8 chunks) gives the one-call result: windows share no tokens."""
    features = mel(3000, seed=1)
    whole = built["encoder"].encode(features)
    pieces = AudioEncoder(built["folder"], threads=2, chunks_per_call=8).encode(features)
    np.testing.assert_allclose(pieces, whole, rtol=0, atol=1e-6 * np.abs(whole).max())


def test_clips_of_several_requests_in_shared_calls_equal_each_alone(built: dict[str, Any]) -> None:
    """encode_many (requests prepared together): clips padded to the same chunk length share
    calls, a short clip (its own padding) and one longer than a call go apart, and each clip's
    rows equal ``encode`` of it alone; the shared calls are fewer than one per clip."""
    encoder = AudioEncoder(built["folder"], threads=2, chunks_per_call=16)
    clips = [mel(n, seed=i) for i, n in enumerate((57, 250, 801, 100, 1730, 57, 320))]
    calls = []
    run = encoder._call
    encoder._call = lambda *a: (calls.append(a[0].shape[0]), run(*a))[1]
    together = encoder.encode_many(clips)
    assert len(calls) < len(clips) and max(calls) <= 16
    encoder._call = run
    for clip, rows in zip(clips, together, strict=True):
        alone = encoder.encode(clip)
        np.testing.assert_allclose(rows, alone, rtol=0, atol=1e-5 * np.abs(alone).max())


def test_token_count_rule(built: dict[str, Any]) -> None:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        _get_feat_extract_output_lengths,
    )

    frames = np.arange(1, 2500)
    hf_counts = _get_feat_extract_output_lengths(torch.from_numpy(frames)).numpy()
    ours = [built["encoder"].token_count(int(n)) for n in frames]
    np.testing.assert_array_equal(ours, hf_counts)
    np.testing.assert_array_equal([audio_token_count(int(n)) for n in frames], hf_counts)
    assert built["encoder"].encode(mel(1)).shape == (1, OUT_DIM)


@pytest.mark.parametrize("frames", [1, 57, 100, 801, 1730, 3000])
def test_window_layout_is_hf_varlen_layout(frames: int) -> None:
    """Our index arrays select the tokens HF's valid_indices / cu_seqlens select."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf

    lens = torch.tensor([frames])
    _, chunk_lens = hf.chunk_and_pad_features(torch.zeros(MELS, frames), lens, 50)
    valid = hf.get_valid_indices(chunk_lens, 50).numpy()
    cu = hf.get_audio_cu_seqlens(chunk_lens, lens, 800, 50).numpy()
    window_index, window_lens, output_index = window_layout(
        chunk_lens.numpy(), int(chunk_lens.max()), 800 // 100
    )
    np.testing.assert_array_equal(np.concatenate([[0], np.cumsum(window_lens)]), cu)
    np.testing.assert_array_equal(window_index.reshape(-1)[output_index], valid)
    rows, cols = np.divmod(output_index, window_index.shape[1])
    assert np.all(cols < window_lens[rows])  # outputs come from the valid part of each row


def test_engine_config(built: dict[str, Any]) -> None:
    cfg = built["encoder"].config
    assert cfg["format"] == artifacts.FORMAT and cfg["component"] == "audio_encoder"
    assert (cfg["chunk_frames"], cfg["chunks_per_window"], cfg["output_dim"]) == (100, 8, OUT_DIM)
    assert cfg["chunks_per_call"] % cfg["chunks_per_window"] == 0
    assert Path(built["folder"], cfg["engine"]).is_file()
