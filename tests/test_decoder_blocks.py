"""The export decoder's building blocks equal transformers' own (before any ONNX is involved)."""

from __future__ import annotations

import torch

from edgeomni.export.common.decoder import RotaryEmbedding


def test_interleaved_mrope_matches_transformers() -> None:
    from transformers import Qwen3OmniMoeTextConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeThinkerTextRotaryEmbedding,
    )

    cfg = Qwen3OmniMoeTextConfig(
        hidden_size=64,
        num_attention_heads=2,
        head_dim=32,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 4, 4]},
    )
    hf = Qwen3OmniMoeThinkerTextRotaryEmbedding(cfg)
    ours = RotaryEmbedding(32, 1e6, (8, 4, 4))
    pos = torch.randint(0, 500, (3, 2, 7))
    hf_cos, hf_sin = hf(torch.zeros(1, dtype=torch.float32), pos)
    cos, sin = ours(pos)
    torch.testing.assert_close(cos, hf_cos, rtol=0, atol=0)
    torch.testing.assert_close(sin, hf_sin, rtol=0, atol=0)
    # the axes really differ: with t, h, w positions apart, plain 1-D RoPE would not match
    plain_cos, _ = RotaryEmbedding(32, 1e6, None)(pos[0])
    assert not torch.equal(plain_cos, hf_cos)


def test_one_d_rope_matches_qwen3() -> None:
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    cfg = Qwen3Config(hidden_size=64, num_attention_heads=4, head_dim=16, rope_theta=1e4)
    hf = Qwen3RotaryEmbedding(cfg)
    pos = torch.randint(0, 900, (2, 5))
    hf_cos, hf_sin = hf(torch.zeros(1), pos)
    cos, sin = RotaryEmbedding(16, 1e4, None)(pos)
    torch.testing.assert_close(cos, hf_cos, rtol=0, atol=0)
    torch.testing.assert_close(sin, hf_sin, rtol=0, atol=0)
