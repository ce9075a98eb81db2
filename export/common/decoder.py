"""A Qwen3-style decoder whose attention is the edgeomni::Attention plugin op.

Module and parameter names follow Hugging Face's (``model.layers.N.self_attn.q_proj.weight``) so a
family maps checkpoint weights by name. The module takes input embeddings, not token ids: the
runtime looks rows up in the embedding table itself, which lets multimodal families splice encoder
outputs in, and keeps the table out of the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from edgeomni.plugins import attention as attention_plugin


@dataclass(frozen=True)
class DecoderConfig:
    """The decoder dimensions a family reads from its checkpoint config."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    qk_norm: bool = True
    attention_bias: bool = False


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, as transformers' Qwen3RMSNorm does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin for 1-D positions, computed in the graph from position_ids."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (
            theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids.float()[..., None] * self.inv_freq  # [B, S, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos()[:, :, None, :], emb.sin()[:, :, None, :]  # [B, S, 1, D]


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past_key: torch.Tensor,
        past_value: torch.Tensor,
        past_lens: torch.Tensor,
        query_lens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, cfg.num_heads, cfg.head_dim)
        k = self.k_proj(x).view(b, s, cfg.num_kv_heads, cfg.head_dim)
        v = self.v_proj(x)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out, present_key, present_value = attention_plugin.torch_op()(
            q.reshape(b, s, -1),
            k.reshape(b, s, -1),
            v,
            past_key,
            past_value,
            past_lens,
            query_lens,
            cfg.num_heads,
            cfg.num_kv_heads,
            0.0,
            0,
        )
        return self.o_proj(out), present_key, present_value


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h, cos, sin, past_key, past_value, past_lens, query_lens):  # noqa: ANN001, ANN201
        attn, pk, pv = self.self_attn(
            self.input_layernorm(h), cos, sin, past_key, past_value, past_lens, query_lens
        )
        h = h + attn
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, pk, pv


class DecoderBody(nn.Module):
    """``model.*`` of an HF causal LM, without the embedding table."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)


class CausalLM(nn.Module):
    """The llm.backbone engine: embeddings in, last-token logits and the updated cache out.

    Inputs: inputs_embeds [B,S,H], position_ids int64 [B,S], past_lens/query_lens int32 [B],
    last_indices int64 [B] (which position's logits each row wants), then past_key_i/past_value_i
    [B,Hkv,C,D] per layer. Outputs: logits [B,V], then present_key_i/present_value_i.
    """

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = DecoderBody(cfg)
        # stored [H, V] so the graph holds a plain MatMul weight (no transpose folded at load)
        self.lm_head_t = nn.Parameter(torch.zeros(cfg.hidden_size, cfg.vocab_size))

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        past_lens: torch.Tensor,
        query_lens: torch.Tensor,
        last_indices: torch.Tensor,
        *cache: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        cos, sin = self.model.rotary(position_ids)
        h = inputs_embeds
        presents: list[torch.Tensor] = []
        for i, layer in enumerate(self.model.layers):
            h, pk, pv = layer(h, cos, sin, cache[2 * i], cache[2 * i + 1], past_lens, query_lens)
            presents += [pk, pv]
        h = self.model.norm(h)
        b, _, hidden = h.shape
        idx = last_indices.view(b, 1, 1).expand(b, 1, hidden)
        last = torch.gather(h, 1, idx).squeeze(1)
        return (last @ self.lm_head_t, *presents)

    def io_names(self) -> tuple[list[str], list[str]]:
        n = self.cfg.num_layers
        kv_in = [f"past_{kind}_{i}" for i in range(n) for kind in ("key", "value")]
        kv_out = [f"present_{kind}_{i}" for i in range(n) for kind in ("key", "value")]
        inputs = ["inputs_embeds", "position_ids", "past_lens", "query_lens", "last_indices"]
        return inputs + kv_in, ["logits", *kv_out]
