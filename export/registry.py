"""The one table of model families: HF model_type -> the family module that handles it.

Imports are lazy: reading the table costs nothing, and a family's torch code loads only when used.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgeomni.export.family import FamilyHooks


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    module: str

    def hooks(self) -> FamilyHooks:
        return importlib.import_module(self.module)  # type: ignore[return-value]


FAMILIES: tuple[Family, ...] = (
    Family("qwen3", ("qwen3",), "edgeomni.export.families.qwen3"),
    Family("qwen3_omni", ("qwen3_omni_moe",), "edgeomni.export.families.qwen3_omni"),
    Family("qwen3_tts", ("qwen3_tts",), "edgeomni.export.families.qwen3_tts"),
)


class UnknownModelType(ValueError):
    """No family handles this checkpoint's model_type."""


def _index() -> dict[str, Family]:
    index: dict[str, Family] = {}
    for family in FAMILIES:
        for model_type in family.model_types:
            if model_type in index:
                raise RuntimeError(f"model_type {model_type!r} registered twice")
            index[model_type] = family
    return index


def family_for(model_type: str) -> Family:
    index = _index()
    if model_type not in index:
        known = ", ".join(sorted(index))
        raise UnknownModelType(f"model_type {model_type!r} is not supported; supported: {known}")
    return index[model_type]
