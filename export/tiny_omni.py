"""A tiny random Qwen3-Omni checkpoint (thinker, talker, code predictor, code2wav, encoders).

No hub: the model comes from transformers' config classes (``save_pretrained``), the tokenizer is
a byte-level BPE trained here, and the processor files are written as ``Qwen3OmniMoeProcessor``
would save them. Weights are redrawn so that parity tests can fail: under transformers' default
init (std 0.02, zero routers, constant SnakeBeta and layer scales) the talker repeats one code
frame for every prompt and code2wav's audio barely depends on the codes.

    python -m edgeomni.export.tiny qwen3_omni_moe OUT_DIR
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from edgeomni.export.tiny import CORPUS as TEXT_CORPUS
from edgeomni.export.tiny import decoder_dims

# Special tokens, appended after the BPE vocabulary (ids at the top, as in the real tokenizer).
SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<|tts_pad|>",
    "<|tts_bos|>",
    "<|tts_eos|>",
    "<|audio_pad|>",
)
ROLE_WORDS = ("system", "user", "assistant")
# Attribute names the processor reads from the tokenizer (tokenizer.image_token, ..._id).
TOKENIZER_MM_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "audio_token": "<|audio_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}

# Qwen3-Omni-style ChatML: string content as is; list content with audio/image/video parts that
# become <|audio_start|><|audio_pad|><|audio_end|> and <|vision_start|><|image_pad|><|vision_end|>.
# The processor then repeats each single pad to the encoder's token count.
# a chat template's end after a message's media parts: its text parts, the turn's end, the reply
TEMPLATE_END = (
    "{%- elif part['type'] == 'text' %}{{- part['text'] }}"
    "{%- endif %}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'audio' or 'audio' in part or 'audio_url' in part %}"
    "{{- '<|audio_start|><|audio_pad|><|audio_end|>' }}"
    "{%- elif part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' or 'video' in part %}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    + TEMPLATE_END
)

CORPUS = [
    *TEXT_CORPUS[:6],
    "Please describe the picture: a red square on a blue background.",
    "Listen to this sound and tell me what you hear.",
    "The talker speaks the answer while the thinker writes it.",
    "A vocoder turns discrete codes into a waveform at twenty four kilohertz.",
    "Images are cut into patches; audio is cut into mel frames.",
    "Good morning, good evening, good night, see you tomorrow.",
    "Which is larger, the moon or the sun? The sun is much larger.",
    "Write a short poem about rain falling on a quiet city street.",
    "Summarize the meeting notes in three sentences, please.",
    "Translate this sentence into French, German and Spanish.",
    "Music, voices, birds, traffic and wind are all kinds of sound.",
    "The weather will be sunny with a light breeze in the afternoon.",
    "Count from one to ten: one two three four five six seven eight nine ten.",
    "Every answer should be short, clear, friendly and correct.",
]

# Thinker text vocabulary = tokenizer size (every generated id decodes).
THINKER_VOCAB = 512
# Codec layout as in the real talker (codebook 2048, vocab 3072, specials in the top band at
# 2048 + 100.., speakers at 2048 + 253..), shifted down to a 64-entry codebook.
CODEBOOK = 64
TALKER_VOCAB = CODEBOOK + 1024
CODEC_IDS = {
    "codec_pad_id": CODEBOOK + 100,
    "codec_bos_id": CODEBOOK + 101,
    "codec_eos_token_id": CODEBOOK + 102,
    "codec_nothink_id": CODEBOOK + 107,
    "codec_think_bos_id": CODEBOOK + 108,
    "codec_think_eos_id": CODEBOOK + 109,
}
SPEAKERS = {"chelsie": CODEBOOK + 253, "ethan": CODEBOOK + 254}
NUM_CODE_GROUPS = 16
# the thinker's and talker's interleaved 3-axis rope
MROPE = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 2, 2],
         "interleaved": True, "mrope_interleaved": True}  # fmt: skip
EOS_ROW_SCALE = 0.75
PATCH, MERGE, TEMPORAL_PATCH = 16, 2, 2
IMAGE_MEAN = IMAGE_STD = [0.5, 0.5, 0.5]
MIN_PIXELS, MAX_PIXELS = 32 * 32 * 4, 32 * 32 * 64


def make_omni_tokenizer(
    out_dir: Path,
    vocab_size: int = THINKER_VOCAB,
    *,
    specials: tuple[str, ...] = SPECIALS,
    mm_tokens: dict[str, str] | None = None,
    chat_template: str = CHAT_TEMPLATE,
    plain: tuple[str, ...] = (),
) -> Any:
    """Byte-level BPE of exactly ``vocab_size`` ids: BPE first, the specials appended last
    (Qwen3-Omni's 13 by default; ``mm_tokens``: the attributes the processor reads, default
    Qwen3-Omni's; a family's tiny maker passes its own specials, attributes and template), then
    ``plain`` added tokens that decode as text (Qwen3-ASR's ``<asr_text>``).

    The role words are trained in as whole tokens (as in Qwen's vocabulary) so that
    ``<|im_start|>user`` gives one id for ``user``; the config's user/assistant/system ids rely on it.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    bpe = vocab_size - len(specials) - len(plain)
    trainer = trainers.BpeTrainer(
        vocab_size=bpe,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(ROLE_WORDS) * 64 + CORPUS * 4, trainer=trainer)
    if tok.get_vocab_size() != bpe:
        raise RuntimeError(f"BPE reached {tok.get_vocab_size()} ids, wanted {vocab_size}")
    tok.add_special_tokens(list(specials))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in plain])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=TOKENIZER_MM_TOKENS if mm_tokens is None else mm_tokens,
    )
    hf.chat_template = chat_template
    if len(hf) != vocab_size:
        raise RuntimeError(f"tokenizer has {len(hf)} ids, wanted {vocab_size}")
    for word in ROLE_WORDS:
        if len(hf.encode(word, add_special_tokens=False)) != 1:
            raise RuntimeError(f"{word!r} is not a single token")
    hf.save_pretrained(out_dir)
    return hf


