"""bench/qwen3_tts_cpu.py's checkpoints: random-weight Qwen3-TTS CustomVoice and Base
checkpoints and their codec, made with upstream's own classes (tests/qwen_tts_reference/
make_reference.py's builders) at the tiny or Qwen3-TTS-12Hz-0.6B dimensions, and a reference
clip for voice cloning.

Apart from qwen3_tts_cpu.py to keep each file under the project's 800-line limit;
make_checkpoints is its ``_make`` worker, run in the upstream reference venv (which has no
edgeomni). Standard library only at import: qwen3_tts_cpu.py is imported by the GPU benches'
upstream workers too.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "qwen_tts_reference"
SR = 24000
SAMPLES_PER_FRAME = 1920
KINDS = ("custom_voice", "base")

# Qwen3-TTS-12Hz-0.6B's dimensions (the tiny size is make_reference.py's, unchanged)
TALKER_0B6 = dict(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, vocab_size=3072, num_code_groups=16,
    text_hidden_size=2048, text_vocab_size=151936, rope_theta=1000000.0,
    max_position_embeddings=32768,
    rope_scaling={"rope_type": "default", "mrope_section": [24, 20, 20], "interleaved": True},
)  # fmt: skip
PREDICTOR_0B6 = dict(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=5, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, vocab_size=2048, max_position_embeddings=65536,
    rope_theta=1000000.0, num_code_groups=16,
)  # fmt: skip
SPEAKER_ENCODER_0B6 = dict(
    mel_dim=128, enc_dim=1024, enc_channels=[512, 512, 512, 512, 1536],
    enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=128,
    enc_res2net_scale=8, enc_se_channels=128, sample_rate=SR,
)  # fmt: skip
CODEC_DECODER_0B6 = dict(
    codebook_size=2048, codebook_dim=512, hidden_size=512, latent_dim=1024, num_hidden_layers=8,
    num_attention_heads=16, num_key_value_heads=16, head_dim=64, intermediate_size=1024,
    sliding_window=72, decoder_dim=1536, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2],
    num_quantizers=16, max_position_embeddings=8000, rope_theta=10000,
)  # fmt: skip
# the package's config class has no encoder defaults of its own: Mimi's (transformers'
# MimiConfig: hidden 512, 8 layers, codebook dim 256, ...), 32 quantizers of 2048 codes
CODEC_ENCODER_0B6 = dict(
    sampling_rate=SR, frame_rate=12.5, audio_channels=1, num_quantizers=32, codebook_size=2048,
    use_cache=False,
)  # fmt: skip


def make_checkpoints(spec: dict) -> dict:
    """The codec, the CustomVoice and Base checkpoints (make_reference.py's builders, at
    ``spec["size"]``) and a reference clip, into ``spec["dir"]``."""
    sys.path.insert(0, str(REFERENCE))
    import make_reference as mr
    import soundfile as sf
    import torch

    torch.set_num_threads(spec["threads"])
    out = Path(spec["dir"])
    if spec["size"] != "tiny":
        from qwen_tts.core.models import Qwen3TTSConfig
        from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
            Qwen3TTSTokenizerV2Config,
        )

        tiny_talker = mr.talker_config

        def tts_config(kind: str, ids: dict[str, int]) -> Any:
            talker = {**tiny_talker(kind, ids), **TALKER_0B6}
            talker["code_predictor_config"] = {**talker["code_predictor_config"], **PREDICTOR_0B6}
            return Qwen3TTSConfig(
                talker_config=talker, speaker_encoder_config=dict(SPEAKER_ENCODER_0B6),
                tokenizer_type="qwen3_tts_tokenizer_12hz", tts_model_size="0b6",
                tts_model_type=mr.TTS_TYPE[kind], im_start_token_id=ids["<|im_start|>"],
                im_end_token_id=ids["<|im_end|>"], tts_pad_token_id=ids["<tts_pad>"],
                tts_bos_token_id=ids["<tts_text_bos>"], tts_eos_token_id=ids["<tts_text_eod>"],
            )  # fmt: skip

        def codec_config() -> Any:
            return Qwen3TTSTokenizerV2Config(
                encoder_config=dict(CODEC_ENCODER_0B6), decoder_config=dict(CODEC_DECODER_0B6),
                encoder_valid_num_quantizers=16, input_sample_rate=SR, output_sample_rate=SR,
                decode_upsample_rate=SAMPLES_PER_FRAME, encode_downsample_rate=SAMPLES_PER_FRAME,
            )  # fmt: skip

        mr.tts_config, mr.codec_config = tts_config, codec_config  # what make_* look up
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    codec = mr.make_codec(out / "codec")
    seconds["codec"] = round(time.perf_counter() - start, 1)
    params: dict[str, int] = {}
    for kind in KINDS:
        start = time.perf_counter()
        mr.make_checkpoint(out / kind, kind, codec)
        seconds[kind] = round(time.perf_counter() - start, 1)
        params[kind] = parameter_count(out / kind / "model.safetensors")
    params["codec"] = parameter_count(codec / "model.safetensors")
    sf.write(out / "ref.wav", reference_clip(spec["ref_seconds"]), SR, subtype="FLOAT")
    return {"seconds": seconds, "parameters": params, "ref_seconds": spec["ref_seconds"]}


def parameter_count(path: Path) -> int:
    import math

    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118


def reference_clip(seconds: float) -> Any:
    """A seeded synthetic 24 kHz voice stand-in (make_reference.reference_wav's recipe, any
    length): two harmonics with a slow vibrato, plus noise."""
    import numpy as np

    n = int(round(seconds * SR / SAMPLES_PER_FRAME)) * SAMPLES_PER_FRAME
    t = np.arange(n) / SR
    f0 = 140.0 * (1 + 0.03 * np.sin(2 * np.pi * 5 * t))
    phase = 2 * np.pi * np.cumsum(f0) / SR
    noise = np.random.default_rng(1234).standard_normal(n)
    return (0.3 * np.sin(phase) + 0.15 * np.sin(2 * phase) + 0.02 * noise).astype(np.float32)
