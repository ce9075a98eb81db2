"""Qwen3-Omni sparse MoE blocks whose routed experts are one edgeomni::MoE plugin op.

They compute what transformers' ``Qwen3OmniMoeThinkerTextSparseMoeBlock`` and
``Qwen3OmniMoeTalkerTextSparseMoeBlock`` compute, but export as one MoE node per block (lowered to
a fused kernel) instead of a per-token gather of expert weights, whose memory grows with prompt
length x experts. Both take hidden states [B, S, H] and return [B, S, H].

Checkpoint names under ``prefix`` (e.g. ``thinker.model.layers.3.mlp.``) -> our parameters:

=====================================================  ===========================================
checkpoint                                             ours
=====================================================  ===========================================
``gate.weight`` [E, H]                                 ``gate.weight`` (router, unchanged)
``experts.{e}.gate_proj.weight`` [I, H]                ``fc1`` [E, 2I, H], gate rows at even
``experts.{e}.up_proj.weight`` [I, H]                  indices, up rows at odd ones (interleaved)
``experts.{e}.down_proj.weight`` [H, I]                ``fc2`` [E, H, I] (stacked)
``shared_expert.gate_proj.weight`` [Is, H] (talker)    ``shared_expert.gate_up_proj.weight``
``shared_expert.up_proj.weight`` [Is, H] (talker)      [2Is, H]: gate rows then up rows
``shared_expert.down_proj.weight`` [H, Is] (talker)    ``shared_expert.down_proj.weight``
``shared_expert_gate.weight`` [1, H] (talker)          ``shared_expert_gate.weight``
=====================================================  ===========================================

The per-expert names are what checkpoints on disk hold (the Qwen release, and transformers 5's
``save_pretrained``). A transformers 5 module's own ``state_dict`` instead holds the fused
``experts.gate_up_proj`` [E, 2I, H] (each expert's gate rows, then its up rows) and
``experts.down_proj`` [E, H, I]; ``load_moe_block`` accepts either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from edgeomni.export.common.decoder import MLP
from edgeomni.plugins import moe as moe_plugin

GetTensor = Callable[[str], torch.Tensor]


def _cfg(cfg: Mapping[str, Any] | Any, name: str, default: Any = None) -> Any:
    """Read a field from a config.json dict or a transformers config object."""
    value = cfg.get(name, default) if isinstance(cfg, Mapping) else getattr(cfg, name, default)
    if value is None:
        raise ValueError(f"MoE config has no {name!r}")
    return value


def _num_experts(cfg: Mapping[str, Any] | Any) -> int:
    """The talker's config.json names it num_local_experts (num_experts is null there)."""
    get = cfg.get if isinstance(cfg, Mapping) else lambda k: getattr(cfg, k, None)
    value = get("num_experts") or get("num_local_experts")
    if not value:
        raise ValueError("MoE config has neither num_experts nor num_local_experts")
    return int(value)


def interleave_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """[E, I, H] gate and up -> [E, 2I, H] with rows g0, u0, g1, u1, ... (the only fc1 layout
    ONNX Runtime's CPU MoE kernel accepts)."""
    e, i, h = gate.shape
    return torch.stack((gate, up), dim=2).reshape(e, 2 * i, h)


