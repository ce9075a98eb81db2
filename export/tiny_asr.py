"""A tiny random Qwen3-ASR checkpoint: audio encoder, projector and Qwen3 text decoder.

No hub: the model comes from transformers' config classes (``save_pretrained``), the tokenizer
is a byte-level BPE trained here with the special tokens the chat template uses
(``<|im_start|>``, ``<|im_end|>``, ``<|audio_start|>``, ``<|audio_pad|>``, ``<|audio_end|>``) and
``<asr_text>`` as a plain added token (the transcript's marker decodes as text, as the
processor's parser expects), and the processor files are ``Qwen3ASRProcessor``'s own
(``save_pretrained``: its feature extractor's settings and the chat template). Weights are
redrawn (tiny_omni.redraw_parameters) so that parity tests can fail.

    python -m edgeomni.export.tiny qwen3_asr OUT_DIR
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
            "<|audio_pad|>")  # fmt: skip
PLAIN = ("<asr_text>",)
MEDIA_TOKENS = {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                "audio_eos_token": "<|audio_end|>"}  # fmt: skip
VOCAB = 512
# The layout of Qwen3-ASR's chat template: a system turn always (the context prompt, or empty),
# the user turn's audio as <|audio_start|><|audio_pad|><|audio_end|> (the processor repeats the
# pad to the encoder's token count), the assistant turn in a {% generation %} block. Unlike the
# release's template, a user turn's text parts are rendered too, so a text-only request says
# something to this tiny model.
CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part.type == 'audio' or 'audio' in part or 'audio_url' in part -%}"
    "{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif part.type == 'text' -%}{{- part.text -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages if message.role == 'system' -%}"
    "{%- set ns.system = ns.system + render(message.content) -%}"
    "{%- endfor -%}"
    "{{- '<|im_start|>system\\n' + ns.system + '<|im_end|>\\n' -}}"
    "{%- for message in messages if message.role != 'system' -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- if message.role == 'assistant' -%}"
    "{% generation %}{{- render(message.content) + '<|im_end|>\\n' -}}{% endgeneration %}"
    "{%- else -%}{{- render(message.content) + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# n_window_infer 200: an attention window is two 100-frame chunks (2 s), so a clip crosses a
# window boundary at 2 s and the tests stay short.
AUDIO = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64,
             d_model=32, output_dim=64, downsample_hidden_size=16, n_window=50,
             n_window_infer=200)  # fmt: skip
TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=2048, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})  # fmt: skip


def make_qwen3_asr(
    out_dir: Path, *, seed: int = 0, sizes: dict[str, dict[str, Any]] | None = None
) -> Path:
    """Write a tiny random Qwen3-ASR (config, weights, generation config, tokenizer, processor
    files): audio d32 x2 (windows of 200 frames), projector to 64, text H64 x2, 512 ids.
    ``sizes`` overrides config fields per section ("audio", "text"), e.g. for benchmarks at a
    release's dimensions (keeping them consistent is the caller's job: the audio output_dim
    is the text hidden size)."""
    import torch
    from transformers import (
        GenerationConfig,
        Qwen3ASRConfig,
        Qwen3ASRFeatureExtractor,
        Qwen3ASRForConditionalGeneration,
        Qwen3ASRProcessor,
    )

    from edgeomni.export.tiny_omni import make_omni_tokenizer, redraw_parameters

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = make_omni_tokenizer(out_dir, VOCAB, specials=SPECIALS, mm_tokens=MEDIA_TOKENS,
                              chat_template=CHAT_TEMPLATE, plain=PLAIN)  # fmt: skip
    ids = {t: tok.convert_tokens_to_ids(t) for t in (*SPECIALS, *PLAIN)}
    eos = [ids["<|endoftext|>"], ids["<|im_end|>"]]
    sizes = sizes or {}
    config = Qwen3ASRConfig(
        audio_config={**AUDIO, **sizes.get("audio", {})},
        text_config={**TEXT, **sizes.get("text", {})},
        audio_token_id=ids["<|audio_pad|>"],
        pad_token_id=ids["<|endoftext|>"],
        eos_token_id=eos,
    )
    model = Qwen3ASRForConditionalGeneration(config).eval()
    with torch.no_grad():
        redraw_parameters(model, torch.Generator().manual_seed(seed))
        # placeholders and control tokens are never generated by a trained model: near-zero
        # rows of the (tied) head keep a random one from emitting them (<|im_end|> stays)
        for token in ("<|endoftext|>", "<|im_start|>", "<|audio_start|>", "<|audio_end|>",
                      "<|audio_pad|>"):  # fmt: skip
            model.lm_head.weight[ids[token]].mul_(0.05)
    model.generation_config = GenerationConfig(
        eos_token_id=eos, pad_token_id=ids["<|endoftext|>"], do_sample=False
    )
    model.save_pretrained(out_dir)
    processor = Qwen3ASRProcessor(
        feature_extractor=Qwen3ASRFeatureExtractor(), tokenizer=tok, chat_template=CHAT_TEMPLATE
    )
    processor.save_pretrained(out_dir)
    return out_dir
