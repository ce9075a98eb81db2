"""Tiny random Qwen3-TTS checkpoints and their upstream reference runs (greedy), for parity tests.

Runs INSIDE the reference venv (``make_venv.py``): upstream ``qwen-tts`` 0.1.1, unmodified, on the
transformers it pins (4.57.3). It does not import edgeomni.

    REF/bin/python tests/qwen_tts_reference/make_reference.py OUT_DIR [--only MODE ...]
        [--checkpoints EARLIER_OUT_DIR]

1. Builds four checkpoints (CustomVoice 0.6B-style, Base 0.6B-style, VoiceDesign 1.7B-style,
   and CustomVoice 1.7B-style, the size that takes an instruction) with the package's own classes and ``save_pretrained``, in the official release layout:
   ``config.json`` (``tts_model_type``, ``tts_model_size``), ``model.safetensors``, a Qwen2 BPE
   (``vocab.json`` + ``merges.txt`` + ``tokenizer_config.json``, no ``tokenizer.json``),
   ``generation_config.json`` (the release's sampling defaults), ``preprocessor_config.json``, and
   ``speech_tokenizer/`` with a tiny 12 Hz codec (Mimi encoder + split-RVQ decoder). Seeded:
   the same bytes come out every time (the manifest records the weights' sha256).
2. Loads each back through ``qwen_tts.Qwen3TTSModel.from_pretrained(dir)`` and runs every mode
   greedily (talker and sub-talker both, passed explicitly) in streaming and non-streaming text
   mode, writing ``OUT_DIR/<mode>.npz`` and ``OUT_DIR/manifest.json``.

Pitfalls handled here (see /work/shared/notes/families.md, "## 1. Qwen3-TTS"):
- ``save_pretrained`` writes ``"model_type": ""`` into ``speaker_encoder_config``, whose class takes
  no ``**kwargs``: the key is dropped from config.json after saving.
- The wrapper slices the prompt by position (``[:, :3]``, ``[:, 3:-5]``, ``[:, 3:-2]``), so
  "assistant", "user" and "\\n" are single tokens of the tiny BPE (checked).
- ``generation_config.json`` holds sampling defaults that the wrapper applies to every argument
  left None, so every generation argument is passed explicitly (``GREEDY``).
- The RVQ ``embedding_sum`` tables (decoder parameters) and Mimi's ``embed_sum`` (encoder buffers)
  start at zero: randomised, or the audio is silence and every reference code is 0.
- One intra-op thread (two threads on a shared 2-core machine ran ~10x slower).
- The codec EOS row of ``codec_head`` is zeroed, so the talker never stops early: every run makes
  exactly ``talker_steps - 1`` frames (EOS stays an allowed, never-chosen id: random logits are
  N(0, ~1) over 2048 codes, and the best of them is always above 0). One checkpoint is then
  made to stop by itself in one mode (``make_stopping``, ``STOPPING``), so that mode ends on EOS.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

torch.set_num_threads(1)

SEED = 1234
SR = 24000
SAMPLES_PER_FRAME = 1920
NUM_CODE_GROUPS = 16
CODEBOOK = 2048
TALKER_VOCAB = 3072  # codes [0, 2048) + control ids; [vocab - 1024, vocab) suppressed but EOS
TALKER_STEPS = 12  # max_new_tokens: 12 talker forwards -> 11 frames
TALKER_H = 32
TEXT_H = 32

# Public config values (families.md "Config keys"); only their roles matter to the tiny model.
CODEC_IDS = dict(
    codec_pad_id=2148,
    codec_bos_id=2149,
    codec_eos_token_id=2150,
    codec_think_id=2154,
    codec_nothink_id=2155,
    codec_think_bos_id=2156,
    codec_think_eos_id=2157,
)
LANGUAGES = {
    "english": 2050,
    "german": 2051,
    "chinese": 2055,
    "japanese": 2058,
    "beijing_dialect": 2074,  # dialect ids: invented for the tiny model (not listed publicly)
    "sichuan_dialect": 2062,
}
SPEAKERS = {
    "vivian": 3065,
    "serena": 3066,
    "uncle_fu": 3010,
    "dylan": 2878,
    "eric": 2875,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
}
DIALECT = {"dylan": "beijing_dialect", "eric": "sichuan_dialect"}

# The release's generation_config.json (sampling defaults the wrapper falls back to).
RELEASE_GENERATION = {
    "do_sample": True,
    "repetition_penalty": 1.05,
    "temperature": 0.9,
    "top_p": 1.0,
    "top_k": 50,
    "subtalker_dosample": True,
    "subtalker_temperature": 0.9,
    "subtalker_top_p": 1.0,
    "subtalker_top_k": 50,
    "max_new_tokens": 8192,
}
# Every argument the wrapper would otherwise take from generation_config.json.
# repetition_penalty keeps the release value: a runtime claiming parity must reproduce it
# (it counts only generated codes; the talker is prompted with inputs_embeds).
GREEDY = {
    "do_sample": False,
    "top_k": 50,
    "top_p": 1.0,
    "temperature": 0.9,
    "repetition_penalty": 1.05,
    "subtalker_dosample": False,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
    "subtalker_temperature": 0.9,
    "max_new_tokens": TALKER_STEPS,
}

TEXT = "Hello world, this is a test."
TEXT_ZH = "你好，世界。"
REF_TEXT = "The reference says hi."
INSTRUCT = "A calm low voice, speaking slowly."
REF_SECONDS_FRAMES = 10  # reference waveform: 10 frames of 1920 samples (0.8 s)
# a second reference, another voice stand-in of another length (7 frames and a part), for a
# batch of clones with different references
REF2 = dict(f0_hz=230.0, frames=8, seed=SEED + 7, trim=700)
REF_TEXT2 = "A second voice."

# Special tokens appended after the BPE vocabulary, as in Qwen's tokenizer (ids at the top).
SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
)
WHOLE_WORDS = ("assistant", "user", "Ġthe", "Ġis", "Ġa", "Hello", "Ġworld", "Ġtest")

# mode -> (checkpoint kind, request); "stream" and "nonstream" variants are made of each.
MODES: dict[str, tuple[str, dict[str, Any]]] = {
    "cv_plain": ("custom_voice", dict(text=TEXT, speaker="vivian", language="English")),
    "cv_dialect": ("custom_voice", dict(text=TEXT_ZH, speaker="dylan", language="Chinese")),
    "base_xvec": ("base", dict(text=TEXT, language="English", x_vector_only_mode=True)),
    "base_icl": ("base", dict(text=TEXT, language="English", ref_text=REF_TEXT)),
    "base_icl2": (
        "base",
        dict(text=TEXT_ZH, language="Chinese", ref_text=REF_TEXT2, ref_audio="ref2.wav"),
    ),
    "vd": ("voice_design", dict(text=TEXT, instruct=INSTRUCT, language="English")),
    "cv_instruct": (
        "custom_voice_1b7",
        dict(text=TEXT, speaker="ryan", language="English", instruct=INSTRUCT),
    ),
}
SIZE = {"custom_voice": "0b6", "base": "0b6", "voice_design": "1b7", "custom_voice_1b7": "1b7"}
# checkpoint kind -> its tts_model_type (custom_voice_1b7: the size that takes an instruction)
TTS_TYPE = {kind: kind.removesuffix("_1b7") for kind in SIZE}
# the checkpoint whose talker is made to stop on its own (EOS_FRAME), for one mode
STOPPING = ("custom_voice_1b7", "cv_instruct_nonstream")
EOS_FRAME = 5


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def make_tokenizer(out_dir: Path) -> dict[str, int]:
    """A hand-built Qwen2 byte-level BPE: the 256 byte symbols, merges that make each of
    WHOLE_WORDS one token, then SPECIALS. Deterministic by construction (no training)."""
    alphabet = list(bytes_to_unicode().values())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges: list[str] = []
    for word in WHOLE_WORDS:
        cur = word[0]
        for ch in word[1:]:
            merged = cur + ch
            if merged not in vocab:
                merges.append(f"{cur} {ch}")
                vocab[merged] = len(vocab)
            cur = merged
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out_dir / "merges.txt").write_text(
        "#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8"
    )
    ids = {tok: len(vocab) + i for i, tok in enumerate(SPECIALS)}
    added = {
        str(i): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for tok, i in ids.items()
    }
    tok_cfg = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2), encoding="utf-8")
    ids["text_vocab_size"] = len(vocab) + len(SPECIALS)
    return ids


def check_tokenizer(ckpt: Path) -> None:
    """The wrapper's positional slices need one id each for the role word and the newline."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    for text, n in (("<|im_start|>assistant\n", 3), ("<|im_start|>user\n", 3)):
        got = tok(text)["input_ids"]
        if len(got) != n:
            raise RuntimeError(f"{text!r} tokenizes to {got}, wanted {n} ids")
    tail = tok(f"<|im_start|>assistant\n{TEXT}<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    want = tok("<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    if tail[-5:] != want or len(want) != 5:
        raise RuntimeError(f"prompt tail {tail[-5:]} != {want}")


def talker_config(kind: str, ids: dict[str, int]) -> dict[str, Any]:
    speakers = SPEAKERS if TTS_TYPE[kind] == "custom_voice" else {}
    return dict(
        vocab_size=TALKER_VOCAB,
        hidden_size=TALKER_H,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        hidden_act="silu",
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        rope_scaling={"rope_type": "default", "mrope_section": [3, 3, 2], "interleaved": True},
        num_code_groups=NUM_CODE_GROUPS,
        text_hidden_size=TEXT_H,
        text_vocab_size=ids["text_vocab_size"],
        spk_id=dict(speakers),
        spk_is_dialect={name: DIALECT.get(name, False) for name in speakers},
        codec_language_id=dict(LANGUAGES),
        code_predictor_config=dict(
            vocab_size=CODEBOOK,
            hidden_size=16,  # narrower than the talker: exercises small_to_mtp_projection
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            max_position_embeddings=64,
            rope_theta=1000000.0,
            num_code_groups=NUM_CODE_GROUPS,
        ),
        **CODEC_IDS,
    )


def tts_config(kind: str, ids: dict[str, int]) -> Any:
    from qwen_tts.core.models import Qwen3TTSConfig

    return Qwen3TTSConfig(
        talker_config=talker_config(kind, ids),
        speaker_encoder_config=dict(
            mel_dim=128,  # extract_speaker_embedding computes 128 mel bins
            enc_dim=TALKER_H,  # the x-vector is one codec-track position
            enc_channels=[16, 16, 16, 16, 48],
            enc_kernel_sizes=[5, 3, 3, 3, 1],
            enc_dilations=[1, 2, 3, 4, 1],
            enc_attention_channels=8,
            enc_res2net_scale=4,
            enc_se_channels=8,
            sample_rate=SR,
        ),
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size=SIZE[kind],
        tts_model_type=TTS_TYPE[kind],
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"],
        tts_eos_token_id=ids["<tts_text_eod>"],
    )


def codec_config() -> Any:
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )

    encoder = dict(
        sampling_rate=SR,
        frame_rate=12.5,
        audio_channels=1,
        hidden_size=32,
        num_filters=4,
        num_residual_layers=1,
        upsampling_ratios=[8, 6, 5, 4],  # 960 samples, then the stride-2 downsample: 1920
        codebook_size=CODEBOOK,
        codebook_dim=16,
        vector_quantization_hidden_dimension=16,
        num_quantizers=32,  # the package keeps the first 16 (encoder_valid_num_quantizers)
        num_semantic_quantizers=1,
        upsample_groups=32,
        num_hidden_layers=1,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=250,
        use_cache=False,
    )
    # every width distinct (codebook 16, transformer 24 inside a latent path of 32, heads of 8
    # that do not tile the transformer's width, decoder 48), as in the release, whose
    # transformer is a bottleneck inside its latent path: a port that swaps two of them fails
    decoder = dict(
        codebook_size=CODEBOOK,
        codebook_dim=16,
        hidden_size=24,
        latent_dim=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=64,
        num_hidden_layers=2,
        sliding_window=72,
        num_quantizers=NUM_CODE_GROUPS,
        upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2],
        decoder_dim=48,
        max_position_embeddings=8000,
    )
    return Qwen3TTSTokenizerV2Config(
        encoder_config=encoder,
        decoder_config=decoder,
        encoder_valid_num_quantizers=NUM_CODE_GROUPS,
        input_sample_rate=SR,
        output_sample_rate=SR,
        decode_upsample_rate=SAMPLES_PER_FRAME,
        encode_downsample_rate=SAMPLES_PER_FRAME,
    )


