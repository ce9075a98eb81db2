"""Random Qwen3-TTS checkpoints in the release layout, made without the qwen-tts package.

The release layout (config.json with ``tts_model_type`` and ``tts_model_size``,
model.safetensors, a Qwen2 BPE as vocab.json + merges.txt, generation_config.json,
``speech_tokenizer/`` with the 12 Hz codec) at tiny or release dimensions, with random weights by
upstream's tensor names: what edge-build reads, for demos, benchmarks on machines without the
reference package, and the GPU machine (which builds large models from configs). The tests check
that upstream qwen-tts 0.1.1 loads what this writes with no tensor missing or unexpected.

    python -m edgeomni.export.tiny_tts OUT_DIR [--kind custom_voice|base|voice_design]
        [--size tiny|0.6b|1.7b] [--seed 0] [--stops] [--no-vq-projection] [--force]

The talker's codec EOS row is zero unless ``--stops``: random weights then never end speech, so a
run makes exactly the frames asked for (``talker_max_new_tokens``), which benchmarks want.
``--no-vq-projection`` makes the codec encoder's quantizer as wide as its transformer
(``vector_quantization_hidden_dimension`` = ``codebook_dim`` = ``hidden_size``), so Mimi has no
``input_proj``/``output_proj``: a configuration upstream accepts. Release dimensions are from
public configs and Qwen3-TTS's code defaults, not checked against the released weights (the 1.7B
talker is 2048 wide; its code predictor stays 1024).

OUT_DIR must be new or empty, or hold just a tiny checkpoint a writer left there unchanged
(its .edgeomni-tiny.json record), which is replaced (exit 2 naming what is there otherwise): a
checkpoint's files have common names (config.json, model.safetensors) that would replace
yours. ``--force`` writes into a non-empty OUT_DIR all the same, replacing the files of those
names and leaving the others.
Exit status: 0 written; 2 bad arguments or an OUT_DIR it may not write; 1 a system error (a
full disk), in one line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from edgeomni.export.tiny import decoder_dims

SAMPLE_RATE, SAMPLES_PER_FRAME, GROUPS, CODEBOOK = 24000, 1920, 16, 2048
TALKER_VOCAB = 3072
CODEC_IDS = dict(codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150,
                 codec_think_id=2154, codec_nothink_id=2155, codec_think_bos_id=2156,
                 codec_think_eos_id=2157)  # fmt: skip
# english and chinese are public ids; the others are invented for random models (as in
# tests/qwen_tts_reference/make_reference.py)
LANGUAGES = {"english": 2050, "german": 2051, "chinese": 2055, "japanese": 2058,
             "beijing_dialect": 2074, "sichuan_dialect": 2062}  # fmt: skip
SPEAKERS = {"vivian": 3065, "serena": 3066, "uncle_fu": 3010, "dylan": 2878, "eric": 2875,
            "ryan": 3061, "aiden": 2861, "ono_anna": 2873, "sohee": 2864}  # fmt: skip
DIALECT = {"dylan": "beijing_dialect", "eric": "sichuan_dialect"}
GENERATION = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0,
              "top_k": 50, "subtalker_dosample": True, "subtalker_temperature": 0.9,
              "subtalker_top_p": 1.0, "subtalker_top_k": 50, "max_new_tokens": 8192}  # fmt: skip
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>",
            "<tts_text_eod>")  # fmt: skip
WORDS = ("assistant", "user", "Ġthe", "Ġis", "Ġa", "Hello", "Ġworld", "Ġtest")


SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        talker=decoder_dims(32, 2, 4, 2, 16, 64), predictor=decoder_dims(16, 2, 2, 1, 8, 32),
        text_hidden=32, text_vocab=None, mrope=[3, 3, 2],
        speaker=dict(enc_dim=32, enc_channels=[16, 16, 16, 16, 48], enc_attention_channels=8,
                     enc_res2net_scale=4, enc_se_channels=8),
        codec=dict(hidden_size=24, latent_dim=32, codebook_dim=16, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=8, intermediate_size=64, num_hidden_layers=2,
                   decoder_dim=48),
        mimi=dict(hidden_size=32, num_filters=4, codebook_dim=16,
                  vector_quantization_hidden_dimension=16, num_hidden_layers=1,
                  intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                  head_dim=16, upsample_groups=32),
    ),
    "0.6b": dict(
        talker=decoder_dims(1024, 28, 16, 8, 128, 3072),
        predictor=decoder_dims(1024, 5, 16, 8, 128, 3072),
        text_hidden=2048, text_vocab=151936, mrope=[24, 20, 20],
        speaker=dict(enc_dim=1024, enc_channels=[512, 512, 512, 512, 1536],
                     enc_attention_channels=128, enc_res2net_scale=8, enc_se_channels=128),
        codec=dict(hidden_size=512, latent_dim=1024, codebook_dim=512, num_attention_heads=16,
                   num_key_value_heads=16, head_dim=64, intermediate_size=1024,
                   num_hidden_layers=8, decoder_dim=1536),
        mimi=dict(hidden_size=512, num_filters=64, codebook_dim=256,
                  vector_quantization_hidden_dimension=256, num_hidden_layers=8,
                  intermediate_size=2048, num_attention_heads=8, num_key_value_heads=8,
                  head_dim=64, upsample_groups=512),
    ),
}  # fmt: skip
SIZES["1.7b"] = {
    **SIZES["0.6b"],
    "talker": decoder_dims(2048, 28, 16, 8, 128, 6144),
    "speaker": {**SIZES["0.6b"]["speaker"], "enc_dim": 2048},
}
TTS_SIZE = {"tiny": "0b6", "0.6b": "0b6", "1.7b": "1b7"}


# -- the tokenizer --------------------------------------------------------------------------------
def write_tokenizer(out_dir: Path) -> dict[str, int]:
    """A Qwen2 byte-level BPE (vocab.json, merges.txt, tokenizer_config.json): the 256 byte
    symbols, merges that make each of WORDS one token (upstream slices its prompt by position,
    so "assistant", "user" and "\\n" must be single tokens), then SPECIALS. Returns their ids."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2's byte symbols

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    merges = []
    for word in WORDS:
        cur = word[0]
        for ch in word[1:]:
            if cur + ch not in vocab:
                merges.append(f"{cur} {ch}")
                vocab[cur + ch] = len(vocab)
            cur += ch
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    ids = {tok: len(vocab) + i for i, tok in enumerate(SPECIALS)}
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for t, i in ids.items()}  # fmt: skip
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 32768, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }, indent=2))  # fmt: skip
    return ids


