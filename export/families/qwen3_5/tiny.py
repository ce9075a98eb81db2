"""Tiny random Qwen3.5 checkpoints: the text model (Qwen3_5ForCausalLM) with the tiny
tokenizer, and the image-text model (Qwen3_5ForConditionalGeneration) with Qwen3-VL's tiny
tokenizer, chat template and processor files (export/tiny_vl.py), since Qwen3.5's processor is
Qwen3VLProcessor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def text_settings(eos: int, pad: int) -> dict[str, Any]:
    """The tiny text config: 4 layers (three DeltaNet, then full attention), hidden 64."""
    return dict(
        vocab_size=384, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=4, tie_word_embeddings=False, max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]},
        eos_token_id=eos, pad_token_id=pad, bos_token_id=None,
        initializer_range=0.2,  # spread-out logits: greedy parity should not hinge on near-ties
    )  # fmt: skip


def _perturb_norms(model: Any, names: str = "") -> None:
    """Qwen3.5's (1 + w) norms are zero-initialised: perturbed so the offset is exercised."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(names) and name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.2)


def make_qwen3_5(out_dir: Path, *, seed: int = 0, **overrides: Any) -> Path:
    """The tiny text model (text_settings); overrides go to Qwen3_5TextConfig."""
    import torch
    from transformers import GenerationConfig, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from edgeomni.export.tiny import make_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(out_dir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    config = Qwen3_5TextConfig(**{**text_settings(eos, pad), **overrides})
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config).eval()
    _perturb_norms(model)
    model.save_pretrained(out_dir)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad, do_sample=False).save_pretrained(out_dir)
    return out_dir


# the image-text model's text config over text_settings: attention every other layer and half
# of each head rotary (MRoPE [4, 2, 2]), so that an image's content and layout move its reply
# (with one attention layer of four and a quarter rotary, a flipped image gave the same tokens)
VL_TEXT: dict[str, Any] = {
    "layer_types": ["linear_attention", "full_attention"] * 2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.5, "mrope_section": [4, 2, 2]},
}  # fmt: skip


def make_qwen3_5_vl(out_dir: Path, *, seed: int = 0, **overrides: Any) -> Path:
    """The tiny image-text model: text_settings and VL_TEXT over Qwen3-VL's tiny tokenizer
    (512 ids), and the tiny ViT (d32 x 2, out 64) without DeepStack, its weights redrawn with
    wide norm gains (tiny_vl's) so that where each patch sits moves the reply; overrides go to
    text_config. Placeholder and control tokens get near-zero lm_head rows, as in tiny_vl, so a
    random model does not emit them."""
    import torch
    from transformers import GenerationConfig, Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from edgeomni.export.tiny_omni import (
        ROLE_WORDS,
        make_omni_tokenizer,
        redraw_parameters,
        tiny_vision_config,
    )
    from edgeomni.export.tiny_vl import (
        CHAT_TEMPLATE,
        NORM_GAIN_STD,
        SPECIALS,
        TOKENIZER_MM_TOKENS,
        VOCAB,
        image_processor_config,
        video_processor_config,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = make_omni_tokenizer(out_dir, VOCAB, specials=SPECIALS, mm_tokens=TOKENIZER_MM_TOKENS,
                              chat_template=CHAT_TEMPLATE)  # fmt: skip
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    ids.update({w: tok.encode(w, add_special_tokens=False)[0] for w in ROLE_WORDS})
    eos, pad = ids["<|im_end|>"], ids["<|endoftext|>"]
    vision = {k: v for k, v in tiny_vision_config().items() if k != "deepstack_visual_indexes"}
    config = Qwen3_5Config(
        text_config={**text_settings(eos, pad), "vocab_size": VOCAB, **VL_TEXT, **overrides},
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    _perturb_norms(model, "model.language_model.")
    redraw_parameters(model.model.visual, torch.Generator().manual_seed(seed),
                      gain_std=NORM_GAIN_STD)  # fmt: skip
    with torch.no_grad():
        for token in SPECIALS:
            if token != "<|im_end|>":
                model.lm_head.weight[ids[token]].mul_(0.05)
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=pad,
                                               do_sample=False)  # fmt: skip
    model.save_pretrained(out_dir)
    for name, body in (("preprocessor_config.json", image_processor_config()),
                       ("video_preprocessor_config.json", video_processor_config())):  # fmt: skip
        (out_dir / name).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return out_dir