def randomize(model: Any, gen: torch.Generator) -> None:
    """Redraw every parameter (the default init is std 0.02 with zero RVQ tables): matrices
    N(0, 1/fan_in), embeddings and codebooks N(0, 1), gains 1 ± 0.1, biases and SnakeBeta
    log-parameters N(0, 0.1). A parameter no rule covers raises."""
    from torch import nn

    def normal(p: torch.Tensor, mean: float, std: float) -> None:
        p.copy_(torch.randn(p.shape, generator=gen) * std + mean)

    with torch.no_grad():
        for mod_name, module in model.named_modules():
            kind = type(module).__name__
            for name, p in module.named_parameters(recurse=False):
                if isinstance(module, nn.Embedding) or name == "embedding_sum":
                    normal(p, 0.0, 1.0)
                elif name == "cluster_usage":
                    pass  # stays 1: embedding = embedding_sum / cluster_usage
                elif name == "bias":
                    normal(p, 0.0, 0.1)
                elif isinstance(module, nn.ConvTranspose1d):
                    fan_in = p.shape[0] * p.shape[2] / module.stride[0]
                    normal(p, 0.0, 1 / math.sqrt(fan_in))
                elif p.ndim >= 2:
                    normal(p, 0.0, 1 / math.sqrt(p[0].numel()))
                elif "SnakeBeta" in kind:
                    normal(p, 0.0, 0.1)
                elif "Norm" in kind or "LayerScale" in kind or name in ("gamma", "scale"):
                    normal(p, 1.0, 0.1)
                else:
                    raise RuntimeError(f"no rule for {mod_name}.{name} ({kind}, {tuple(p.shape)})")
            if hasattr(module, "embed_sum"):  # Mimi's codebooks are buffers
                normal(module.embed_sum, 0.0, 1.0)
                module._embed = None