def tiny_vision_config() -> dict[str, Any]:
    """The tiny ViT (Qwen3-Omni's and Qwen3-VL's): d32 x 2 layers, a DeepStack tap after each,
    out 64 (the tiny LLMs' hidden size), a 16 x 16 position grid."""
    return dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=4,
        in_channels=3,
        patch_size=PATCH,
        spatial_merge_size=MERGE,
        temporal_patch_size=TEMPORAL_PATCH,
        out_hidden_size=64,
        num_position_embeddings=256,
        deepstack_visual_indexes=[0, 1],
    )


def vision_processor_settings(
    min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> dict[str, Any]:
    """What the tiny checkpoints' image and video processors share, as they save it."""
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
        "merge_size": MERGE,
        "patch_size": PATCH,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": max_pixels, "shortest_edge": min_pixels},
        "temporal_patch_size": TEMPORAL_PATCH,
    }


def processor_config() -> dict[str, Any]:
    """``processor_config.json`` exactly as ``Qwen3OmniMoeProcessor.save_pretrained`` writes it.

    Written by hand because the image and video processors need Pillow/torchvision to be
    constructed, which this project does not depend on; the file loads where they exist.
    """
    vision = vision_processor_settings()
    return {
        "feature_extractor": {
            "chunk_length": 30,
            "dither": 0.0,
            "feature_extractor_type": "WhisperFeatureExtractor",
            "feature_size": 128,
            "hop_length": 160,
            "n_fft": 400,
            "n_samples": 480000,
            "nb_max_frames": 3000,
            "padding_side": "right",
            "padding_value": 0.0,
            "return_attention_mask": True,
            "sampling_rate": 16000,
        },
        "image_processor": {**vision, "image_processor_type": "Qwen2VLImageProcessor"},
        "processor_class": "Qwen3OmniMoeProcessor",
        "video_processor": {
            **vision,
            "do_sample_frames": False,
            "max_frames": 768,
            "max_video_tokens": 128000,
            "min_frames": 4,
            "return_metadata": False,
            "video_processor_type": "Qwen2VLVideoProcessor",
        },
    }


