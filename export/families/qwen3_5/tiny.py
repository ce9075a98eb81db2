"""A tiny random Qwen3.5 checkpoint (Qwen3_5ForCausalLM) with the tiny tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def make_qwen3_5(out_dir: Path, *, seed: int = 0, **overrides: Any) -> Path:
    """4 layers (three DeltaNet, then full attention), hidden 64; its zero-initialised (1 + w)
    norms perturbed so the offset is exercised; overrides go to Qwen3_5TextConfig."""
    import torch
    from transformers import GenerationConfig, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from edgeomni.export.tiny import make_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(out_dir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    settings: dict[str, Any] = dict(
        vocab_size=384, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=4, tie_word_embeddings=False, max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]},
        eos_token_id=eos, pad_token_id=pad, bos_token_id=None,
        initializer_range=0.2,  # spread-out logits: greedy parity should not hinge on near-ties
    )  # fmt: skip
    settings.update(overrides)
    config = Qwen3_5TextConfig(**settings)
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(out_dir)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad, do_sample=False).save_pretrained(out_dir)
    return out_dir
