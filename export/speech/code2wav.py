"""The speech families' code2wav vocoder as one engine: codes [B, Q, T] -> waveform [B, 1, T*S
- trim] (S = 1920 and trim = 555 at Qwen3-Omni's rates 8, 5, 4, 3).

Its modules are transformers' ``Qwen3OmniMoeCode2Wav`` ones (a family loads their weights and may
subclass the graph: Qwen3-TTS's split RVQ); only the forward is ours, and it differs from HF's
in two places, both exact:

- attention goes through the edgeomni::CachedAttention plugin op (the design rule: attention is
  defined once), with ``window`` = the config's sliding_window, an empty in-graph scratch cache
  of capacity T, past_lens 0 and query_lens T. HF's traced path instead builds a T x T
  sliding-window mask in the graph, and at opset 23 its ONNX RotaryEmbedding fails in ORT for
  B > 1 (cos/sin of batch 1).
- stride-1 causal convs pad on the left only: HF's extra right padding is identically 0 at stride
  1, but computing it with ``math.ceil`` on a shape puts a chain of CeilToInt nodes in the graph.

Sample accounting: each decoder block's transposed conv (kernel 2r, stride r) keeps (L-1)*r of
its (L+1)*r outputs, so T frames give T*1920 - 555 samples (555 = 480 + 60 + 12 + 3 for rates
8, 5, 4, 3). The lost tail of a window is produced by the next window (runtime.vocoder).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf
from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
    Qwen3OmniMoeCode2WavConfig,
)

from edgeomni.export.common.onnx_export import export_onnx
from edgeomni.plugins import attention as attention_plugin

ENGINE = "code2wav.onnx"
INPUT, OUTPUT = "codes", "waveform"
# HF generate() decodes in chunks of 300 frames with 25 frames of left context (hard-coded there).
WINDOW_FRAMES, LEFT_CONTEXT_FRAMES = 300, 25
# The longest whole-utterance decode the runtime sends (82 s): a memory bound, not a graph limit.
MAX_FRAMES = 1024


def samples_per_frame(cfg: Qwen3OmniMoeCode2WavConfig) -> int:
    return math.prod(cfg.upsampling_ratios) * math.prod(cfg.upsample_rates)


def trim_samples(cfg: Qwen3OmniMoeCode2WavConfig) -> int:
    """Samples a window loses at its end: block i drops r_i samples, upsampled by later blocks."""
    rates = list(cfg.upsample_rates)
    return sum(math.prod(rates[i:]) for i in range(len(rates)))


def receptive_field_frames(cfg: Qwen3OmniMoeCode2WavConfig) -> int:
    """Left context (frames) beyond which a frame no longer changes later audio: left context at
    least this large makes windowed decoding equal the whole-utterance decode."""
    attention = cfg.num_hidden_layers * (cfg.sliding_window - 1)
    rate, convs = 1, 0.0
    for factor in cfg.upsampling_ratios:  # ConvNeXt depthwise conv, kernel 7
        rate *= factor
        convs += 6 / rate
    convs += 6 / rate  # decoder input conv, kernel 7
    for r in cfg.upsample_rates:  # residual units: kernel 7, dilations 1, 3, 9
        rate *= r
        convs += 6 * (1 + 3 + 9) / rate
    convs += 6 / rate  # output conv
    # +1: a window keeps samples from trim before its first new frame, i.e. from the frame before
    return attention + math.ceil(convs) + 1


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _causal_conv(m: hf.Qwen3OmniMoeCausalConvNet, x: torch.Tensor) -> torch.Tensor:
    if m.stride != 1:
        raise ValueError("only stride-1 causal convs are exported (Qwen3-Omni has no other)")
    return m.conv(F.pad(x, (m.padding, 0)))


def _apply(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """HF's forward of one vocoder module, with stride-1 causal convs padded on the left only."""
    if isinstance(m, hf.Qwen3OmniMoeCausalConvNet):
        return _causal_conv(m, x)
    if isinstance(m, hf.Qwen3OmniMoeConvNeXtBlock):
        y = _causal_conv(m.dwconv, x).permute(0, 2, 1)
        y = m.pwconv2(m.act(m.pwconv1(m.norm(y))))
        return x + (m.gamma * y).permute(0, 2, 1)
    if isinstance(m, hf.Qwen3OmniMoeCode2WavDecoderResidualUnit):
        y = _causal_conv(m.conv1, m.act1(x))
        return x + _causal_conv(m.conv2, m.act2(y))
    if isinstance(m, hf.Qwen3OmniMoeCode2WavDecoderBlock):
        for sub in m.block:
            x = _apply(sub, x)
        return x
    return m(x)  # SnakeBeta, CausalTransConvNet: HF's forward exports as is


