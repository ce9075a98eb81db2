"""Fill a decoder.CausalLM from checkpoint tensors by name, for every family that uses it.

Our parameter ``model.X`` reads the checkpoint's ``<prefix>model.X``; packed projections
concatenate their parts (decoder.PACKED); mixture-of-experts blocks load through
moe.moe_checkpoint_tensors; ``lm_head_t`` is the named head, transposed to [H, V] (with several heads, ``lm_head`` is a format
string such as ``"lm_head.{}.weight"`` and the heads stack to [N, H, V]).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from edgeomni.export.common.checkpoint import CheckpointError
from edgeomni.export.common.decoder import PACKED, CausalLM
from edgeomni.export.common.moe import ThinkerSparseMoE, moe_checkpoint_tensors

GetTensor = Callable[[str], torch.Tensor]


def decoder_tensors(
    module: CausalLM,
    get: GetTensor,
    *,
    prefix: str,
    lm_head: str,
    renames: Mapping[str, str] | None = None,
) -> dict[str, torch.Tensor]:
    """Our parameter name -> the checkpoint tensor behind it; ``renames`` gives the full
    checkpoint name of parameters stored under another name (an ``input_proj``)."""
    out: dict[str, torch.Tensor] = {name: get(full) for name, full in (renames or {}).items()}
    moe_layers: dict[str, ThinkerSparseMoE] = {
        f"model.layers.{i}.mlp.": layer.mlp
        for i, layer in enumerate(module.model.layers)
        if isinstance(layer.mlp, ThinkerSparseMoE)
    }
    for ours, block in moe_layers.items():
        for name, tensor in moe_checkpoint_tensors(block, get, prefix + ours).items():
            out[ours + name] = tensor
    for name in module.state_dict():
        if name in out:
            continue
        if name == "lm_head_t":
            heads = (
                [lm_head]
                if module.cfg.lm_heads == 1
                else [lm_head.format(i) for i in range(module.cfg.lm_heads)]
            )
            out[name] = (
                torch.stack([get(h).t() for h in heads]) if len(heads) > 1 else get(heads[0]).t()
            )
            continue
        for packed, parts in PACKED.items():
            if name.endswith(packed):
                stem = prefix + name[: -len(packed)]
                out[name] = torch.cat([get(stem + part) for part in parts], dim=0)
                break
        else:
            out[name] = get(prefix + name)
    return out


def load_decoder(
    module: CausalLM,
    get: GetTensor,
    *,
    prefix: str,
    lm_head: str,
    dtype: torch.dtype,
    where: str,
    renames: Mapping[str, str] | None = None,
) -> None:
    """Load every parameter, checking shapes; ``where`` names the checkpoint in errors."""
    tensors = decoder_tensors(module, get, prefix=prefix, lm_head=lm_head, renames=renames)
    load_state(module, tensors, dtype=dtype, where=where)


def load_state(
    module: torch.nn.Module, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype, where: str
) -> None:
    """A decoder's parameters (our name -> the checkpoint's value), shapes checked, in
    ``dtype``; its rotary buffers (``module.model.rotary``) kept float32."""
    own = module.state_dict()
    state = {}
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            raise CheckpointError(
                f"{where}: {name} has shape {tuple(tensor.shape)}, expected {tuple(own[name].shape)}"
            )
        state[name] = tensor.to(dtype).contiguous()
    module.load_state_dict(state, strict=True)
    rotary = {k: v.clone() for k, v in module.model.rotary.named_buffers()}
    module.to(dtype)
    # positions and frequencies stay float32 at any weight dtype, with their float32 values (a
    # round trip through float16 moved inv_freq by up to 2e-4 relative: angles off by 0.08 rad
    # at position 1000)
    module.model.rotary.float()
    for name, value in rotary.items():
        getattr(module.model.rotary, name).copy_(value)