def omni_config(ids: dict[str, int]) -> Any:
    """The tiny ``Qwen3OmniMoeConfig``; ``ids`` holds the tokenizer's special-token ids.

    Sets every field whose class default breaks ``generate`` (see shared/notes/families.md §2):
    talker ``spatial_merge_size`` and ``shared_expert_intermediate_size``, thinker
    ``vision_start_token_id``, codec ids in the talker's top band, matching group counts.
    """
    from transformers import Qwen3OmniMoeConfig

    mm_ids = dict(
        audio_token_id=ids["<|audio_pad|>"],
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        audio_start_token_id=ids["<|audio_start|>"],
        vision_start_token_id=ids["<|vision_start|>"],
    )
    text_config = dict(
        vocab_size=THINKER_VOCAB,
        **decoder_dims(64, 4, 4, 2, 16, 128),
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=2048,
        rope_parameters=dict(MROPE),  # mrope_section sums to head_dim / 2
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )
    audio_config = dict(
        num_mel_bins=128,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=64,
        d_model=32,
        output_dim=64,  # = thinker hidden
        downsample_hidden_size=16,
        max_source_positions=1500,
        n_window=50,
        n_window_infer=800,
        conv_chunksize=500,
    )
    vision_config = tiny_vision_config()
    thinker_config = dict(
        text_config=text_config,
        audio_config=audio_config,
        vision_config=vision_config,
        user_token_id=ids["user"],
        position_id_per_seconds=13,
        **mm_ids,
    )
    talker_text = dict(
        vocab_size=TALKER_VOCAB,
        **decoder_dims(32, 2, 4, 2, 16, 64),
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=4096,
        rope_parameters=dict(MROPE),
    )
    code_predictor = dict(
        vocab_size=CODEBOOK,
        **decoder_dims(32, 2, 4, 2, 16, 64),
        max_position_embeddings=64,
        num_code_groups=NUM_CODE_GROUPS,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    talker_config = dict(
        text_config=talker_text,
        code_predictor_config=code_predictor,
        num_code_groups=NUM_CODE_GROUPS,
        thinker_hidden_size=64,
        accept_hidden_layer=2,  # <= thinker layers; hidden_states[0] is the embeddings
        speaker_id=dict(SPEAKERS),
        spatial_merge_size=MERGE,
        position_id_per_seconds=13,
        **CODEC_IDS,
        **mm_ids,
    )
    code2wav_config = dict(
        codebook_size=CODEBOOK,  # = code predictor vocab
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=64,
        num_hidden_layers=2,
        sliding_window=8,
        num_quantizers=NUM_CODE_GROUPS,
        decoder_dim=64,
        upsample_rates=[8, 5, 4, 3],  # with upsampling_ratios: 1920 samples per frame
        upsampling_ratios=[2, 2],
        max_position_embeddings=8000,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    return Qwen3OmniMoeConfig(
        thinker_config=thinker_config,
        talker_config=talker_config,
        code2wav_config=code2wav_config,
        enable_audio_output=True,
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<|tts_pad|>"],
        tts_bos_token_id=ids["<|tts_bos|>"],
        tts_eos_token_id=ids["<|tts_eos|>"],
        system_token_id=ids["system"],
        user_token_id=ids["user"],
        assistant_token_id=ids["assistant"],
    )


def redraw_parameters(model: Any, generator: Any, gain_std: float = 0.1) -> None:
    """Redraw every parameter so each path matters: matrices N(0, 1/fan_in), embeddings N(0, 1),
    gains (norms, layer scales) N(1, ``gain_std``), biases and SnakeBeta log-parameters
    N(0, 0.1). Any parameter no rule covers raises, so a new transformers module cannot
    silently keep its HF init."""
    import torch
    from torch import nn

    def normal(p: torch.Tensor, mean: float, std: float) -> None:
        p.copy_(torch.randn(p.shape, generator=generator) * std + mean)

    with torch.no_grad():
        for mod_name, module in model.named_modules():
            for name, p in module.named_parameters(recurse=False):
                kind = type(module).__name__
                if isinstance(module, nn.Embedding):
                    normal(p, 0.0, 1.0)
                elif name == "bias":
                    normal(p, 0.0, 0.1)
                elif isinstance(module, nn.ConvTranspose1d):
                    # weight [in, out, k]; each output sample sees in * k / stride inputs
                    fan_in = p.shape[0] * p.shape[2] / module.stride[0]
                    normal(p, 0.0, 1 / math.sqrt(fan_in))
                elif p.ndim >= 2:
                    # Linear/Conv weight [out, in/groups, *k]; 3-D expert banks [E, out, in];
                    # routers [E, hidden]
                    fan_in = p.shape[-1] if p.ndim == 3 and "Experts" in kind else p[0].numel()
                    normal(p, 0.0, 1 / math.sqrt(fan_in))
                elif "SnakeBeta" in kind:
                    normal(p, 0.0, 0.1)  # alpha/beta are log-scale
                elif "Norm" in kind or "LayerScale" in kind or name == "gamma":
                    normal(p, 1.0, gain_std)  # norm weights, layer scales, ConvNeXt gammas
                else:
                    raise RuntimeError(f"no rule for {mod_name}.{name} ({kind}, {tuple(p.shape)})")


def randomize_weights(model: Any, generator: Any, never_generated: list[int]) -> None:
    """``redraw_parameters``, then what Qwen3-Omni's paths need: the routers become non-zero (HF
    inits the talker's to zeros); code2wav is calibrated so its audio stays inside the ±1 clamp
    (see ``calibrate_code2wav``)."""
    import torch

    redraw_parameters(model, generator)
    with torch.no_grad():
        calibrate_code2wav(model.code2wav, generator)
        # A random talker picks codec EOS about as often as any code and stopped after 4 frames on
        # some prompts; a shorter EOS row keeps EOS reachable but makes most replies run for tens
        # of frames.
        eos = model.config.talker_config.codec_eos_token_id
        model.talker.codec_head.weight[eos].mul_(EOS_ROW_SCALE)
        # Placeholder and control tokens (<|audio_pad|>, <|tts_bos|>, <|im_start|>, ...) are never
        # generated by a trained thinker; near-zero lm_head rows keep a random one from emitting
        # them (<|im_end|> stays reachable).
        for token_id in never_generated:
            model.thinker.lm_head.weight[token_id].mul_(0.05)


def calibrate_code2wav(code2wav: Any, generator: Any, target_std: float = 0.1) -> None:
    """Keep code2wav's audio inside its ±1 clamp while it still depends on the codes.

    Each decoder residual unit's last conv is scaled by 0.3 (otherwise three residual units per
    block triple the amplitude at every one of the four blocks), then the final conv is scaled so
    random codes give an output std of ``target_std`` (peak about 0.5).
    """
    import torch

    for name, p in code2wav.decoder.named_parameters():
        if ".conv2.conv." in name:
            p.mul_(0.3)
    last = code2wav.decoder[-1].conv
    seen: list[torch.Tensor] = []
    hook = last.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        cfg = code2wav.config
        codes = torch.randint(
            0, cfg.codebook_size, (2, cfg.num_quantizers, 40), generator=generator
        )
        code2wav(codes)
    finally:
        hook.remove()
    scale = target_std / seen[0].std().item()
    last.weight.mul_(scale)
    last.bias.mul_(scale)


SECTIONS = {
    "thinker": ("thinker_config", "text_config"),
    "audio": ("thinker_config", "audio_config"),
    "vision": ("thinker_config", "vision_config"),
    "talker": ("talker_config", "text_config"),
    "talker_top": ("talker_config",),
    "code_predictor": ("talker_config", "code_predictor_config"),
    "code2wav": ("code2wav_config",),
}


def make_qwen3_omni(
    out_dir: Path, *, seed: int = 0, sizes: dict[str, dict[str, Any]] | None = None
) -> Path:
    """Write a tiny random Qwen3-Omni (config, weights, generation config, tokenizer, processor).

    Thinker H64 x4 layers (4 experts, top-2), audio d32 x2, vision d32 x2, talker H32 x2 with a
    shared expert, code predictor H32 x2 with 16 code groups, code2wav H32 x2 (1920 samples/frame).
    ``sizes`` overrides config fields per section (keys of SECTIONS), e.g. for benchmarks at
    larger dimensions; keeping the sections consistent (hidden sizes that feed each other,
    mrope_section summing to head_dim / 2) is the caller's job.
    """
    import torch
    from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = make_omni_tokenizer(out_dir)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    ids.update({w: tok.encode(w, add_special_tokens=False)[0] for w in ROLE_WORDS})
    config = omni_config(ids)
    for name, fields in (sizes or {}).items():
        target = config
        for attr in SECTIONS[name]:
            target = getattr(target, attr)
        for key, value in fields.items():
            setattr(target, key, value)

    # HF's init is overwritten parameter by parameter, so only this generator sets the weights.
    model = Qwen3OmniMoeForConditionalGeneration(config).eval()
    quiet = [ids[t] for t in SPECIALS if t != "<|im_end|>"]
    randomize_weights(model, torch.Generator().manual_seed(seed), never_generated=quiet)
    model.generation_config = GenerationConfig(
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], do_sample=False
    )
    model.save_pretrained(out_dir)
    (out_dir / "processor_config.json").write_text(
        json.dumps(processor_config(), indent=2, sort_keys=True) + "\n"
    )
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return out_dir
