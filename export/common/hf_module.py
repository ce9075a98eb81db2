"""Build a transformers module and fill it from checkpoint tensors by name (no random init)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def load_hf_module(
    cls: Any, cfg: Any, get_tensor: Callable[[str], torch.Tensor], prefix: str
) -> Any:
    """``cls(cfg)`` with every parameter read from ``get_tensor(prefix + name)``, shapes checked,
    in float32. Non-persistent buffers are the caller's to rebuild."""
    from transformers.initialization import no_init_weights

    with no_init_weights():  # every parameter is overwritten below; skip the random init
        module = cls(cfg)
    state = {}
    for name, param in module.state_dict().items():
        tensor = get_tensor(prefix + name)
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(
                f"{prefix}{name} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
            )
        state[name] = tensor.to(torch.float32).contiguous()
    module.load_state_dict(state, strict=True)
    # float32 whatever dtype the module was built in (a checkpoint's config may say bfloat16)
    return module.to(torch.float32)
