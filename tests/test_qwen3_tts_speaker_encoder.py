"""Qwen3-TTS Base's speaker encoder (export/families/qwen3_tts/speaker_encoder.py) and its mel
front end (runtime/families/qwen3_tts/speaker_mel.py) == upstream qwen-tts 0.1.1.

The reference fixture (tests/conftest.py) gives the Base checkpoint, ref.wav and the x-vector
that upstream's ``create_voice_clone_prompt`` made of it. The mels and the x-vectors of shorter
cuts of ref.wav come from upstream too: ``_UPSTREAM`` runs in the reference venv, imports
upstream's ``mel_spectrogram`` and ``Qwen3TTSSpeakerEncoder`` (and librosa's filterbank) and
saves what they give. The cuts cover three frame counts (75, 19 and 5, the fewest the encoder's
reflect pads allow) and the shortest waveform the STFT takes (385 samples, one frame).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import torch
from export_store import ExportStore
from safetensors.torch import load_file, save_file

from edgeomni.export.common.checkpoint import CheckpointError
from edgeomni.export.families.qwen3_tts.speaker_encoder import (
    ENGINE,
    engine_config,
    load_speaker_encoder,
    min_frames,
)
from edgeomni.runtime.audio import mel_filter_bank
from edgeomni.runtime.families.qwen3_tts.speaker_mel import speaker_mel

MODE = "base_xvec_stream"
# cuts of ref.wav (19200 samples): 75, 19, 5 and 1 mel frames
CUTS = {"full": None, "short": 5000, "min": 1280, "one": 385}
EMBEDDED = ("full", "short", "min")  # the cuts upstream's encoder runs on (it needs 5 frames)
MEL_ARGS = dict(n_fft=1024, num_mels=128, hop_size=256, win_size=1024, fmin=0, fmax=12000)

# numpy (float64 STFT) vs upstream's float32 torch.stft: measured max |diff| 1.9e-5 on log-mels
# spanning [-6.6, 6.6] (99th percentile 4.3e-6), at every cut; the worst bins are the quiet
# ones, where float32 FFT rounding is largest relative to the bin. The filterbank is
# bit-identical to librosa's.
MEL_ATOL = 1e-4
# the torch port on upstream's mel vs upstream's x-vector: measured bit-identical (0.0, peak
# ~3.1) at 75, 19 and 5 frames, fp32 CPU, 1 thread; the margin covers other thread counts and
# SIMD paths reordering float32 sums.
TORCH_ATOL = 1e-5
# the built ORT engine (CPU, 2 threads) vs upstream's x-vector, end to end from the waveform
# (numpy mel): measured max |diff| 4.8e-7 / 6.0e-7 / 1.1e-6 at 75 / 19 / 5 frames (on
# upstream's own mel: 7.2e-7), peak ~3.1; batch of two vs each alone: 7.2e-7.
ORT_ATOL = 1e-5

_UPSTREAM = r"""
import json, sys
from pathlib import Path
import numpy as np, soundfile as sf, torch
from librosa.filters import mel as librosa_mel_fn
from safetensors.torch import load_file
from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSSpeakerEncoder, mel_spectrogram