class Code2WavGraph(nn.Module):
    """The exported graph: HF's code2wav with attention through the plugin op."""

    def __init__(self, model: nn.Module, cfg: Any = None) -> None:
        """``cfg``: the transformer's config, when it is not ``model.config`` (Qwen3-TTS)."""
        super().__init__()
        self.model = model
        cfg = model.config if cfg is None else cfg
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.window = int(cfg.sliding_window or 0)

    def _rotated(
        self, attn: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's queries [B, T, Hq, D] and keys [B, T, Hkv, D], rotary applied."""
        b, t, _ = x.shape
        q = attn.q_proj(x).view(b, t, self.num_heads, self.head_dim)
        k = attn.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

    def _attention(
        self, layer: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        attn = layer.self_attn
        b, t, _ = x.shape
        q, k = self._rotated(attn, x, cos, sin)
        # an empty cache of capacity T, made in the graph: one call attends over the whole window
        scratch_k = x.new_zeros(b, self.num_kv_heads, t, self.head_dim)
        scratch_v = x.new_zeros(b, self.num_kv_heads, t, self.head_dim)
        past_lens = torch.zeros(b, dtype=torch.int32)
        # T per row, counted on the device: torch.full((b,), t) would expand a host scalar into
        # a device tensor, a copy that keeps the CUDA provider from capturing the engine's graph
        query_lens = torch.ones_like(x[:, :, 0], dtype=torch.int64).sum(-1).to(torch.int32)
        out, _, _ = attention_plugin.torch_op()(
            q.reshape(b, t, -1),
            k.reshape(b, t, -1),
            attn.v_proj(x),
            scratch_k,
            scratch_v,
            past_lens,
            query_lens,
            self.num_heads,
            self.num_kv_heads,
            float(attn.scaling),
            self.window,
        )
        return attn.o_proj(out)

    def _transformer(self, pre: nn.Module, h: torch.Tensor) -> torch.Tensor:
        """HF's Code2WavTransformerModel layers and final norm: [B, T, H] -> [B, T, H]."""
        b, t, _ = h.shape
        position_ids = torch.arange(t).unsqueeze(0).expand(b, t)  # batch B: no broadcast in rope
        cos, sin = pre.rotary_emb(h, position_ids)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # [B, T, 1, D]
        for layer in pre.layers:
            attn = self._attention(layer, layer.input_layernorm(h), cos, sin)
            h = h + layer.self_attn_layer_scale(attn)
            h = h + layer.mlp_layer_scale(layer.mlp(layer.post_attention_layernorm(h)))
        return pre.norm(h)

    def _vocode(self, x: torch.Tensor) -> torch.Tensor:
        """Upsampling and decoder blocks, clamped: [B, C, T] -> [B, 1, samples]."""
        for blocks in self.model.upsample:
            for block in blocks:
                x = _apply(block, x)
        for block in self.model.decoder:
            x = _apply(block, x)
        return x.clamp(min=-1, max=1)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        m = self.model
        h = m.code_embedding(codes + m.code_offset).mean(1)  # [B, T, H]
        return self._vocode(self._transformer(m.pre_transformer, h).permute(0, 2, 1))


def export_graph(graph: nn.Module, codebook_size: int, num_quantizers: int, path: Path) -> Path:
    """A codes [B, Q, T] -> waveform graph to ONNX, batch and frames dynamic (example 2 x 5)."""
    from torch.export import Dim

    codes = torch.randint(0, codebook_size, (2, num_quantizers, 5))
    shapes = ({0: Dim("batch"), 2: Dim("frames")},)
    return export_onnx(
        graph,
        (codes,),
        Path(path),
        input_names=[INPUT],
        output_names=[OUTPUT],
        dynamic_shapes=shapes,
    )
