"""The runtime side of the model families: one folder per family holding its stages' runners,
and this table, which collects the runner declarations each family's package makes (name,
kind, factory). The text model's runner, which every family's graph may use, is generic
(runners/llm.py). Importing a family's package loads no engine and none of its modules: the
factories are imported when a stage first runs."""

from __future__ import annotations

from edgeomni.runtime.families import qwen3_omni

FAMILIES = {"qwen3_omni": qwen3_omni.RUNNERS}