def calibrate_decoder(decoder: Any, gen: torch.Generator, target_std: float = 0.1) -> None:
    """Keep the 12 Hz decoder's audio inside its ±1 clamp while it still depends on the codes:
    each residual unit's last conv scaled by 0.3, then the final conv so that random codes give
    an output std of ``target_std``."""
    with torch.no_grad():
        for name, p in decoder.decoder.named_parameters():
            if ".conv2.conv." in name:
                p.mul_(0.3)
        last = decoder.decoder[-1].conv
        seen: list[torch.Tensor] = []
        hook = last.register_forward_hook(lambda _m, _i, out: seen.append(out))
        try:
            codes = torch.randint(0, CODEBOOK, (2, NUM_CODE_GROUPS, 40), generator=gen)
            decoder(codes)
        finally:
            hook.remove()
        scale = target_std / seen[0].std().item()
        last.weight.mul_(scale)
        last.bias.mul_(scale)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_codec(out_dir: Path) -> Path:
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Model,
    )

    gen = torch.Generator().manual_seed(SEED + 100)
    torch.manual_seed(SEED + 100)
    model = Qwen3TTSTokenizerV2Model(codec_config()).eval()
    randomize(model, gen)
    calibrate_decoder(model.decoder, gen)
    model.save_pretrained(out_dir)
    (out_dir / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "chunk_length_s": None,
                "feature_extractor_type": "EncodecFeatureExtractor",
                "feature_size": 1,
                "overlap": None,
                "padding_side": "right",
                "padding_value": 0.0,
                "return_attention_mask": True,
                "sampling_rate": SR,
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    (out_dir / "configuration.json").write_text(
        json.dumps({"framework": "pytorch", "task": "feature-extraction"}), encoding="utf-8"
    )
    return out_dir


def make_checkpoint(out_dir: Path, kind: str, codec_dir: Path) -> Path:
    from qwen_tts.core.models import Qwen3TTSForConditionalGeneration

    out_dir.mkdir(parents=True, exist_ok=True)
    ids = make_tokenizer(out_dir)
    seed = SEED + {"custom_voice": 1, "base": 2, "voice_design": 3, "custom_voice_1b7": 4}[kind]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(tts_config(kind, ids)).eval()
    randomize(model, gen)
    with torch.no_grad():
        model.talker.codec_head.weight[CODEC_IDS["codec_eos_token_id"]].zero_()
    model.save_pretrained(out_dir)

    cfg_path = out_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["speaker_encoder_config"].pop(
        "model_type", None
    )  # Qwen3TTSSpeakerEncoderConfig: no **kwargs
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out_dir / "generation_config.json").write_text(json.dumps(RELEASE_GENERATION, indent=2))
    (out_dir / "preprocessor_config.json").write_text(
        json.dumps({"processor_class": "Qwen3TTSProcessor"}, indent=2)
    )
    for extra in ("tokenizer.json", "special_tokens_map.json", "added_tokens.json"):
        (out_dir / extra).unlink(missing_ok=True)
    shutil.copytree(codec_dir, out_dir / "speech_tokenizer", dirs_exist_ok=True)
    check_tokenizer(out_dir)
    return out_dir


