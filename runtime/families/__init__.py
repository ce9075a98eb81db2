"""The runtime side of the model families: one folder per family holding its stages' runners
and its thinker's media preparation, and these tables, which collect what each family's package
declares: its runners (name, kind, factory) and its media hooks (engine config model_type ->
factory; runtime/prompt.py says what a hook has). The text model's runner, which every family's
graph may use, is generic (runners/llm.py); it reads text only unless the family declares media
preparation for its model type. Importing a family's package loads no engine and none of its
modules: the factories are imported when a stage first runs."""

from __future__ import annotations

from edgeomni.runtime.families import qwen3_omni, qwen3_tts

PACKAGES = {"qwen3_omni": qwen3_omni, "qwen3_tts": qwen3_tts}

FAMILIES = {name: package.RUNNERS for name, package in PACKAGES.items()}

# the request keys a family's speech stages read (talker_*, cp_*, subtalker_*), in one list
STAGE_KEYS: tuple[str, ...] = tuple(
    dict.fromkeys(k for package in PACKAGES.values() for k in getattr(package, "STAGE_KEYS", ()))
)


# a family without media preparation declares no MEDIA
MEDIA: dict[str, str] = {
    model_type: factory
    for package in PACKAGES.values()
    for model_type, factory in getattr(package, "MEDIA", {}).items()
}