class ThinkerSparseMoE(nn.Module):
    """The thinker's sparse block: router, softmax top-k (renormalised when ``normalize``), SwiGLU
    experts, all in one edgeomni::MoE call."""

    def __init__(
        self, hidden: int, intermediate: int, num_experts: int, top_k: int, normalize: bool
    ) -> None:
        super().__init__()
        self.num_experts, self.top_k, self.normalize = num_experts, top_k, normalize
        self.gate = nn.Linear(hidden, num_experts, bias=False)  # the router
        self.fc1 = nn.Parameter(torch.zeros(num_experts, 2 * intermediate, hidden))
        self.fc2 = nn.Parameter(torch.zeros(num_experts, hidden, intermediate))

    # transformers' thinker default is norm_topk_prob=True (its router honours the field, so
    # a checkpoint may set it); the talker's is False
    NORMALIZE_DEFAULT = True

    @classmethod
    def _routed(cls, cfg: Mapping[str, Any] | Any) -> tuple[int, int, int, int, bool]:
        """The routed experts' arguments from a text config, which must ask for silu."""
        act = _cfg(cfg, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(
                f"edgeomni::MoE computes SwiGLU with silu; the config asks for {act!r}"
            )
        return (_cfg(cfg, "hidden_size"), _cfg(cfg, "moe_intermediate_size"), _num_experts(cfg),
                _cfg(cfg, "num_experts_per_tok"),
                bool(_cfg(cfg, "norm_topk_prob", cls.NORMALIZE_DEFAULT)))  # fmt: skip

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | Any) -> ThinkerSparseMoE:
        """From the thinker's text config."""
        return cls(*cls._routed(cfg))

    def mix(self, flat: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, H]: the routed experts."""
        return moe_plugin.torch_op()(
            flat, self.gate(flat), self.fc1, self.fc2, self.top_k, int(self.normalize)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        return self.mix(x.reshape(b * s, h)).reshape(b, s, h)


class TalkerSparseMoE(ThinkerSparseMoE):
    """The talker's sparse block: the routed experts plus a dense shared expert scaled by
    sigmoid(shared_expert_gate(x)), which stays outside the op (plain MatMul/Sigmoid)."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        num_experts: int,
        top_k: int,
        normalize: bool,
        shared_intermediate: int,
    ) -> None:
        super().__init__(hidden, intermediate, num_experts, top_k, normalize)
        self.shared_expert = MLP(hidden, shared_intermediate)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    NORMALIZE_DEFAULT = False

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any] | Any) -> TalkerSparseMoE:
        """From the talker's text config."""
        return cls(*cls._routed(cfg), _cfg(cfg, "shared_expert_intermediate_size"))

    def mix(self, flat: torch.Tensor) -> torch.Tensor:
        shared = torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return super().mix(flat) + shared


def _expert_weights(
    num_experts: int, get_tensor: GetTensor, prefix: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gate [E, I, H], up [E, I, H], down [E, H, I]) from per-expert or fused names."""
    p = prefix + "experts."
    try:
        gate = torch.stack([get_tensor(f"{p}{e}.gate_proj.weight") for e in range(num_experts)])
        up = torch.stack([get_tensor(f"{p}{e}.up_proj.weight") for e in range(num_experts)])
        down = torch.stack([get_tensor(f"{p}{e}.down_proj.weight") for e in range(num_experts)])
        return gate, up, down
    except (KeyError, ValueError) as per_expert_missing:
        try:
            gate_up, down = get_tensor(p + "gate_up_proj"), get_tensor(p + "down_proj")
        except (KeyError, ValueError):
            raise KeyError(
                f"{prefix}: found neither {p}N.gate_proj/up_proj/down_proj.weight nor "
                f"{p}gate_up_proj/down_proj"
            ) from per_expert_missing
    gate, up = gate_up.chunk(2, dim=1)  # each expert's gate rows, then its up rows
    return gate, up, down


def moe_checkpoint_tensors(
    module: ThinkerSparseMoE, get_tensor: GetTensor, prefix: str
) -> dict[str, torch.Tensor]:
    """Our parameter name -> tensor built from the checkpoint names under ``prefix``."""
    gate, up, down = _expert_weights(module.num_experts, get_tensor, prefix)
    state = {
        "gate.weight": get_tensor(prefix + "gate.weight"),
        "fc1": interleave_gate_up(gate, up),
        "fc2": down,
    }
    if isinstance(module, TalkerSparseMoE):
        s = prefix + "shared_expert."
        state["shared_expert.gate_up_proj.weight"] = torch.cat(
            [get_tensor(s + "gate_proj.weight"), get_tensor(s + "up_proj.weight")], dim=0
        )
        state["shared_expert.down_proj.weight"] = get_tensor(s + "down_proj.weight")
        state["shared_expert_gate.weight"] = get_tensor(prefix + "shared_expert_gate.weight")
    return state


def load_moe_block(module: ThinkerSparseMoE, get_tensor: GetTensor, prefix: str) -> None:
    """Fill every parameter of ``module`` from the checkpoint names under ``prefix`` (see the
    module docstring), checking shapes and keeping the module's dtype."""
    state = moe_checkpoint_tensors(module, get_tensor, prefix)
    own = module.state_dict()
    for name, tensor in state.items():
        want = tuple(own[name].shape)
        if tuple(tensor.shape) != want:
            raise ValueError(f"{prefix}{name}: shape {tuple(tensor.shape)}, expected {want}")
        state[name] = tensor.to(own[name].dtype).contiguous()
    module.load_state_dict(state, strict=True)