# -- configs ----------------------------------------------------------------------------------
def tts_config(kind: str, size: str, ids: dict[str, int], text_vocab: int) -> dict[str, Any]:
    dims = SIZES[size]
    speakers = SPEAKERS if kind == "custom_voice" else {}
    talker = dict(
        **dims["talker"], vocab_size=TALKER_VOCAB, hidden_act="silu", model_type="qwen3_tts_talker",
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        rope_scaling={"rope_type": "default", "mrope_section": dims["mrope"], "interleaved": True},
        attention_bias=False, use_sliding_window=False, sliding_window=None,
        num_code_groups=GROUPS, text_hidden_size=dims["text_hidden"], text_vocab_size=text_vocab,
        spk_id=dict(speakers), spk_is_dialect={s: DIALECT.get(s, False) for s in speakers},
        codec_language_id=dict(LANGUAGES), **CODEC_IDS,
        code_predictor_config=dict(
            **dims["predictor"], vocab_size=CODEBOOK, hidden_act="silu", rms_norm_eps=1e-6,
            rope_theta=1000000.0, max_position_embeddings=65536, num_code_groups=GROUPS,
            attention_bias=False, use_sliding_window=False, sliding_window=None,
            layer_types=["full_attention"] * dims["predictor"]["num_hidden_layers"],
            model_type="qwen3_tts_talker_code_predictor",
        ),
    )  # fmt: skip
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": TTS_SIZE[size],
        "tts_model_type": kind, "im_start_token_id": ids["<|im_start|>"],
        "im_end_token_id": ids["<|im_end|>"], "tts_pad_token_id": ids["<tts_pad>"],
        "tts_bos_token_id": ids["<tts_text_bos>"], "tts_eos_token_id": ids["<tts_text_eod>"],
        "talker_config": talker,
        "speaker_encoder_config": dict(
            **dims["speaker"], mel_dim=128, enc_kernel_sizes=[5, 3, 3, 3, 1],
            enc_dilations=[1, 2, 3, 4, 1], sample_rate=SAMPLE_RATE,
        ),
    }  # fmt: skip


