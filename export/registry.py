"""The registry of model families: HF model_type -> the family that builds it.

A family is its folders. ``export/families/<name>/__init__.py`` declares the family's export side
(a ``Family``: its model types, the module of its build hooks, its tiny checkpoint maker, and the
runner names its graphs use, which its runtime folder reads from here) and registers it with
``register_family``; the runtime folder of the same name declares the rest. No table lists the
families: the built-in ones are found by walking ``export/families/``, and an out-of-tree family
is a module that calls ``register_family`` (and the runtime's), named by the environment variable
``EDGEOMNI_FAMILIES`` (module names, comma-separated) or by an entry point of the group
``edgeomni.families`` of an installed package; ``load_plugins`` imports them once.

Declarations are standard library only and import lazily: reading the registry costs nothing,
and a family's torch code loads only when its hooks are used.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgeomni.export.family import FamilyHooks

PLUGINS_ENV = "EDGEOMNI_FAMILIES"
# the generic text model's runner, which any family's graph may use (its own runners are named
# in its declaration, under its name: "<family>.<runner>")
LLM_RUNNER = "llm.backbone"
ENTRY_POINTS = "edgeomni.families"
# a text model's smoke run: four greedy tokens
TEXT_SMOKE = ("--max-generate-length", "4", "--sampling", '{"top_k": 1}')


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    # its build hooks (export/family.py's FamilyHooks): a module, or "module:attribute" of an
    # object (a text family's TextFamily, export/common/text_family.py)
    module: str
    # "module:attribute" of make(out_dir: Path, *, seed: int = 0) -> Path, a tiny random
    # checkpoint of this family (None: none)
    tiny: str | None = None
    # edge-infer's flags for a smoke run of the tiny checkpoint's build ("{tmp}": a scratch
    # folder), beside --config and --prompt: what its graph needs to answer (a voice, limits)
    smoke: tuple[str, ...] = ()

    def hooks(self) -> FamilyHooks:
        return _resolve(self.module)  # type: ignore[no-any-return]

    def tiny_maker(self) -> Callable[..., Path]:
        if self.tiny is None:
            raise ValueError(f"the {self.name} family declares no tiny checkpoint maker")
        return _resolve(self.tiny)  # type: ignore[no-any-return]


def _resolve(name: str) -> Any:
    """A module, or an attribute of one ("module:attribute")."""
    module, _, attr = name.partition(":")
    found = importlib.import_module(module)
    return getattr(found, attr) if attr else found


class UnknownModelType(ValueError):
    """No family handles this checkpoint's model_type."""


_REGISTERED: dict[str, Family] = {}
_loaded = False


def register_family(family: Family) -> Family:
    """Add a family (registering the same declaration again is a no-op); a name or model_type
    another family has is an error."""
    if _REGISTERED.get(family.name) == family:
        return family
    if family.name in _REGISTERED:
        raise RuntimeError(f"family {family.name!r} registered twice")
    for other in _REGISTERED.values():
        shared = set(other.model_types) & set(family.model_types)
        if shared:
            raise RuntimeError(f"model_type {sorted(shared)[0]!r} registered twice")
    _REGISTERED[family.name] = family
    return family


def load_plugins() -> list[str]:
    """Import the out-of-tree family modules (``EDGEOMNI_FAMILIES``, then the entry points of
    ``edgeomni.families``), each once; returns their names. A module that fails to import is
    an error naming it: a family asked for and silently missing would misread its requests."""
    names = [n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()]
    from importlib.metadata import entry_points

    names += [ep.value.split(":")[0] for ep in entry_points(group=ENTRY_POINTS)]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ImportError(f"{PLUGINS_ENV}/{ENTRY_POINTS}: cannot import {name}: {e}") from e
    return names


def families() -> tuple[Family, ...]:
    """Every family: the built-in ones (each folder of export/families/) and the plugins'."""
    global _loaded
    if not _loaded:
        from edgeomni.export import families as package

        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if info.ispkg:
                importlib.import_module(info.name)
        load_plugins()
        _loaded = True
    return tuple(_REGISTERED.values())


def _index() -> dict[str, Family]:
    return {model_type: f for f in families() for model_type in f.model_types}


def family_for(model_type: str) -> Family:
    index = _index()
    if model_type not in index:
        known = ", ".join(sorted(index))
        raise UnknownModelType(f"model_type {model_type!r} is not supported; supported: {known}")
    return index[model_type]


def tiny_makers() -> dict[str, Any]:
    """model_type -> its family's tiny checkpoint maker, for the families that declare one."""
    return {f.model_types[0]: f for f in families() if f.tiny is not None}