torch.set_num_threads(1)
wav_path, ckpt, out, cuts, embedded, args = sys.argv[1:]
cuts, embedded, args = json.loads(cuts), json.loads(embedded), json.loads(args)
cfg = json.loads((Path(ckpt) / "config.json").read_text())["speaker_encoder_config"]
encoder = Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(**cfg)).eval()
tensors = load_file(str(Path(ckpt) / "model.safetensors"))
prefix = "speaker_encoder."
encoder.load_state_dict({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
wav, sr = sf.read(wav_path, dtype="float32")
saved = {"fb": librosa_mel_fn(sr=sr, n_fft=args["n_fft"], n_mels=args["num_mels"],
                              fmin=args["fmin"], fmax=args["fmax"])}
with torch.inference_mode():
    for name, n in cuts.items():
        w = torch.from_numpy(wav if n is None else wav[:n])
        mel = mel_spectrogram(w[None], sampling_rate=sr, **args).transpose(1, 2)
        saved["mel_" + name] = mel[0].numpy()
        if name in embedded:
            saved["emb_" + name] = encoder(mel)[0].numpy()
np.savez(out, **saved)
"""


def _start_upstream(python: str, tmp: Path, wav: str, checkpoint: str) -> subprocess.Popen:
    """Start ``_UPSTREAM`` with the reference venv's python, environment as harness.run_reference
    sets it (no PYTHONPATH / PYTHONHOME / VIRTUAL_ENV, one thread, no hub)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    script = tmp / "upstream_speaker.py"
    script.write_text(_UPSTREAM)
    cmd = [python, str(script), wav, checkpoint, str(tmp / "upstream_speaker.npz")]
    cmd += [json.dumps(CUTS), json.dumps(EMBEDDED), json.dumps(MEL_ARGS)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _build_engine(checkpoint: Path, root: Path, exports: ExportStore) -> Any:
    """Export (export_speaker_encoder of load_speaker_encoder, through the family's
    export_component and the session's store: export_store.py) and build the engine as
    edge-build would; the ORT session of the result."""
    from edgeomni.builder.onnxruntime import build_engine
    from edgeomni.export.family import BuildArgs
    from edgeomni.runtime.engine import OrtEngine

    raw = exports.component(checkpoint, "speaker_encoder", root / "raw", BuildArgs(1, 1, 1))
    assert raw == root / "raw" / ENGINE
    build_engine(raw, root / ENGINE, BuildArgs(1, 1, 1))
    return OrtEngine(root / ENGINE, threads=2).session


@pytest.fixture(scope="module")
def _reference(
    qwen_tts_reference: dict, exports: ExportStore, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    """Upstream's numbers and the built engine, made once: the export runs while the reference
    venv imports qwen_tts (some 5 s) and computes."""
    m = qwen_tts_reference
    ckpt = Path(m["modes"][MODE]["checkpoint"])
    tmp = tmp_path_factory.mktemp("tts_speaker")
    proc = _start_upstream(m["python"], tmp, m["ref_wav"], str(ckpt))
    try:
        session = _build_engine(ckpt, tmp, exports)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        pytest.fail(f"upstream speaker script failed:\n{err[-4000:]}", pytrace=False)
    with np.load(tmp / "upstream_speaker.npz") as z:
        out: dict[str, Any] = dict(z)
    with np.load(m["modes"][MODE]["npz"]) as z:
        out["spk_embedding"] = z["spk_embedding"]
    out["checkpoint"] = ckpt
    out["wav"] = sf.read(m["ref_wav"], dtype="float32")[0]
    return {"upstream": out, "engine": session}


@pytest.fixture
def upstream(_reference: dict) -> dict:
    """Upstream's mels (``mel_<cut>``), x-vectors (``emb_<cut>``), librosa's filterbank
    (``fb``), the npz ``spk_embedding``, the checkpoint dir and ref.wav."""
    return _reference["upstream"]


@pytest.fixture
def engine(_reference: dict) -> Any:
    return _reference["engine"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cut(wav: np.ndarray, name: str) -> np.ndarray:
    n = CUTS[name]
    return wav if n is None else wav[:n]


def test_script_reproduces_upstream_xvector(upstream: dict) -> None:
    # the script's encoder on the full wav is extract_speaker_embedding's computation
    spk = upstream["spk_embedding"]
    assert spk.dtype == np.float32 and spk.shape == (32,)
    np.testing.assert_array_equal(upstream["emb_full"], spk)


def test_mel_matches_upstream(upstream: dict) -> None:
    fb = mel_filter_bank(128, 24000, 1024, f_max=12000.0, dtype=np.float32).T
    np.testing.assert_array_equal(fb, upstream["fb"])  # librosa's, to the bit
    frames = {"full": 75, "short": 19, "min": 5, "one": 1}
    for name in CUTS:
        mel = speaker_mel(_cut(upstream["wav"], name))
        assert mel.dtype == np.float32 and mel.shape == (frames[name], 128)
        np.testing.assert_allclose(mel, upstream["mel_" + name], rtol=0, atol=MEL_ATOL)


def test_mel_refuses_short_or_shaped_audio(upstream: dict) -> None:
    with pytest.raises(ValueError, match="384 samples is too short.*at least 385"):
        speaker_mel(upstream["wav"][:384])
    with pytest.raises(ValueError, match="1-D"):
        speaker_mel(upstream["wav"][None])


def test_torch_port_matches_upstream(upstream: dict) -> None:
    model = load_speaker_encoder(upstream["checkpoint"])
    assert not model.training and model.min_frames == 5
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for name in EMBEDDED:
        with torch.no_grad():
            out = model(torch.from_numpy(upstream["mel_" + name])[None])
        assert out.shape == (1, 32) and out.dtype == torch.float32
        want = upstream["spk_embedding"] if name == "full" else upstream["emb_" + name]
        np.testing.assert_allclose(out[0].numpy(), want, rtol=0, atol=TORCH_ATOL)


def test_engine_config(upstream: dict) -> None:
    cfg = json.loads((upstream["checkpoint"] / "config.json").read_text())
    spk = cfg["speaker_encoder_config"]
    assert min_frames(spk) == 5
    assert engine_config(spk) == {
        "sample_rate": 24000,
        **MEL_ARGS,
        "embedding_size": 32,
        "min_frames": 5,
    }


def _edited_copy(src: Path, dst: Path, drop: str | None = None, reshape: str | None = None) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("speech_tokenizer"))
    tensors = load_file(str(dst / "model.safetensors"))
    if drop is not None:
        del tensors[drop]
    if reshape is not None:
        tensors[reshape] = torch.zeros(tensors[reshape].shape[0] + 1, *tensors[reshape].shape[1:])
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_strict_load(upstream: dict, tmp_path: Path) -> None:
    src = upstream["checkpoint"]
    names = {n for n in load_file(str(src / "model.safetensors")) if n.startswith("speaker_enc")}
    params = {"speaker_encoder." + n for n in load_speaker_encoder(src).state_dict()}
    assert names == params  # every tensor used, every parameter filled

    key = "speaker_encoder.blocks.2.res2net_block.blocks.1.conv.weight"
    with pytest.raises(CheckpointError, match=rf"missing \['{key}'\], unexpected \[\]"):
        load_speaker_encoder(_edited_copy(src, tmp_path / "missing", drop=key))
    key = "speaker_encoder.asp.conv.bias"
    with pytest.raises(CheckpointError, match=rf"{key} has shape \(49,\), expected \(48,\)"):
        load_speaker_encoder(_edited_copy(src, tmp_path / "shape", reshape=key))


# -- ONNX export ---------------------------------------------------------------------------------


def test_onnx_io(engine: Any) -> None:
    (mels,), (emb,) = engine.get_inputs(), engine.get_outputs()
    assert (mels.name, mels.type, mels.shape) == ("mels", "tensor(float)", ["batch", "frames", 128])
    assert (emb.name, emb.type, emb.shape) == ("speaker_embedding", "tensor(float)", ["batch", 32])


def test_onnx_engine_matches_upstream_from_the_waveform(upstream: dict, engine: Any) -> None:
    # end to end, as a runtime does it: numpy mel of the waveform -> engine; at 75, 19, 5 frames
    for name in EMBEDDED:
        mel = speaker_mel(_cut(upstream["wav"], name))
        out = engine.run(None, {"mels": mel[None]})[0]
        assert out.dtype == np.float32 and out.shape == (1, 32)
        want = upstream["spk_embedding"] if name == "full" else upstream["emb_" + name]
        np.testing.assert_allclose(out[0], want, rtol=0, atol=ORT_ATOL)
    on_upstream_mel = engine.run(None, {"mels": upstream["mel_full"][None]})[0]
    np.testing.assert_allclose(on_upstream_mel[0], upstream["spk_embedding"], rtol=0, atol=ORT_ATOL)


def test_onnx_batch_rows_equal_each_alone(upstream: dict, engine: Any) -> None:
    wav = upstream["wav"]
    for n in (None, CUTS["short"]):
        a = speaker_mel(wav if n is None else wav[:n])
        b = speaker_mel((wav[::-1] if n is None else wav[-n:]).copy())  # another voice, same length
        both = engine.run(None, {"mels": np.stack([a, b])})[0]
        alone = [engine.run(None, {"mels": x[None]})[0][0] for x in (a, b)]
        np.testing.assert_allclose(both, np.stack(alone), rtol=0, atol=ORT_ATOL)
        assert np.abs(alone[0] - alone[1]).max() > 100 * ORT_ATOL  # the rows do differ


# -- configurations upstream's class builds but its forward cannot run: refused by key ---------


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"enc_dilations": [1, 2, 1]}, "enc_channels, enc_kernel_sizes, enc_dilations must be lists"),
        ({"enc_channels": [16, 16, 48], "enc_kernel_sizes": [5, 3, 1], "enc_dilations": [1, 2, 1]},
         "enc_channels [16, 16, 48]: the last must be the sum"),
        ({"enc_channels": [16, 32, 32, 32, 96]}, "all but the last equal"),
        ({"enc_channels": [16, 16], "enc_kernel_sizes": [5, 1], "enc_dilations": [1, 1]},
         "needs at least 3 entries"),
        ({"enc_res2net_scale": 3}, "enc_res2net_scale 3 must be at least 2 and divide"),
        ({"mel_dim": 80}, "mel_dim 80: upstream's extract_speaker_embedding makes its mels with 128"),
        ({"sample_rate": 16000}, "sample_rate 16000: upstream's extract_speaker_embedding"),
    ],
)  # fmt: skip
def test_configs_it_cannot_run_are_refused_by_key(change: dict, named: str) -> None:
    from edgeomni.export import tiny_tts
    from edgeomni.export.families.qwen3_tts.speaker_encoder import check_config

    cfg = {**tiny_tts.SIZES["tiny"]["speaker"], **change}
    with pytest.raises(CheckpointError, match="^config.json: speaker_encoder_config.") as e:
        check_config(cfg)
    assert named in str(e.value)
    assert check_config(tiny_tts.SIZES["tiny"]["speaker"])["mel_dim"] == 128  # the tiny one runs
