"""Qwen3-TTS speech-tokenizer encoder (export/families/qwen3_tts/speech_encoder.py) == upstream's.

Upstream is qwen-tts 0.1.1 on transformers 4.57.3 in the reference venv (tests/conftest.py):
``ref_codes`` of a Base ICL run (the reference wav, 10 whole frames), and, run here through
``Qwen3TTSTokenizer.encode`` on the fixture's tiny seeded codec, a length of 7 frames plus a
partial one and one past the encoder transformer's 250-step sliding window (upstream's
attention ignores the window there; transformers 5's Mimi applies it). Codes are argmin
decisions, so equality is exact: no tolerance. Measured on the dev machine (fp32 CPU): torch
and ORT (2 threads) give upstream's codes everywhere here; the closest decision (the long input)
has its runner-up only 1.7e-6 (relative) farther than the pick, others >= 1e-4, so a different
SIMD path could flip that one code; a failure there would be a 1-code near-tie, not a bug.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from export_store import ExportStore
from safetensors.torch import load_file, save_file

from edgeomni.export import tiny_tts
from edgeomni.export.common.checkpoint import CheckpointError
from edgeomni.export.families.qwen3_tts.speech_encoder import (
    UNUSED_SUFFIXES,
    engine_config,
    load_speech_encoder,
)

MODE = "base_icl_stream"
SR, SAMPLES_PER_FRAME, CODEBOOKS = 24000, 1920, 16
# 7 frames + a partial one; 180 frames + a partial one = 361 transformer steps (window 250)
LENGTHS = {"partial": 7 * SAMPLES_PER_FRAME + 500, "long": 180 * SAMPLES_PER_FRAME + 1234}
WINDOW_STEPS = 250  # the tiny codec's encoder_config.sliding_window

UPSTREAM_SCRIPT = """
import sys
import numpy as np
import torch
torch.set_num_threads(1)
from qwen_tts import Qwen3TTSTokenizer
tok = Qwen3TTSTokenizer.from_pretrained(sys.argv[1])
with np.load(sys.argv[2]) as z:
    wavs = {k: z[k] for k in z.files}
