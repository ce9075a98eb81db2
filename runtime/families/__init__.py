"""The runtime side of the model families: one folder per family, whose __init__ registers its
declaration (runtime/family.py: its runners, media hooks, request keys and stage keys), and
these tables, which collect every registered family's: the built-in ones (each folder here) and
the out-of-tree ones (export/registry.py's ``load_plugins``: ``EDGEOMNI_FAMILIES`` and the
``edgeomni.families`` entry points). The text model's runner, which every family's graph may
use, is generic (runners/llm.py); it reads text only unless a family declares media
preparation for its model type. Importing a family's package loads no engine and none of its
modules: the factories are imported when a stage first runs."""

from __future__ import annotations

import dataclasses
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


def merged_keys(declared: tuple[RuntimeFamily, ...]) -> dict[str, RequestKey]:
    """Every family's request controls; a key several families declare (Qwen3-TTS's and
    Qwen3-ASR's ``language``) is one control each of their stages reads as it declares: its
    check, flag, flag type and path must agree (else a RuntimeError naming both families),
    its meanings and flag helps are joined, its speech field is the one declared, and its
    flag goes with the audio outputs only if every declaring family's stage speaks."""
    out: dict[str, RequestKey] = {}
    owner: dict[str, str] = {}
    for family in declared:
        for key, mine in family.request_keys.items():
            if key not in out:
                out[key], owner[key] = mine, family.name
                continue
            have = out[key]
            differ = [n for n in ("check", "flag", "flag_type", "path")
                      if getattr(have, n) != getattr(mine, n)]  # fmt: skip
            fields = {have.speech_field, mine.speech_field} - {None}
            if differ or len(fields) > 1:
                what = ", ".join(differ or ["speech_field"])
                raise RuntimeError(f"request key {key!r}: {owner[key]} and {family.name} "
                                   f"declare it differently ({what})")  # fmt: skip
            out[key] = dataclasses.replace(
                have, meaning=f"{have.meaning}; {mine.meaning}",
                flag_help="; ".join(h for h in (have.flag_help, mine.flag_help) if h),
                speech_field=next(iter(fields), None), speaks=have.speaks and mine.speaks,
            )  # fmt: skip
            owner[key] = f"{owner[key]} and {family.name}"
    return out


# the families' request controls (read by the stage whose graph input is request:<key>), each
# with the labels of the families that declare it
REQUEST_KEYS: Mapping[str, RequestKey] = MappingProxyType(merged_keys(DECLARED))
KEY_LABELS: Mapping[str, str] = MappingProxyType({
    k: " or ".join(dict.fromkeys(f.label or f.name for f in DECLARED if k in f.request_keys))
    for k in REQUEST_KEYS
})  # fmt: skip
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
