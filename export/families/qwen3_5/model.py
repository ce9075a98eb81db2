"""Qwen3.5's decoder (transformers' Qwen3_5ForCausalLM / the language model of
Qwen3_5ForConditionalGeneration) as one engine with the plugin ops.

It follows export/common/decoder.py's CausalLM contract (embeddings in, each row's last-token
logits and the updated states out) but its layers are of two kinds, so its state is too:
- full attention (every ``full_attention_interval``-th layer): gated attention (q_proj gives per
  head [q, gate]; the output is attn * sigmoid(gate)), q/k norms, partial rotary (the first
  ``rotary_dim`` of each head, interleaved MRoPE) over edgeomni::CachedAttention's KV cache;
- linear attention: the Gated DeltaNet, edgeomni::CausalConvState then edgeomni::GatedDeltaRule
  (plugins/gated_delta.py), whose conv and recurrent states are fixed-size per row.

Qwen3.5's norms scale by (1 + w) with w stored zero-initialised; ours hold the effective weight
1 + w (one plain rms_norm each), which load_qwen35 computes. The gated norm of the DeltaNet
output scales by w itself. Projections are packed where the parts are read together
(``PACKED``): q/k/v, the DeltaNet's qkv/z/b/a inputs, the MLP's gate/up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from edgeomni.export.common.checkpoint import CheckpointError
from edgeomni.export.common.config_values import attention_dims, integer, number
from edgeomni.export.common.decoder import MLP, RMSNorm, RotaryEmbedding
from edgeomni.export.common.decoder_weights import load_state
from edgeomni.export.common.text_config import rope
from edgeomni.graph_schema.state import StateTensor, kv_tensors
from edgeomni.plugins import attention as attention_plugin
from edgeomni.plugins import gated_delta
from edgeomni.plugins import rotary as rotary_plugin

FULL, LINEAR = "full_attention", "linear_attention"

# packed parameter suffix -> the checkpoint suffixes concatenated (along the output dim) into it
PACKED: dict[str, tuple[str, ...]] = {
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                  "self_attn.v_proj.weight"),
    "self_attn.qkv_proj.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                "self_attn.v_proj.bias"),
    "linear_attn.in_proj.weight": ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",
                                   "linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}  # fmt: skip
# our parameter suffix -> the checkpoint's, where only the name (or a squeezed axis) differs
RENAMED = {"linear_attn.conv_weight": "linear_attn.conv1d.weight"}
# (1 + w) norms: the checkpoint stores w, we hold 1 + w
OFFSET_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight",
                "self_attn.q_norm.weight", "self_attn.k_norm.weight")  # fmt: skip


@dataclass(frozen=True)
class Qwen35Config:
    """The text decoder's dimensions, as config_from reads them."""

    hidden_size: int
    layer_types: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rotary_dim: int
    mrope_section: tuple[int, ...]
    attention_bias: bool
    conv_kernel: int
    linear_k_heads: int
    linear_v_heads: int
    linear_k_dim: int
    linear_v_dim: int
    tie_word_embeddings: bool = False
    # what the exporter (onnx_export.export_causal_lm) reads of any decoder's config: none
    deepstack_layers: int = 0
    lm_heads: int = 1

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def conv_dim(self) -> int:
        """The DeltaNet's conv channels: q, k and v side by side."""
        return 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim

    @property
    def embeds_size(self) -> int:
        return self.hidden_size