np.savez(sys.argv[3], **{k: tok.encode(w, sr=24000).audio_codes[0].numpy() for k, w in wavs.items()})
"""


def _run_upstream(python: Path, tokenizer_dir: Path, wavs: dict, out: Path) -> dict:
    """Upstream's Qwen3TTSTokenizer.encode of each wav, in the reference venv (one thread, no
    hub; the environment as tests/qwen_tts_reference/harness.py sets it)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    script, inputs, codes = out / "encode.py", out / "wavs.npz", out / "codes.npz"
    script.write_text(UPSTREAM_SCRIPT)
    np.savez(inputs, **wavs)
    cmd = [str(python), str(script), str(tokenizer_dir), str(inputs), str(codes)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"upstream encode failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    with np.load(codes) as z:
        return {k: z[k] for k in z.files}


def _tokenizer_dir(manifest: dict) -> Path:
    return Path(manifest["modes"][MODE]["checkpoint"]) / "speech_tokenizer"


def _ref(manifest: dict) -> tuple[np.ndarray, np.ndarray]:
    wav, sr = sf.read(manifest["ref_wav"], dtype="float32")
    assert sr == SR
    with np.load(manifest["modes"][MODE]["npz"]) as z:
        return wav, z["ref_codes"]


def _wav(n: int, seed: int) -> np.ndarray:
    """Speech-like level: a 150 Hz tone with noise, as float32."""
    rng = np.random.default_rng(seed)
    tone = 0.3 * np.sin(2 * np.pi * 150 * np.arange(n) / SR)
    return (tone + 0.05 * rng.standard_normal(n)).astype(np.float32)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def encoder(qwen_tts_reference: dict):
    return load_speech_encoder(_tokenizer_dir(qwen_tts_reference))


@pytest.fixture(scope="module")
def upstream(qwen_tts_reference: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    wavs = {name: _wav(n, seed) for seed, (name, n) in enumerate(LENGTHS.items())}
    out = tmp_path_factory.mktemp("speech_encoder_upstream")
    python = Path(qwen_tts_reference["python"])
    codes = _run_upstream(python, _tokenizer_dir(qwen_tts_reference), wavs, out)
    return {name: (wavs[name], codes[name]) for name in wavs}


@pytest.fixture(scope="module")
def engine(
    qwen_tts_reference: dict, exports: ExportStore, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The raw export of the encoder (export_speech_encoder of load_speech_encoder, through
    the family's export_component and the session's store: export_store.py)."""
    from edgeomni.export.families.qwen3_tts.speech_encoder import ENGINE
    from edgeomni.export.family import BuildArgs

    work = tmp_path_factory.mktemp("speech_encoder")
    ckpt = _tokenizer_dir(qwen_tts_reference).parent
    path = exports.component(ckpt, "speech_tokenizer_encoder", work, BuildArgs(1, 1, 1))
    assert path == work / ENGINE
    return path


@pytest.fixture(scope="module")
def session(engine: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(str(engine), options, providers=["CPUExecutionProvider"])


def _torch_codes(encoder, wav: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return encoder(torch.from_numpy(np.atleast_2d(wav))).numpy()


def test_ref_wav_matches_upstream(qwen_tts_reference: dict, encoder) -> None:
    wav, ref_codes = _ref(qwen_tts_reference)
    assert not encoder.training
    assert ref_codes.shape == (wav.shape[0] // SAMPLES_PER_FRAME, CODEBOOKS) == (10, 16)
    codes = _torch_codes(encoder, wav)
    assert codes.dtype == np.int64 and codes.shape == (1, *ref_codes.shape)
    np.testing.assert_array_equal(codes[0], ref_codes)


@pytest.mark.parametrize("name", list(LENGTHS))
def test_other_lengths_match_upstream(encoder, upstream: dict, name: str) -> None:
    wav, ref = upstream[name]
    frames = -(-wav.shape[0] // SAMPLES_PER_FRAME)  # upstream: ceil(samples / 1920)
    assert ref.shape == (frames, CODEBOOKS)
    np.testing.assert_array_equal(_torch_codes(encoder, wav)[0], ref)


def test_upstream_ignores_the_sliding_window(encoder, upstream: dict) -> None:
    """The long input reaches past the window: with transformers 5's windowed mask (``window``)
    codes change, so the full-causal default is what the long-length parity test pins down."""
    wav, ref = upstream["long"]
    assert -(-wav.shape[0] // (SAMPLES_PER_FRAME // 2)) > WINDOW_STEPS
    encoder.window = WINDOW_STEPS
    try:
        windowed = _torch_codes(encoder, wav)[0]
    finally:
        encoder.window = None
    differs = windowed != ref
    assert differs.any() and not differs[: WINDOW_STEPS // 2].any()


def test_batch_rows_encode_alone(encoder, upstream: dict) -> None:
    a = _wav(LENGTHS["partial"], seed=7)
    b = upstream["partial"][0]
    both = _torch_codes(encoder, np.stack([a, b]))
    np.testing.assert_array_equal(both[0], _torch_codes(encoder, a)[0])
    np.testing.assert_array_equal(both[1], upstream["partial"][1])


def test_onnx_engine_matches_upstream(
    qwen_tts_reference: dict, engine: Path, session, upstream: dict
) -> None:
    import onnx

    graph = onnx.load(str(engine), load_external_data=False).graph
    assert {n.domain for n in graph.node} <= {"", "ai.onnx"}  # plain ONNX, no plugin ops
    [inp], [out] = session.get_inputs(), session.get_outputs()
    assert (inp.name, inp.type, inp.shape) == ("wav", "tensor(float)", ["batch", "samples"])
    assert (out.name, out.type, out.shape) == ("codes", "tensor(int64)", ["batch", "frames", 16])

    wav, ref_codes = _ref(qwen_tts_reference)
    codes = session.run(None, {"wav": wav[None]})[0]
    assert codes.dtype == np.int64
    np.testing.assert_array_equal(codes[0], ref_codes)
    for name in LENGTHS:
        wav, ref = upstream[name]
        np.testing.assert_array_equal(session.run(None, {"wav": wav[None]})[0][0], ref)


def test_onnx_engine_batches_and_short_inputs(encoder, session, upstream: dict) -> None:
    a, b = _wav(LENGTHS["partial"], seed=7), upstream["partial"][0]
    both = session.run(None, {"wav": np.stack([a, b])})[0]
    np.testing.assert_array_equal(both[0], _torch_codes(encoder, a)[0])
    np.testing.assert_array_equal(both[1], upstream["partial"][1])
    for n in (1, SAMPLES_PER_FRAME - 1, SAMPLES_PER_FRAME, SAMPLES_PER_FRAME + 1):
        wav = np.stack([_wav(n, seed=n), _wav(n, seed=n + 1)])
        codes = session.run(None, {"wav": wav})[0]
        assert codes.shape == (2, -(-n // SAMPLES_PER_FRAME), CODEBOOKS)
        np.testing.assert_array_equal(codes, _torch_codes(encoder, wav))


def test_engine_config(qwen_tts_reference: dict) -> None:
    import json

    cfg = json.loads((_tokenizer_dir(qwen_tts_reference) / "config.json").read_text())
    assert engine_config(cfg) == {
        "sample_rate": 24000,
        "samples_per_frame": 1920,
        "num_quantizers": 16,
    }


# -- strict loading --------------------------------------------------------------------------


def _edited_copy(src: Path, dst: Path, drop: str | None = None, put: dict | None = None) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    if drop is not None:
        del tensors[drop]
    tensors.update(put or {})
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def test_every_encoder_tensor_is_used_or_listed(qwen_tts_reference: dict, encoder) -> None:
    src = _tokenizer_dir(qwen_tts_reference)
    names = {n for n in load_file(str(src / "model.safetensors")) if n.startswith("encoder.")}
    params = {"encoder." + n for n in encoder.state_dict()}
    assert params <= names
    acoustic = "encoder.quantizer.acoustic_residual_vector_quantizer.layers."
    # codebooks 16..31 (acoustic 15..30) come after the kept ones in the residual chain
    late = {
        n for n in names if n.startswith(acoustic) and int(n[len(acoustic) :].split(".")[0]) >= 15
    }
    assert len(late) == 16 * 3  # embed_sum, cluster_usage, initialized
    assert names - params == late | {"encoder." + s for s in UNUSED_SUFFIXES}


def test_missing_or_misshaped_tensor_is_named(qwen_tts_reference: dict, tmp_path: Path) -> None:
    src = _tokenizer_dir(qwen_tts_reference)
    key = "encoder.quantizer.acoustic_residual_vector_quantizer.layers.3.codebook.embed_sum"
    with pytest.raises(CheckpointError, match=rf"missing \['{key}'\], unexpected \[\]"):
        load_speech_encoder(_edited_copy(src, tmp_path / "missing", drop=key))
    key = "encoder.encoder_transformer.layers.0.self_attn.q_proj.weight"
    with pytest.raises(CheckpointError, match=rf"{key} has shape \(32, 31\), expected \(32, 32\)"):
        load_speech_encoder(_edited_copy(src, tmp_path / "shape", put={key: torch.zeros(32, 31)}))
    extra = "encoder.encoder.layers.0.extra"
    with pytest.raises(CheckpointError, match=rf"missing \[\], unexpected \['{extra}'\]"):
        load_speech_encoder(_edited_copy(src, tmp_path / "extra", put={extra: torch.zeros(3)}))
    # a codebook past the kept 16 is not read: dropping it changes nothing
    late = "encoder.quantizer.acoustic_residual_vector_quantizer.layers.20.codebook.embed_sum"
    load_speech_encoder(_edited_copy(src, tmp_path / "late", drop=late))


# -- configurations upstream accepts, against transformers' own Mimi (no reference venv) ------

# encoder_config changes (over the tiny codec's) that upstream's Qwen3TTSTokenizerV2Encoder, a
# transformers MimiModel, builds and encodes with
MIMI_VARIANTS = {
    "tiny": {},
    # vector_quantization_hidden_dimension == hidden_size: Mimi has no input_proj / output_proj
    "no-vq-projection": tiny_tts.no_vq_projection()["encoder_config"],
    "two-semantic-quantizers": {"num_semantic_quantizers": 2},
    "bias-gqa-3-layers": {"attention_bias": True, "num_key_value_heads": 1, "num_hidden_layers": 3},
    "conv-shortcut-2-residual": {"use_conv_shortcut": True, "num_residual_layers": 2},
    "16-quantizers": {"num_quantizers": 16},
    "no-window-no-head-dim": {"sliding_window": None, "head_dim": None},
}


def _codec_folder(root: Path, encoder: dict, top: dict | None = None) -> Path:
    """A tiny random speech_tokenizer/ with these encoder_config (and top-level) changes; a
    value of tiny_tts.REMOVE takes the key out."""
    codec = tiny_tts.codec_config("tiny")
    for target, changes in ((codec["encoder_config"], encoder), (codec, top or {})):
        target.update(changes)
        for key in [k for k, v in changes.items() if v == tiny_tts.REMOVE]:
            del target[key]
    return tiny_tts.write_speech_tokenizer(root, codec, torch.Generator().manual_seed(3))


def _transformers_mimi(folder: Path):
    """transformers' MimiModel of the folder's encoder_config (all its quantizers) with the
    folder's encoder.* weights under 5.x's names: upstream's encoder, as transformers runs it."""
    import json

    from transformers import MimiConfig, MimiModel

    enc = json.loads((folder / "config.json").read_text())["encoder_config"]
    # 5.x's strict config takes no None window; the inputs here are shorter than any window
    fields = {k: v for k, v in enc.items() if k != "_frame_rate" and (k, v) != ("sliding_window", None)}  # fmt: skip
    cfg = MimiConfig(**fields, frame_rate=enc["_frame_rate"])
    cfg._attn_implementation = "eager"
    model = MimiModel(cfg).eval()
    names = (("encoder.", "encoder.encoder_seanet."), ("encoder_transformer.", "encoder.encoder_transformer."),
             ("downsample.", "encoder.downsample."))  # fmt: skip
    state = {}
    for name, tensor in load_file(str(folder / "model.safetensors")).items():
        if name.startswith("encoder."):
            name = name[len("encoder.") :]
            old, new = next(((o, n) for o, n in names if name.startswith(o)), ("", ""))
            state[new + name[len(old) :]] = tensor
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert [n for n in missing if not n.startswith("decoder.")] == [] and unexpected == []
    return model


@pytest.mark.parametrize("name", list(MIMI_VARIANTS))
def test_config_variants_encode_as_transformers_mimi(tmp_path: Path, name: str) -> None:
    folder = _codec_folder(tmp_path / "speech_tokenizer", MIMI_VARIANTS[name])
    ours, reference = load_speech_encoder(folder), _transformers_mimi(folder)
    n = 7 * SAMPLES_PER_FRAME + 500  # 15 transformer steps: inside every window
    wav = torch.from_numpy(np.stack([_wav(n, seed=1), _wav(n, seed=2)]))
    with torch.no_grad():
        expected = reference.encode(wav[:, None], num_quantizers=CODEBOOKS).audio_codes
        codes = ours(wav).numpy()
    assert codes.shape == (2, 8, CODEBOOKS) and len(np.unique(codes)) > 16  # not all one code
    np.testing.assert_array_equal(codes, expected.transpose(1, 2).numpy())
    projected = reference.quantizer.semantic_residual_vector_quantizer.input_proj is not None
    assert projected == (name != "no-vq-projection")


def test_left_out_keys_take_upstreams_defaults(tmp_path: Path) -> None:
    """Qwen3TTSTokenizerV2Config's defaults: 16 kept codebooks (not the RVQ's 32), 1920 samples
    a frame, 24 kHz input."""
    remove = tiny_tts.REMOVE
    top = dict.fromkeys(
        ("encoder_valid_num_quantizers", "encode_downsample_rate", "input_sample_rate"), remove
    )
    folder = _codec_folder(tmp_path / "st", {"num_quantizers": remove}, top)
    import json

    cfg = json.loads((folder / "config.json").read_text())
    assert (
        "encoder_valid_num_quantizers" not in cfg and "num_quantizers" not in cfg["encoder_config"]
    )
    assert engine_config(cfg) == {"sample_rate": 24000, "samples_per_frame": 1920, "num_quantizers": 16}  # fmt: skip
    assert load_speech_encoder(folder).num_quantizers == 16


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"pad_mode": "reflect"}, "encoder_config.pad_mode 'reflect'"),
        ({"use_causal_conv": False}, "encoder_config.use_causal_conv false"),
        ({"audio_channels": 2}, "encoder_config.audio_channels 2"),
        ({"_frame_rate": 25.0}, "encoder_config._frame_rate 25.0 is the SEANet's own rate"),
        ({"_frame_rate": 10.0}, "encoder_config._frame_rate 10.0 does not divide"),
        ({"vector_quantization_hidden_dimension": 32}, "vector_quantization_hidden_dimension 32 is not codebook_dim 16"),
        ({"num_semantic_quantizers": 32}, "encoder_config: "),
        ({"hidden_size": "wide"}, "encoder_config: "),
    ],
)  # fmt: skip
def test_configs_it_cannot_encode_are_refused_by_key(change: dict, named: str) -> None:
    from edgeomni.export.families.qwen3_tts.speech_encoder import mimi_config

    codec = tiny_tts.codec_config("tiny")
    codec["encoder_config"].update(change)
    with pytest.raises(CheckpointError, match="^speech_tokenizer/config.json: ") as e:
        mimi_config(codec)
    assert named in str(e.value)
    for top, value in (("encoder_valid_num_quantizers", 33), ("encode_downsample_rate", 960)):
        with pytest.raises(CheckpointError, match=f"{top} {value} "):
            mimi_config({**tiny_tts.codec_config("tiny"), top: value})
