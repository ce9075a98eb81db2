"""config.json values read by name and checked, so a bad one is one line naming its key.

A build and ``edge-build --estimate`` size every module, table and cache from these values: a
string where a number belongs, a zero head count or a negative layer count must be refused as
the config's fault (a CheckpointError, exit 2), not become an internal error or a negative
memory total. ``where`` is the section's dotted path with a trailing dot ("" for the top
level, "talker_config." for a section), as the messages print it after ``config.json: ``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from edgeomni.export.common.checkpoint import CheckpointError

_MISSING: Any = object()


def integer(sec: Mapping[str, Any], key: str, where: str = "", *, least: int = 1,
            default: Any = _MISSING) -> int:  # fmt: skip
    """``sec[key]`` as an int of at least ``least``; ``default`` where the key is absent or
    null (required when no default is given). A whole float (4.0) counts; a bool does not."""
    value = sec.get(key)
    if value is None:
        if default is _MISSING:
            raise CheckpointError(f"config.json: {where}{key} is missing")
        return int(default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise CheckpointError(
            f"config.json: {where}{key} must be an integer >= {least}, got {value!r}"
        )
    return value


def number(sec: Mapping[str, Any], key: str, where: str = "", *, default: float) -> float:
    """``sec[key]`` as a finite float above 0; ``default`` where the key is absent or null."""
    value = sec.get(key)
    if value is None:
        return float(default)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):  # fmt: skip
        raise CheckpointError(f"config.json: {where}{key} must be a number > 0, got {value!r}")
    return float(value)


def attention_dims(
    sec: Mapping[str, Any], where: str, *, kv_heads: int | None = None,
    head_dim: int | None = None,
) -> tuple[int, int, int, int]:  # fmt: skip
    """(hidden_size, num_attention_heads, num_key_value_heads, head_dim) of a decoder section,
    each checked; ``kv_heads`` and ``head_dim``: the config class's defaults for an absent key
    (None: one key-value head per head, and hidden_size / heads)."""
    hidden = integer(sec, "hidden_size", where)
    heads = integer(sec, "num_attention_heads", where)
    # an explicit null is one key-value head per head (as upstream's classes read it)
    absent = heads if "num_key_value_heads" in sec else (kv_heads or heads)
    kv = integer(sec, "num_key_value_heads", where, default=absent)
    dim = integer(sec, "head_dim", where, default=head_dim or hidden // heads)
    if dim < 1:
        raise CheckpointError(f"config.json: {where}hidden_size {hidden} is smaller than "
                              f"{where}num_attention_heads {heads} (and no head_dim is given)")  # fmt: skip
    return hidden, heads, kv, dim
