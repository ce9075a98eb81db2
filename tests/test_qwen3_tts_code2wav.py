"""Qwen3-TTS code2wav (export/families/qwen3_tts/code2wav.py) == upstream qwen-tts 0.1.1's decode.

The reference fixture (tests/conftest.py) runs upstream on tiny seeded checkpoints whose codec
decoder has every width distinct (codebooks 16, latent 32, transformer 24, decoder 48), so a port
that swaps two widths cannot load, and one that gets the RVQ sum, the transposed-conv trim or the
stage order wrong cannot match. ICL modes are left out: their npz waveform has the reference
audio's frames cut off the front, so it is not the decode of ``codes`` alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from edgeomni.export.common.checkpoint import CheckpointError
from edgeomni.export.families.qwen3_tts.code2wav import load_decoder

MODES = ("cv_plain_stream", "cv_dialect_nonstream", "base_xvec_nonstream", "vd_stream")
SAMPLES_PER_FRAME = 1920
# Measured: bit-identical (max |diff| 0.0, peak ~0.5) on the dev machine, fp32 CPU, 1 thread;
# the margin covers other thread counts and SIMD paths reordering float32 sums.
ATOL = 1e-5


def _codes_and_wav(manifest: dict, mode: str) -> tuple[torch.Tensor, np.ndarray]:
    with np.load(manifest["modes"][mode]["npz"]) as z:
        codes, wav = z["codes"], z["wav"]
    return torch.from_numpy(codes).T.contiguous(), wav  # [16, T]: the decoder's layout


def _tokenizer_dir(manifest: dict, mode: str) -> Path:
    return Path(manifest["modes"][mode]["checkpoint"]) / "speech_tokenizer"


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("mode", MODES)
def test_decode_matches_upstream(qwen_tts_reference: dict, mode: str) -> None:
    codes, wav = _codes_and_wav(qwen_tts_reference, mode)
    model = load_decoder(_tokenizer_dir(qwen_tts_reference, mode))
    assert not model.training
    with torch.no_grad():
        out = model(codes[None])
    assert out.dtype == torch.float32
    assert out.shape == (1, codes.shape[1] * SAMPLES_PER_FRAME) == (1, wav.shape[0])
    np.testing.assert_allclose(out[0].numpy(), wav, rtol=0, atol=ATOL)


def test_batch_rows_decode_independently(qwen_tts_reference: dict) -> None:
    a, wav_a = _codes_and_wav(qwen_tts_reference, "cv_plain_stream")
    b, wav_b = _codes_and_wav(qwen_tts_reference, "vd_stream")
    model = load_decoder(_tokenizer_dir(qwen_tts_reference, "cv_plain_stream"))
    with torch.no_grad():
        out = model(torch.stack([a, b])).numpy()
    np.testing.assert_allclose(out[0], wav_a, rtol=0, atol=ATOL)
    np.testing.assert_allclose(out[1], wav_b, rtol=0, atol=ATOL)


def test_wrong_codebook_count_is_refused(qwen_tts_reference: dict) -> None:
    codes, _ = _codes_and_wav(qwen_tts_reference, "cv_plain_stream")
    model = load_decoder(_tokenizer_dir(qwen_tts_reference, "cv_plain_stream"))
    with pytest.raises(ValueError, match="expected 16 codebooks, got 15"):
        model(codes[None, :15])


def _edited_copy(src: Path, dst: Path, drop: str | None = None, add: str | None = None) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    if drop is not None:
        del tensors[drop]
    if add is not None:
        tensors[add] = torch.zeros(3)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_strict_load(qwen_tts_reference: dict, tmp_path: Path) -> None:
    src = _tokenizer_dir(qwen_tts_reference, "cv_plain_stream")
    # every decoder.* tensor is a parameter, but for the encoder-side quantizer input_proj
    names = {n for n in load_file(str(src / "model.safetensors")) if n.startswith("decoder.")}
    params = {"decoder." + n for n in load_decoder(src).state_dict()}
    assert names - params == {
        "decoder.quantizer.rvq_first.input_proj.weight",
        "decoder.quantizer.rvq_rest.input_proj.weight",
    }
    assert params <= names

    key = "decoder.quantizer.rvq_rest.vq.layers.3._codebook.embedding_sum"
    with pytest.raises(CheckpointError, match=rf"missing \['{key}'\], unexpected \[\]"):
        load_decoder(_edited_copy(src, tmp_path / "missing", drop=key))
    extra = "decoder.upsample.0.0.extra"
    with pytest.raises(CheckpointError, match=rf"missing \[\], unexpected \['{extra}'\]"):
        load_decoder(_edited_copy(src, tmp_path / "extra", add=extra))