def codec_config(size: str) -> dict[str, Any]:
    """speech_tokenizer/config.json as qwen-tts 0.1.1 saves it (transformers 4.57.3's keys)."""
    dims = SIZES[size]
    encoder = dict(
        **dims["mimi"], _frame_rate=12.5, attention_bias=False, attention_dropout=0.0,
        audio_channels=1, codebook_size=CODEBOOK, compress=2, dilation_growth_rate=2,
        hidden_act="gelu", initializer_range=0.02, kernel_size=7, last_kernel_size=3,
        layer_scale_initial_scale=0.01, max_position_embeddings=8000, model_type="mimi",
        norm_eps=1e-5, num_quantizers=32, num_residual_layers=1, num_semantic_quantizers=1,
        pad_mode="constant", residual_kernel_size=3, rope_theta=10000.0,
        sampling_rate=SAMPLE_RATE, sliding_window=250, trim_right_ratio=1.0,
        upsampling_ratios=[8, 6, 5, 4], use_cache=False, use_causal_conv=True,
        use_conv_shortcut=False, use_streaming=False,
    )  # fmt: skip
    decoder = dict(
        **dims["codec"], attention_bias=False, attention_dropout=0.0, codebook_size=CODEBOOK,
        hidden_act="silu", layer_scale_initial_scale=0.01, max_position_embeddings=8000,
        num_quantizers=GROUPS, rms_norm_eps=1e-5, rope_theta=10000, sliding_window=72,
        upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2],
    )  # fmt: skip
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_config": encoder, "decoder_config": decoder,
        "encoder_valid_num_quantizers": GROUPS, "input_sample_rate": SAMPLE_RATE,
        "output_sample_rate": SAMPLE_RATE, "decode_upsample_rate": SAMPLES_PER_FRAME,
        "encode_downsample_rate": SAMPLES_PER_FRAME,
    }  # fmt: skip


# -- weights -------------------------------------------------------------------------------------
def _decoder_shapes(prefix: str, d: dict[str, int]) -> dict[str, tuple[int, ...]]:
    h, hd, n, kv, inter = (d["hidden_size"], d["head_dim"], d["num_attention_heads"],
                           d["num_key_value_heads"], d["intermediate_size"])  # fmt: skip
    out: dict[str, tuple[int, ...]] = {f"{prefix}model.norm.weight": (h,)}
    for i in range(d["num_hidden_layers"]):
        p = f"{prefix}model.layers.{i}."
        if d.get("attention_bias"):
            out.update({p + "self_attn.q_proj.bias": (n * hd,), p + "self_attn.k_proj.bias": (kv * hd,),
                        p + "self_attn.v_proj.bias": (kv * hd,), p + "self_attn.o_proj.bias": (h,)})  # fmt: skip
        out.update({
            p + "self_attn.q_proj.weight": (n * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
            p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, n * hd),
            p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter), p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        })  # fmt: skip
    return out


