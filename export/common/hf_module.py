"""Build a transformers module and fill it from checkpoint tensors by name (no random init)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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


def hf_config(config: Any, cls: Any, sections: Sequence[str], what: str) -> Any:
    """A ``cls`` config from such an object, its dict, or the dict of the config sections above
    it (each of ``sections`` entered where present: a whole checkpoint's, a thinker's)."""
    if isinstance(config, cls):
        return config
    if isinstance(config, Mapping):
        sub = config
        for key in sections:
            sub = sub.get(key, sub)
        return cls.from_dict(dict(sub))
    raise TypeError(f"expected {what} config or dict, got {type(config).__name__}")
