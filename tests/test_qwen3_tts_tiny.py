"""export/tiny_tts.py writes Qwen3-TTS checkpoints upstream's package would: the same tensor
names and shapes as checkpoints made with qwen-tts 0.1.1's own classes at the same dimensions,
loaded by upstream with nothing missing or unexpected, and spoken the same by upstream and by
edgeomni's engines."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from edgeomni.export.tiny_tts import make_checkpoint

KINDS = ("custom_voice", "base", "voice_design")
TEXT = "Hello world, this is a test."
FRAMES = 6


def shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-tts")
    return {kind: make_checkpoint(root / kind, kind, "tiny", seed=3) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_tensors_match_upstreams_checkpoint(
    qwen_tts_reference: dict, written: dict[str, Path], kind: str
) -> None:
    ref = Path(qwen_tts_reference["checkpoints"][kind]["dir"])
    for name in ("model.safetensors", "speech_tokenizer/model.safetensors"):
        assert shapes(written[kind] / name) == shapes(ref / name), name
    ours = json.loads((written[kind] / "config.json").read_text())
    theirs = json.loads((ref / "config.json").read_text())
    assert ours["tts_model_type"] == theirs["tts_model_type"] == kind
    for key in ("hidden_size", "num_hidden_layers", "num_code_groups", "spk_id", "vocab_size"):
        assert ours["talker_config"][key] == theirs["talker_config"][key], key
    assert {p.name for p in written[kind].iterdir()} == {p.name for p in ref.iterdir()}


def test_codec_eos_row_is_zero_unless_asked(written: dict[str, Path], tmp_path: Path) -> None:
    eos = json.loads((written["custom_voice"] / "config.json").read_text())["talker_config"][
        "codec_eos_token_id"
    ]
    with safe_open(str(written["custom_voice"] / "model.safetensors"), "pt") as f:
        assert not f.get_tensor("talker.codec_head.weight")[eos].any()
    stops = make_checkpoint(tmp_path / "stops", "custom_voice", "tiny", seed=3, stops=True)
    with safe_open(str(stops / "model.safetensors"), "pt") as f:
        assert f.get_tensor("talker.codec_head.weight")[eos].abs().sum() > 0


UPSTREAM = r"""
import json, sys
import numpy as np, torch
torch.set_num_threads(1)
from qwen_tts import Qwen3TTSModel
from qwen_tts.core.models import Qwen3TTSForConditionalGeneration
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model
ckpt, out, text, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
from transformers import PreTrainedModel
# upstream's own from_pretrained also loads the codec, and cannot return the loading info
_, info = PreTrainedModel.from_pretrained.__func__(
    Qwen3TTSForConditionalGeneration, ckpt, output_loading_info=True)
_, codec = Qwen3TTSTokenizerV2Model.from_pretrained(ckpt + "/speech_tokenizer",
                                                    output_loading_info=True)
tts = Qwen3TTSModel.from_pretrained(ckpt)
greedy = dict(do_sample=False, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
              subtalker_dosample=False, subtalker_top_k=50, subtalker_top_p=1.0,
              subtalker_temperature=0.9, max_new_tokens=steps)
wavs, sr = tts.generate_custom_voice(text=text, speaker="ryan", language="English",
                                     non_streaming_mode=True, **greedy)
np.save(out + "/wav.npy", wavs[0])
json.dump({k: sorted(map(str, v)) for k, v in {**info, **{"codec_" + k: v for k, v in
           codec.items()}}.items() if isinstance(v, (list, set))}, open(out + "/info.json", "w"))
"""


def test_upstream_loads_and_speaks_it_as_edgeomni_does(
    qwen_tts_python: Path, tts_engine: Path, tmp_path: Path
) -> None:
    """No tensor missing or unexpected for upstream (model and codec), and the same audio from
    upstream's greedy run as from edgeomni's engines built from the written checkpoint (the
    session's: export/tiny_tts.py's CustomVoice checkpoint and edge-build's engines of it,
    tests/conftest.py)."""
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    ckpt = tts_engine.parent / "ckpt"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME",
                                                            "VIRTUAL_ENV")}  # fmt: skip
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    cmd = [str(qwen_tts_python), "-c", UPSTREAM, str(ckpt), str(tmp_path), TEXT, str(FRAMES + 1)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = json.loads((tmp_path / "info.json").read_text())
    assert {k: v for k, v in info.items() if v} == {}, info  # missing, unexpected, mismatched
    wav = np.load(tmp_path / "wav.npy")
    assert wav.shape == (FRAMES * 1920,)

    engine = tts_engine
    body = {"talker_do_sample": 0, "subtalker_dosample": 0, "talker_max_new_tokens": FRAMES + 1,
            "requests": [{"messages": [{"role": "assistant", "content": TEXT}],
                          "speaker": "ryan", "language": "English"}]}  # fmt: skip
    [out] = Pipeline(engine).run(parse_request_file(body)[0], batch_size=1)
    assert out.entry["ok"], out.entry["error"]
    np.testing.assert_allclose(out.audio, wav, rtol=0, atol=1e-4)
    assert wav.std() > 0.01  # audible: the codec tables are random, the output level calibrated