def talker_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every ``talker.*`` tensor of Qwen3TTSForConditionalGeneration, by upstream's names."""
    tk = cfg["talker_config"]
    cp = tk["code_predictor_config"]
    h, text_h, cp_h = tk["hidden_size"], tk["text_hidden_size"], cp["hidden_size"]
    out = _decoder_shapes("talker.", tk)
    out.update(_decoder_shapes("talker.code_predictor.", cp))
    out.update({
        "talker.model.codec_embedding.weight": (tk["vocab_size"], h),
        "talker.model.text_embedding.weight": (tk["text_vocab_size"], text_h),
        "talker.text_projection.linear_fc1.weight": (text_h, text_h),
        "talker.text_projection.linear_fc1.bias": (text_h,),
        "talker.text_projection.linear_fc2.weight": (h, text_h),
        "talker.text_projection.linear_fc2.bias": (h,),
        "talker.codec_head.weight": (tk["vocab_size"], h),
    })  # fmt: skip
    for i in range(GROUPS - 1):
        out[f"talker.code_predictor.model.codec_embedding.{i}.weight"] = (CODEBOOK, h)
        out[f"talker.code_predictor.lm_head.{i}.weight"] = (CODEBOOK, cp_h)
    if cp_h != h:
        out["talker.code_predictor.small_to_mtp_projection.weight"] = (cp_h, h)
        out["talker.code_predictor.small_to_mtp_projection.bias"] = (cp_h,)
    return out