def config_from(config: Mapping[str, Any]) -> Qwen35Config:
    """The text config: the top level (Qwen3_5ForCausalLM) or ``text_config``
    (Qwen3_5ForConditionalGeneration); absent keys take Qwen3_5TextConfig's defaults."""
    where = "text_config." if isinstance(config.get("text_config"), dict) else ""
    text: Mapping[str, Any] = config["text_config"] if where else config
    if text.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"config.json: {where}hidden_act {text['hidden_act']!r} is not silu")
    hidden, heads, kv, dim = attention_dims(text, where, kv_heads=4, head_dim=256)
    layers = integer(text, "num_hidden_layers", where)
    types = text.get("layer_types")
    if types is None:
        interval = integer(text, "full_attention_interval", where, default=4)
        types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers)]
    if len(types) != layers or any(t not in (FULL, LINEAR) for t in types):
        raise CheckpointError(f"config.json: {where}layer_types must be {layers} of "
                              f"{FULL!r} / {LINEAR!r}, got {types!r}")  # fmt: skip
    theta, section = rope(dict(text), 10000.0, where)
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    factor = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    rotary_dim = int(dim * factor)
    section = section or (11, 11, 10)  # transformers' default
    if rotary_dim % 2 or sum(section) != rotary_dim // 2:
        raise CheckpointError(f"config.json: {where}mrope_section {list(section)} must sum to "
                              f"half the rotary dim {rotary_dim}")  # fmt: skip
    # ConditionalGeneration ties by its top-level config (the one its PreTrainedModel holds)
    tie = config.get("tie_word_embeddings", False) if where else text.get("tie_word_embeddings")
    linear = {n: integer(text, f"linear_{n}", where, default=d) for n, d in (
        ("conv_kernel_dim", 4), ("num_key_heads", 16), ("num_value_heads", 32),
        ("key_head_dim", 128), ("value_head_dim", 128))}  # fmt: skip
    if linear["num_value_heads"] % linear["num_key_heads"]:
        raise CheckpointError(f"config.json: {where}linear_num_value_heads must be a multiple "
                              "of linear_num_key_heads")  # fmt: skip
    return Qwen35Config(
        hidden_size=hidden, layer_types=tuple(types), num_heads=heads, num_kv_heads=kv,
        head_dim=dim, intermediate_size=integer(text, "intermediate_size", where),
        vocab_size=integer(text, "vocab_size", where),
        rms_norm_eps=number(text, "rms_norm_eps", where, default=1e-6), rope_theta=theta,
        rotary_dim=rotary_dim, mrope_section=tuple(section),
        attention_bias=bool(text.get("attention_bias", False)),
        conv_kernel=linear["conv_kernel_dim"], linear_k_heads=linear["num_key_heads"],
        linear_v_heads=linear["num_value_heads"], linear_k_dim=linear["key_head_dim"],
        linear_v_dim=linear["value_head_dim"], tie_word_embeddings=bool(tie),
    )  # fmt: skip