def reference_wav(
    f0_hz: float = 140.0, frames: int = REF_SECONDS_FRAMES, seed: int = SEED
) -> np.ndarray:
    """A seeded synthetic 24 kHz voice stand-in: two harmonics with a slow vibrato, plus noise."""
    n = frames * SAMPLES_PER_FRAME
    t = np.arange(n) / SR
    rng = np.random.default_rng(seed)
    f0 = f0_hz * (1 + 0.03 * np.sin(2 * np.pi * 5 * t))
    phase = 2 * np.pi * np.cumsum(f0) / SR
    wav = 0.3 * np.sin(phase) + 0.15 * np.sin(2 * phase) + 0.02 * rng.standard_normal(n)
    return wav.astype(np.float32)


def run_mode(tts: Any, kind: str, request: dict[str, Any], non_streaming: bool, ref: Path) -> dict:
    """One greedy wrapper call; returns the arrays to save."""
    out: dict[str, np.ndarray] = {}
    captured: dict[str, Any] = {}
    model = tts.model
    orig_generate = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        codes_list, hiddens = orig_generate(*args, **kwargs)
        captured["codes"] = codes_list[0]
        return codes_list, hiddens

    model.generate = generate  # instance attribute: records the talker codes, then passes them on
    try:
        if TTS_TYPE[kind] == "custom_voice":
            wavs, sr = tts.generate_custom_voice(
                text=request["text"],
                speaker=request["speaker"],
                language=request["language"],
                instruct=request.get("instruct"),
                non_streaming_mode=non_streaming,
                **GREEDY,
            )
        elif TTS_TYPE[kind] == "voice_design":
            wavs, sr = tts.generate_voice_design(
                text=request["text"],
                instruct=request["instruct"],
                language=request["language"],
                non_streaming_mode=non_streaming,
                **GREEDY,
            )
        else:
            xvec = bool(request.get("x_vector_only_mode", False))
            items = tts.create_voice_clone_prompt(
                ref_audio=str(ref), ref_text=request.get("ref_text"), x_vector_only_mode=xvec
            )
            item = items[0]
            out["spk_embedding"] = item.ref_spk_embedding.float().cpu().numpy()
            if item.ref_code is not None:
                out["ref_codes"] = item.ref_code.long().cpu().numpy()
            wavs, sr = tts.generate_voice_clone(
                text=request["text"],
                language=request["language"],
                voice_clone_prompt=items,
                non_streaming_mode=non_streaming,
                **GREEDY,
            )
    finally:
        del model.generate
    if sr != SR:
        raise RuntimeError(f"sample rate {sr}")
    out["codes"] = captured["codes"].long().cpu().numpy()
    out["wav"] = np.asarray(wavs[0], dtype=np.float32)
    return out