def _draw(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Matrices N(0, 1/fan_in), embeddings and codebooks N(0, 1), norms and gains 1 +- 0.1,
    biases and SnakeBeta's log-parameters N(0, 0.1), a codebook's usage 1."""

    def normal(mean: float, std: float) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * std + mean

    last = name.rsplit(".", 1)[-1]
    if last == "cluster_usage":
        return torch.ones(shape)
    if "embed" in name and len(shape) == 2 or last in ("embedding_sum", "embed_sum"):
        return normal(0.0, 1.0)
    if last == "bias" or last in ("alpha", "beta"):
        return normal(0.0, 0.1)
    if len(shape) == 1:
        return normal(1.0, 0.1)
    fan_in = math.prod(shape[1:])
    if "conv_t" in name or "ConvTranspose" in name:
        fan_in = shape[0] * shape[2] / 2
    return normal(0.0, 1.0 / math.sqrt(fan_in))


def _module_tensors(module: torch.nn.Module, prefix: str, gen: torch.Generator) -> dict:
    """Random tensors for every parameter and persistent buffer of one of edgeomni's modules
    (which carry upstream's names), by the rules of ``_draw``."""
    out = {}
    for name, value in module.state_dict().items():
        if not value.is_floating_point():
            out[prefix + name] = value.clone()
            continue
        out[prefix + name] = _draw(name, tuple(value.shape), gen).to(value.dtype)
    return out


# where make_checkpoint's ``overrides`` go: a section of config.json or of the codec's
OVERRIDES = {
    "talker_config": ("config", "talker_config"),
    "code_predictor_config": ("config", "talker_config", "code_predictor_config"),
    "speaker_encoder_config": ("config", "speaker_encoder_config"),
    "speech_tokenizer": ("codec",),
    "encoder_config": ("codec", "encoder_config"),
    "decoder_config": ("codec", "decoder_config"),
}


def no_vq_projection(size: str = "tiny") -> dict[str, dict[str, Any]]:
    """Overrides that make the codec encoder's quantizer its transformer's width: Mimi then has
    no input_proj / output_proj (transformers and upstream take it as identity)."""
    width = SIZES[size]["mimi"]["hidden_size"]
    dims = {"vector_quantization_hidden_dimension": width, "codebook_dim": width}
    return {"encoder_config": dims}


REMOVE = "<remove>"  # an override's value that takes the key out (upstream's default applies)


def _override(cfg: dict[str, Any], codec: dict[str, Any], overrides: dict[str, dict]) -> None:
    """Update the configs' sections in place (a value of REMOVE takes the key out)."""
    for name, fields in overrides.items():
        if name not in OVERRIDES:
            raise ValueError(f"overrides: unknown section {name!r}; one of {', '.join(OVERRIDES)}")
        root, *path = OVERRIDES[name]
        target = cfg if root == "config" else codec
        for key in path:
            target = target[key]
        for key, value in fields.items():
            if value == REMOVE:
                target.pop(key, None)
            else:
                target[key] = value


def make_checkpoint(
    out_dir: Path, kind: str = "custom_voice", size: str = "tiny", *, seed: int = 0,
    stops: bool = False, overrides: dict[str, dict[str, Any]] | None = None,
) -> Path:  # fmt: skip
    """Write a random Qwen3-TTS checkpoint of ``kind`` (custom_voice, base, voice_design) at
    ``size`` (tiny, 0.6b, 1.7b) into ``out_dir``; returns it. ``overrides`` sets keys of a
    config section (OVERRIDES), for configurations upstream accepts that the defaults do not
    show; the random weights follow them (edgeomni's modules, built from the same configs)."""
    from safetensors.torch import save_file

    from edgeomni.export.families.qwen3_tts.speaker_encoder import Qwen3TTSSpeakerEncoder

    if kind not in ("custom_voice", "base", "voice_design"):
        raise ValueError(f"kind must be custom_voice, base or voice_design, got {kind!r}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    out_dir = Path(out_dir)
    (out_dir / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    ids = write_tokenizer(out_dir)
    text_vocab = SIZES[size]["text_vocab"] or len(
        json.loads((out_dir / "vocab.json").read_text())
    ) + len(SPECIALS)
    cfg = tts_config(kind, size, ids, text_vocab)
    codec = codec_config(size)
    _override(cfg, codec, overrides or {})
    tensors = {name: _draw(name, shape, gen) for name, shape in talker_shapes(cfg).items()}
    if not stops:  # random logits never end speech: exactly the frames asked for
        tensors["talker.codec_head.weight"][CODEC_IDS["codec_eos_token_id"]] = 0.0
    if kind == "base":
        with torch.device("meta"):
            shapes = Qwen3TTSSpeakerEncoder(cfg["speaker_encoder_config"]).state_dict()
        for name, value in shapes.items():
            tensors["speaker_encoder." + name] = _draw(name, tuple(value.shape), gen)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (out_dir / "generation_config.json").write_text(json.dumps(GENERATION, indent=2) + "\n")
    (out_dir / "preprocessor_config.json").write_text('{"processor_class": "Qwen3TTSProcessor"}\n')
    write_speech_tokenizer(out_dir / "speech_tokenizer", codec, gen)
    return out_dir


def write_speech_tokenizer(folder: Path, codec: dict[str, Any], gen: torch.Generator) -> Path:
    """A ``speech_tokenizer/`` folder of the codec config ``codec`` (codec_config's, maybe
    changed) with random weights; returns it."""
    from safetensors.torch import save_file

    from edgeomni.export.families.qwen3_tts.code2wav import Qwen3TTSCode2Wav
    from edgeomni.export.families.qwen3_tts.speech_encoder import Qwen3TTSSpeechEncoder

    folder.mkdir(parents=True, exist_ok=True)
    codec_tensors = _codec_tensors(codec, gen, Qwen3TTSCode2Wav, Qwen3TTSSpeechEncoder)
    save_file(codec_tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(codec, indent=2) + "\n")
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor",
        "feature_size": 1, "overlap": None, "padding_side": "right", "padding_value": 0.0,
        "return_attention_mask": True, "sampling_rate": SAMPLE_RATE}, indent=2))  # fmt: skip
    (folder / "configuration.json").write_text(
        '{"framework": "pytorch", "task": "feature-extraction"}'
    )
    return folder


def _codec_tensors(codec: dict[str, Any], gen: torch.Generator, decoder_cls: Any,
                   encoder_cls: Any) -> dict[str, torch.Tensor]:  # fmt: skip
    """The 12 Hz codec: the decoder (its output scaled so random codes give audio of std ~0.1,
    inside the ±1 clamp) and the encoder with all 32 quantizers (edgeomni reads 16)."""
    decoder = decoder_cls(codec["decoder_config"])
    tensors = _module_tensors(decoder, "", gen)
    with torch.no_grad():
        decoder.load_state_dict(tensors)
        last = decoder.decoder[-1].conv
        seen: list[torch.Tensor] = []
        hook = last.register_forward_hook(lambda _m, _i, out: seen.append(out))
        try:
            decoder(torch.randint(0, CODEBOOK, (1, GROUPS, 8), generator=gen))
        finally:
            hook.remove()
        scale = 0.1 / max(seen[0].std().item(), 1e-6)
    out = {"decoder." + k: v for k, v in tensors.items()}
    for k in ("weight", "bias"):
        name = next(
            n
            for n in decoder.state_dict()
            if n.endswith(f"decoder.{len(decoder.decoder) - 1}.conv.{k}")
        )
        out["decoder." + name] = tensors[name] * scale
    for group in ("rvq_first", "rvq_rest"):  # the encoder side of the decoder's quantizer
        dim = codec["decoder_config"]["codebook_dim"] // 2
        width = codec["decoder_config"]["codebook_dim"]
        out[f"decoder.quantizer.{group}.input_proj.weight"] = _draw("w", (dim, width, 1), gen)
    with torch.device("meta"):
        encoder = encoder_cls(codec)
    enc = {}
    for name, value in encoder.state_dict().items():
        enc[name] = _draw(name, tuple(value.shape), gen)
    # the acoustic codebooks past the 16 edgeomni keeps, as upstream's 32-quantizer RVQ has them
    mimi = encoder.quantizer  # its config's counts, with upstream's defaults
    acoustic = "quantizer.acoustic_residual_vector_quantizer.layers."
    kept = {n for n in enc if n.startswith(acoustic)}
    first = sorted({int(n[len(acoustic) :].split(".")[0]) for n in kept})
    total = codec["encoder_config"].get("num_quantizers", 32) - mimi.num_semantic_quantizers
    for i in range(len(first), total):
        for n in [n for n in kept if n.startswith(f"{acoustic}0.")]:
            enc[f"{acoustic}{i}." + n[len(f"{acoustic}0.") :]] = _draw(n, tuple(enc[n].shape), gen)
    proj = mimi.semantic_residual_vector_quantizer.input_proj  # None: no projection either way
    for group in ("semantic", "acoustic") if proj is not None else ():
        dim, hidden = proj.out_channels, proj.in_channels
        enc[f"quantizer.{group}_residual_vector_quantizer.output_proj.weight"] = _draw(
            "w", (hidden, dim, 1), gen
        )
    out.update({"encoder." + k: v for k, v in enc.items()})
    return {k: v.contiguous() for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    from edgeomni.export.tiny import FORCE_HELP, Parser, write_checkpoint

    prog = "python -m edgeomni.export.tiny_tts"
    p = Parser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", type=Path)
    p.add_argument(
        "--kind", default="custom_voice", choices=["custom_voice", "base", "voice_design"]
    )
    p.add_argument("--size", default="tiny", choices=sorted(SIZES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stops", action="store_true", help="keep the codec EOS row random")
    p.add_argument(
        "--no-vq-projection", action="store_true",
        help="a codec encoder whose quantizer is its transformer's width (no Mimi input_proj / "
        "output_proj)",
    )  # fmt: skip
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    args = p.parse_args(argv)
    overrides = no_vq_projection(args.size) if args.no_vq_projection else None
    code = write_checkpoint(prog, args.out_dir, args.force, lambda: make_checkpoint(
        args.out_dir, args.kind, args.size, seed=args.seed, stops=args.stops, overrides=overrides
    ))  # fmt: skip
    if code == 0:
        print(f"wrote a random {args.size} Qwen3-TTS {args.kind} checkpoint to {args.out_dir}")
    return code


if __name__ == "__main__":
    sys.exit(main())