class GatedAttention(nn.Module):
    """Qwen3_5Attention over the CachedAttention op (one packed q/gate/k/v projection)."""

    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        out = (2 * cfg.num_heads + 2 * cfg.num_kv_heads) * d
        self.qkv_proj = nn.Linear(h, out, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary on the first rotary_dim of each head of x [B, S, H, D]; [B, S, H*D] out."""
        b, s, heads, d = x.shape
        r = self.cfg.rotary_dim
        part = rotary_plugin.torch_op()(x[..., :r].reshape(b, s, heads * r), cos, sin, heads, r)
        if r == d:
            return part
        return torch.cat((part.reshape(b, s, heads, r), x[..., r:]), dim=-1).reshape(b, s, -1)

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
        d, hq, hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        qg, k, v = self.qkv_proj(x).split((2 * hq * d, hkv * d, hkv * d), dim=-1)
        q, gate = qg.reshape(b, s, hq, 2 * d).split((d, d), dim=-1)
        q = self.rotate(self.q_norm(q), cos, sin)
        k = self.rotate(self.k_norm(k.reshape(b, s, hkv, d)), cos, sin)
        out, present_key, present_value = attention_plugin.torch_op()(
            q, k, v, past_key, past_value, past_lens, query_lens, hq, hkv, 0.0, 0
        )
        out = out * torch.sigmoid(gate.reshape(b, s, hq * d))
        return self.o_proj(out), present_key, present_value


class GatedRMSNorm(nn.Module):
    """Qwen3_5RMSNormGated: rms_norm per value head, times w, times silu(z)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        normed = nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return normed * nn.functional.silu(z)


class GatedDeltaNet(nn.Module):
    """Qwen3_5GatedDeltaNet over the CausalConvState and GatedDeltaRule ops."""

    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__()
        self.cfg = cfg
        hv, dv = cfg.linear_v_heads, cfg.linear_v_dim
        self.in_proj = nn.Linear(cfg.hidden_size, cfg.conv_dim + hv * dv + 2 * hv, bias=False)
        self.conv_weight = nn.Parameter(torch.zeros(cfg.conv_dim, cfg.conv_kernel))
        self.dt_bias = nn.Parameter(torch.ones(hv))
        self.A_log = nn.Parameter(torch.zeros(hv))
        self.norm = GatedRMSNorm(dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(hv * dv, cfg.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        past_conv: torch.Tensor,
        past_recurrent: torch.Tensor,
        query_lens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        b, s, _ = x.shape
        hv, dv = cfg.linear_v_heads, cfg.linear_v_dim
        key_dim = cfg.linear_k_heads * cfg.linear_k_dim
        mixed, z, beta_in, a = self.in_proj(x).split((cfg.conv_dim, hv * dv, hv, hv), dim=-1)
        mixed, present_conv = gated_delta.conv_torch_op()(
            mixed, self.conv_weight, past_conv, query_lens, cfg.conv_kernel, "silu"
        )
        q, k, v = mixed.split((key_dim, key_dim, hv * dv), dim=-1)
        beta = torch.sigmoid(beta_in)
        # in float32 whatever the weights (transformers: A may be -inf otherwise in float16)
        g = -self.A_log.float().exp() * nn.functional.softplus(a.float() + self.dt_bias.float())
        out, present_recurrent = gated_delta.rule_torch_op()(
            q, k, v, g.to(beta.dtype), beta, past_recurrent, query_lens,
            cfg.linear_k_heads, hv, 1, 0.0,
        )  # fmt: skip
        out = self.norm(out.reshape(b, s, hv, dv), z.reshape(b, s, hv, dv)).reshape(b, s, -1)
        return self.out_proj(out), present_conv, present_recurrent


class Qwen35Layer(nn.Module):
    def __init__(self, cfg: Qwen35Config, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if kind == FULL:
            self.self_attn = GatedAttention(cfg)
        else:
            self.linear_attn = GatedDeltaNet(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h, cos, sin, first, second, past_lens, query_lens):  # noqa: ANN001, ANN201
        x = self.input_layernorm(h)
        if self.kind == FULL:
            mixed, a, b = self.self_attn(x, cos, sin, first, second, past_lens, query_lens)
        else:
            mixed, a, b = self.linear_attn(x, first, second, query_lens)
        h = h + mixed
        return h + self.mlp(self.post_attention_layernorm(h)), a, b


class Qwen35Body(nn.Module):
    """``model.*`` of Qwen3_5ForCausalLM without the embedding table."""

    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Qwen35Layer(cfg, kind) for kind in cfg.layer_types)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.rotary_dim, cfg.rope_theta, cfg.mrope_section)


class Qwen35CausalLM(nn.Module):
    """Inputs: inputs_embeds [B, S, H], position_ids int64 [3, B, S], past_lens / query_lens
    int32 [B], last_indices int64 [B], then two state tensors per layer in layer order
    (state_tensors). Outputs: logits [B, V], then the present states in the same order."""

    def __init__(self, cfg: Qwen35Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Qwen35Body(cfg)
        self.lm_head_t = nn.Parameter(torch.zeros(cfg.hidden_size, cfg.vocab_size))  # [H, V]

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        past_lens: torch.Tensor,
        query_lens: torch.Tensor,
        last_indices: torch.Tensor,
        *states: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        cos, sin = self.model.rotary(position_ids)
        cos, sin = cos.to(inputs_embeds.dtype), sin.to(inputs_embeds.dtype)
        h = inputs_embeds
        presents: list[torch.Tensor] = []
        for i, layer in enumerate(self.model.layers):
            h, a, b = layer(h, cos, sin, states[2 * i], states[2 * i + 1], past_lens, query_lens)
            presents += [a, b]
        h = self.model.norm(h)
        b, _, hidden = h.shape
        last = torch.gather(h, 1, last_indices.view(b, 1, 1).expand(b, 1, hidden)).squeeze(1)
        return (last @ self.lm_head_t, *presents)

    def state_tensors(self) -> list[StateTensor]:
        """Its declared row state (graph_schema.state), in input order: a full-attention
        layer's key and value (kv), a DeltaNet layer's conv columns and recurrent state (float32
        whatever the weights: the recurrence is where reduced precision hurts most)."""
        cfg = self.cfg
        dtype = str(self.lm_head_t.dtype).removeprefix("torch.")
        out: list[StateTensor] = []
        for i, kind in enumerate(cfg.layer_types):
            if kind == FULL:
                out += kv_tensors(1, cfg.num_kv_heads, cfg.head_dim, dtype, ids=(i,))
                continue
            hv = cfg.linear_v_heads
            out += [
                StateTensor(f"conv_{i}", "conv", f"past_conv_{i}", f"present_conv_{i}",
                            (cfg.conv_dim, cfg.conv_kernel - 1), dtype, ("query_lens",)),
                StateTensor(f"recurrent_{i}", "recurrent", f"past_recurrent_{i}",
                            f"present_recurrent_{i}", (hv, cfg.linear_v_dim, cfg.linear_k_dim),
                            "float32", ("query_lens",)),
            ]  # fmt: skip
        return out

    def io_names(self) -> tuple[list[str], list[str]]:
        state = self.state_tensors()
        inputs = ["inputs_embeds", "position_ids", "past_lens", "query_lens", "last_indices"]
        return inputs + [t.input for t in state], ["logits"] + [t.output for t in state]


GetTensor = Callable[[str], torch.Tensor]


def _getter(source: Any) -> GetTensor:
    """A callable, a state dict, or a Checkpoint (its ``tensor``)."""
    if isinstance(source, Mapping):
        return lambda name: source[name]
    if hasattr(source, "tensor"):
        return source.tensor
    return source


def qwen35_tensors(module: Qwen35CausalLM, get: GetTensor, *, prefix: str = "model.",
                   lm_head: str | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """Our parameter name -> its value from the checkpoint. ``prefix``: the text model's
    (``model.`` for Qwen3_5ForCausalLM, ``model.language_model.`` for ConditionalGeneration);
    ``lm_head``: the head's name (default lm_head.weight, or the embedding table when tied)."""
    if lm_head is None:
        lm_head = (
            prefix + "embed_tokens.weight" if module.cfg.tie_word_embeddings else "lm_head.weight"
        )
    out: dict[str, torch.Tensor] = {}
    for name in module.state_dict():
        if name == "lm_head_t":
            out[name] = get(lm_head).t()
            continue
        stem = prefix + name.removeprefix("model.")
        for packed, parts in PACKED.items():
            if name.endswith(packed):
                base = stem[: -len(packed)]
                out[name] = torch.cat([get(base + part) for part in parts], dim=0)
                break
        else:
            renamed = next((stem[: -len(o)] + c for o, c in RENAMED.items() if name.endswith(o)),
                           None)  # fmt: skip
            value = get(renamed or stem)
            if renamed:  # conv1d.weight [C, 1, K] -> [C, K]
                value = value.reshape(value.shape[0], -1)
            if name.endswith(OFFSET_NORMS) or name == "model.norm.weight":
                value = 1.0 + value.float()
            out[name] = value
    return out


def load_qwen35(source: Any, config: Mapping[str, Any], *, prefix: str = "model.",
                lm_head: str | None = None, dtype: torch.dtype = torch.float32,
                where: str = "checkpoint") -> Qwen35CausalLM:  # fmt: skip
    """A Qwen35CausalLM with the checkpoint's weights (shapes checked; ``where`` names the
    checkpoint in errors). ``source``: a Checkpoint, a state dict, or name -> tensor."""
    module = Qwen35CausalLM(config_from(config))
    tensors = qwen35_tensors(module, _getter(source), prefix=prefix, lm_head=lm_head)
    load_state(module, tensors, dtype=dtype, where=where)
    return module.eval()