def make_stopping(ckpt: Path) -> int:
    """Make the talker of ``ckpt`` choose EOS by itself in the STOPPING mode, near frame
    EOS_FRAME: run that mode greedily (its EOS row is zero), take the first code c the talker
    drew for frame EOS_FRAME, and set the EOS row to 1.5 x c's row. At that step EOS then
    scores 1.5 x c's logit (c was the best of 2048, so positive) and wins, unless it won at an
    earlier step already; the frames before are unchanged. Returns c."""
    import qwen_tts
    from safetensors.torch import load_file, save_file

    mode = STOPPING[1].rsplit("_", 1)[0]
    kind, request = MODES[mode]
    tts = qwen_tts.Qwen3TTSModel.from_pretrained(str(ckpt))
    codes = run_mode(tts, kind, request, STOPPING[1].endswith("_nonstream"), ckpt)["codes"]
    c = int(codes[EOS_FRAME, 0])
    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    head = tensors["talker.codec_head.weight"]
    head[CODEC_IDS["codec_eos_token_id"]] = 1.5 * head[c]
    save_file(tensors, str(path), metadata={"format": "pt"})
    return c


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--only", nargs="*", default=None, help="modes, e.g. cv_plain_stream")
    parser.add_argument(
        "--checkpoints",
        type=Path,
        default=None,
        help="reuse the checkpoints (and ref.wav) of an earlier run's OUT_DIR instead of building",
    )
    args = parser.parse_args(argv)

    import qwen_tts
    import soundfile as sf
    import transformers

    start = time.perf_counter()
    out: Path = args.out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.checkpoints is None:
        ckpt_root = out / "checkpoints"
        codec = make_codec(ckpt_root / "_codec")
        ckpts = {kind: make_checkpoint(ckpt_root / kind, kind, codec) for kind in SIZE}
        make_stopping(ckpts[STOPPING[0]])
        ref = out / "ref.wav"
        sf.write(ref, reference_wav(), SR, subtype="FLOAT")
        second = {k: v for k, v in REF2.items() if k != "trim"}
        sf.write(out / "ref2.wav", reference_wav(**second)[: -REF2["trim"]], SR, subtype="FLOAT")
    else:
        earlier = args.checkpoints.resolve()
        codec = earlier / "checkpoints" / "_codec"
        ckpts = {kind: earlier / "checkpoints" / kind for kind in SIZE}
        ref = earlier / "ref.wav"
    built = time.perf_counter()

    versions = {
        "qwen-tts": getattr(qwen_tts, "__version__", None) or _dist_version("qwen-tts"),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
    }
    manifest: dict[str, Any] = {
        "versions": versions,
        "talker_steps": TALKER_STEPS,
        "samples_per_frame": SAMPLES_PER_FRAME,
        "sample_rate": SR,
        "generation": GREEDY,
        "ref_wav": str(ref),
        "checkpoints": {
            kind: {"dir": str(d), "sha256": sha256(d / "model.safetensors")}
            for kind, d in ckpts.items()
        },
        "codec_sha256": sha256(codec / "model.safetensors"),
        "modes": {},
    }
    loaded: dict[str, Any] = {}
    for base_name, (kind, request) in MODES.items():
        for suffix, non_streaming in (("stream", False), ("nonstream", True)):
            name = f"{base_name}_{suffix}"
            if args.only is not None and name not in args.only:
                continue
            if kind not in loaded:
                loaded[kind] = qwen_tts.Qwen3TTSModel.from_pretrained(str(ckpts[kind]))
            t0 = time.perf_counter()
            clip = ref.parent / request["ref_audio"] if "ref_audio" in request else ref
            arrays = run_mode(loaded[kind], kind, request, non_streaming, clip)
            seconds = time.perf_counter() - t0
            np.savez(out / f"{name}.npz", **arrays)
            manifest["modes"][name] = {
                "mode": base_name,
                "kind": kind,
                "non_streaming_mode": non_streaming,
                "checkpoint": str(ckpts[kind]),
                "npz": str(out / f"{name}.npz"),
                "text": request["text"],
                "speaker": request.get("speaker"),
                "language": request.get("language"),
                "instruct": request.get("instruct"),
                "ref_text": request.get("ref_text"),
                "x_vector_only_mode": request.get("x_vector_only_mode", False)
                if kind == "base"
                else None,
                "ref_wav": str(clip) if kind == "base" else None,
                "frames": int(arrays["codes"].shape[0]),
                "samples": int(arrays["wav"].shape[0]),
                "ref_frames": int(arrays["ref_codes"].shape[0]) if "ref_codes" in arrays else None,
                "seconds": round(seconds, 3),
            }
    manifest["seconds"] = {
        "build": round(built - start, 2),
        "total": round(time.perf_counter() - start, 2),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest["seconds"]))
    return 0


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
