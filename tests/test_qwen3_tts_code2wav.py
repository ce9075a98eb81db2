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
from export_store import ExportStore
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


pytestmark = pytest.mark.usefixtures("one_torch_thread")


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


# -- ONNX export ---------------------------------------------------------------------------------
# ORT (lowered plugin attention, CPU, 2 threads) vs upstream and vs the torch module: measured
# max |diff| 1.7e-6 (T=11, batch 2) and 7.8e-7 (T=1) at peak ~0.49; 1e-5 leaves margin for other
# SIMD paths (Omni's engine test allows 2e-5).
ORT_ATOL = 1e-5
ORT_MODES = ("cv_plain_stream", "vd_stream")  # 11 frames each


@pytest.fixture(scope="module")
def engine(
    qwen_tts_reference: dict, exports: ExportStore, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    """The decoder exported as edge-build exports it (export_code2wav of load_decoder, through
    the family's export_component; the session's parity build of this checkpoint reuses it or
    this reuses the build's: export_store.py), and its ONNX Runtime engine."""
    from edgeomni.builder.onnxruntime import build_engine
    from edgeomni.export.family import BuildArgs
    from edgeomni.runtime.engine import OrtEngine

    ckpt = _tokenizer_dir(qwen_tts_reference, ORT_MODES[0]).parent
    decoder = load_decoder(ckpt / "speech_tokenizer")
    root = tmp_path_factory.mktemp("tts_code2wav")
    raw = exports.component(ckpt, "code2wav", root / "raw", BuildArgs(1, 1, 1))
    assert raw == root / "raw" / "code2wav.onnx"
    build_engine(raw, root / "code2wav.onnx", BuildArgs(1, 1, 1))
    return {"decoder": decoder, "raw": raw, "engine": OrtEngine(root / "code2wav.onnx", threads=2)}


def test_onnx_attention_goes_through_the_plugin_op(engine: dict) -> None:
    import onnx

    raw = onnx.load(str(engine["raw"]), load_external_data=False)
    plugin = [n for n in raw.graph.node if (n.domain, n.op_type) == ("edgeomni", "CachedAttention")]
    layers = len(engine["decoder"].pre_transformer.layers)
    window = engine["decoder"].pre_transformer.config.sliding_window
    assert len(plugin) == layers
    assert all({a.name: a.i for a in n.attribute}["window"] == window for n in plugin)


def test_onnx_engine_matches_upstream_and_torch(qwen_tts_reference: dict, engine: dict) -> None:
    # one checkpoint decodes all modes: the tiny checkpoints share the seeded codec weights
    a, b = (_codes_and_wav(qwen_tts_reference, m) for m in ORT_MODES)
    assert a[0].shape == b[0].shape  # same T: the batch needs no padding
    codes = torch.stack([a[0], b[0]])
    run = engine["engine"].session.run
    out = run(None, {"codes": codes.numpy()})[0]
    assert out.dtype == np.float32 and out.shape == (2, 1, codes.shape[2] * SAMPLES_PER_FRAME)
    out = out[:, 0]
    np.testing.assert_allclose(out[0], a[1], rtol=0, atol=ORT_ATOL)
    np.testing.assert_allclose(out[1], b[1], rtol=0, atol=ORT_ATOL)
    with torch.no_grad():
        ref = engine["decoder"](codes).numpy()
    np.testing.assert_allclose(out, ref, rtol=0, atol=ORT_ATOL)
    one = codes[:, :, :1].numpy()  # T = 1
    with torch.no_grad():
        ref1 = engine["decoder"](torch.from_numpy(one)).numpy()
    out1 = run(None, {"codes": one})[0][:, 0]
    assert out1.shape == (2, SAMPLES_PER_FRAME)
    np.testing.assert_allclose(out1, ref1, rtol=0, atol=ORT_ATOL)


# -- decoder configurations: upstream's defaults, or refused by key (no reference venv) --------


def test_left_out_keys_take_upstreams_defaults() -> None:
    """Qwen3TTSTokenizerV2DecoderConfig's defaults fill what a config leaves out."""
    from edgeomni.export.families.qwen3_tts.code2wav import DEFAULTS, decoder_settings

    dec = decoder_settings({"codebook_dim": 512})
    assert dec == {**DEFAULTS, "codebook_dim": 512}
    assert dec["sliding_window"] == 72 and dec["hidden_act"] == "silu"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"sliding_window": None}, "decoder_config.sliding_window None: upstream's decoder needs"),
        ({"codebook_dim": None}, "decoder_config.codebook_dim is missing"),
        ({"num_quantizers": 1}, "decoder_config.num_quantizers 1: the split RVQ needs more"),
        ({"rope_scaling": {"rope_type": "yarn"}}, "decoder_config.rope_scaling {'rope_type': 'yarn'}"),
        ({"hidden_act": "nope"}, "decoder_config.hidden_act 'nope' is no activation"),
        ({"hidden_size": "wide"}, "decoder_config.hidden_size 'wide' is not a positive int"),
        ({"upsample_rates": 5}, "decoder_config.upsample_rates 5 is not a list of positive ints"),
    ],
)  # fmt: skip
def test_configs_it_cannot_decode_are_refused_by_key(change: dict, named: str) -> None:
    from edgeomni.export import tiny_tts
    from edgeomni.export.families.qwen3_tts.code2wav import code2wav_engine_config

    codec = tiny_tts.codec_config("tiny")
    codec["decoder_config"].update(change)
    with pytest.raises(CheckpointError, match="^speech_tokenizer/config.json: decoder_config") as e:
        code2wav_engine_config(codec)
    assert named in str(e.value)
