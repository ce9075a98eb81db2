"""The runtime side of the model families: one folder per family, whose __init__ registers its
declaration (runtime/family.py: its runners, media hooks, request keys and stage keys), and
these tables, which collect every registered family's: the built-in ones (each folder here) and
the out-of-tree ones (export/registry.py's ``load_plugins``: ``EDGEOMNI_FAMILIES`` and the
``edgeomni.families`` entry points). The text model's runner, which every family's graph may
use, is generic (runners/llm.py); it reads text only unless a family declares media
preparation for its model type. Importing a family's package loads no engine and none of its
modules: the factories are imported when a stage first runs."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Collection, Mapping
from types import MappingProxyType

from edgeomni.export.registry import load_plugins
from edgeomni.runtime.family import RequestKey, RuntimeFamily, freeze

PACKAGES = {
    info.name: importlib.import_module(f"{__name__}.{info.name}")
    for info in pkgutil.iter_modules(__path__)
    if info.ispkg
}
load_plugins()
DECLARED: tuple[RuntimeFamily, ...] = freeze()

FAMILIES = {family.name: family.runners for family in DECLARED}

# a family without media preparation declares no media
MEDIA: dict[str, str] = {t: factory for family in DECLARED for t, factory in family.media.items()}

# speech-to-text forms by model_type (RuntimeFamily.transcription): an ASR graph's
TRANSCRIPTION: dict[str, str] = {
    t: factory for family in DECLARED for t, factory in family.transcription.items()
}

# the request keys a family's later stages read (talker_*, cp_*...), and their prefixes
STAGE_KEYS: tuple[str, ...] = tuple(dict.fromkeys(k for f in DECLARED for k in f.stage_keys))
STAGE_PREFIXES: tuple[str, ...] = tuple(
    dict.fromkeys(p for f in DECLARED for p in f.stage_prefixes)
)

# the families' request controls (read by the stage whose graph input is request:<key>), each
# with the label of the family that declares it
REQUEST_KEYS: Mapping[str, RequestKey] = MappingProxyType(
    {k: v for f in DECLARED for k, v in f.request_keys.items()}
)
KEY_LABELS: Mapping[str, str] = MappingProxyType(
    {k: f.label or f.name for f in DECLARED for k in f.request_keys}
)
# other names of stage keys (key -> (stage key, meaning)), and text-model keys a graph without
# a text model gives to a stage key (key -> stage key)
ALIASES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {k: v for f in DECLARED for k, v in f.aliases.items()}
)
TEXT_FALLBACKS: Mapping[str, str] = MappingProxyType(
    {k: v for f in DECLARED for k, v in f.text_fallbacks.items()}
)
# stage keys that fix an utterance's frames (set to n: n frames)
LENGTH_KEYS: tuple[str, ...] = tuple(dict.fromkeys(k for f in DECLARED for k in f.length_keys))


def control_labels(keys: Collection[str]) -> str:
    """The labels of the families whose request controls these are ("Qwen3-TTS"), in one."""
    return " or ".join(dict.fromkeys(KEY_LABELS.get(k, "family") for k in keys))
