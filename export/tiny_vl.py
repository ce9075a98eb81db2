"""A tiny random Qwen3-VL checkpoint (the LLM with DeepStack inputs and its ViT).

No hub: the model comes from transformers' config classes (``save_pretrained``), the tokenizer is
a byte-level BPE trained here (tiny_omni's, with Qwen3-VL's special tokens), and the processor
files are written as the release ships them: ``preprocessor_config.json`` (the image processor),
``video_preprocessor_config.json`` (Qwen3VLVideoProcessor) and the chat template. Weights are
redrawn (tiny_omni.redraw_parameters) so that parity tests can fail, the norms' gains widely
(``NORM_GAIN_STD``) so that where each patch sits in an image moves the reply.

    python -m edgeomni.export.tiny qwen3_vl OUT_DIR
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgeomni.export.tiny import decoder_dims
from edgeomni.export.tiny_omni import (
    MAX_PIXELS,
    ROLE_WORDS,
    TEMPLATE_END,
    make_omni_tokenizer,
    redraw_parameters,
    tiny_vision_config,
    vision_processor_settings,
)
from edgeomni.export.tiny_omni import SPECIALS as OMNI_SPECIALS

# Qwen's text and vision special tokens: tiny_omni's first seven (no audio or speech ones)
SPECIALS = OMNI_SPECIALS[:7]
# the attributes Qwen3VLProcessor reads from the tokenizer (tokenizer.image_token, ...)
TOKENIZER_MM_TOKENS = {
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "vision_start_token": "<|vision_start|>",
    "vision_end_token": "<|vision_end|>",
}
# Qwen3-VL's ChatML: string content as is; image and video parts become
# <|vision_start|><|image_pad|><|vision_end|> (and <|video_pad|>), "Picture n: " before each
# with add_vision_id. The processor then expands each pad: an image to its merged patches, a
# video to one "<t seconds><|vision_start|>pads<|vision_end|>" group per frame pair.
CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) %}"
    "{%- set video_count = namespace(value=0) %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{%- set image_count.value = image_count.value + 1 %}"
    "{%- if add_vision_id %}{{- 'Picture ' ~ image_count.value ~ ': ' }}{%- endif %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' or 'video' in part %}"
    "{%- set video_count.value = video_count.value + 1 %}"
    "{%- if add_vision_id %}{{- 'Video ' ~ video_count.value ~ ': ' }}{%- endif %}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    + TEMPLATE_END
)
VOCAB = 512
# the spread of the norms' gains around 1: at tiny_omni's 0.1 the ViT's features and their
# positions move the tiny LLM's reply so little that a runtime with a tall image's rotary axes
# swapped, or one attention block over several images, could still give transformers' tokens
NORM_GAIN_STD = 1.0
# images of 64x64 to 256x256 pixels (tiny_omni's); videos up to 8 frames of that (t * h * w)
VIDEO_MAX_PIXELS = MAX_PIXELS * 8


def image_processor_config() -> dict[str, Any]:
    """``preprocessor_config.json`` as the release ships it (Qwen2-VL's image processor)."""
    return {**vision_processor_settings(), "image_processor_type": "Qwen2VLImageProcessor",
            "processor_class": "Qwen3VLProcessor"}  # fmt: skip


def video_processor_config() -> dict[str, Any]:
    """``video_preprocessor_config.json`` as the release ships it (Qwen3VLVideoProcessor: 2
    frames a second sampled, 4 to 768 of them)."""
    return {
        **vision_processor_settings(max_pixels=VIDEO_MAX_PIXELS),
        "do_sample_frames": True,
        "fps": 2,
        "max_frames": 768,
        "min_frames": 4,
        "processor_class": "Qwen3VLProcessor",
        "return_metadata": False,
        "video_processor_type": "Qwen3VLVideoProcessor",
    }


def vl_config(ids: dict[str, int], **text: Any) -> Any:
    """The tiny ``Qwen3VLConfig``: LLM H64 x4 layers (interleaved MRoPE [4, 2, 2]), ViT d32 x2
    with a DeepStack tap after each layer; ``text`` overrides text_config fields."""
    from transformers import Qwen3VLConfig

    tiny = dict(
        vocab_size=VOCAB,
        **decoder_dims(64, 4, 4, 2, 16, 128),
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                         "mrope_section": [4, 2, 2], "mrope_interleaved": True},
        pad_token_id=ids["<|endoftext|>"],
    )  # fmt: skip
    text_config = {**tiny, **text}  # an override replaces the tiny value (dict(**) would raise)
    return Qwen3VLConfig(
        text_config=text_config,
        vision_config=tiny_vision_config(),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def make_qwen3_vl(out_dir: Path, *, seed: int = 0, **text: Any) -> Path:
    """Write a tiny random Qwen3-VL (config, weights, generation config, tokenizer, chat
    template, image and video processor configs); ``text`` overrides text_config fields (for
    benchmarks at larger dimensions: keep mrope_section summing to head_dim / 2)."""
    import torch
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = make_omni_tokenizer(out_dir, VOCAB, specials=SPECIALS, mm_tokens=TOKENIZER_MM_TOKENS,
                              chat_template=CHAT_TEMPLATE)  # fmt: skip
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    ids.update({w: tok.encode(w, add_special_tokens=False)[0] for w in ROLE_WORDS})
    model = Qwen3VLForConditionalGeneration(vl_config(ids, **text)).eval()
    redraw_parameters(model, torch.Generator().manual_seed(seed), gain_std=NORM_GAIN_STD)
    with torch.no_grad():
        # placeholder and control tokens are never generated by a trained model; near-zero
        # lm_head rows keep a random one from emitting them (<|im_end|> stays reachable)
        for token in SPECIALS:
            if token != "<|im_end|>":
                model.lm_head.weight[ids[token]].mul_(0.05)
    model.generation_config = GenerationConfig(
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], do_sample=False
    )
    model.save_pretrained(out_dir)
    for name, body in (("preprocessor_config.json", image_processor_config()),
                       ("video_preprocessor_config.json", video_processor_config())):  # fmt: skip
        (out_dir / name).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return out_dir
