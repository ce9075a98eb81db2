"""Qwen3-Omni's speech stages at run time: the talker (its prompt layout from the thinker's
handoff, its code predictor per frame) and code2wav (the vocoder), each with its cohort path and
its slot stage for the in-flight scheduler."""

from __future__ import annotations

# (runner name in the graph, kind, "module:attribute" of its factory)
RUNNERS = (
    ("qwen3_omni.talker", "autoregressive", "edgeomni.runtime.families.qwen3_omni.talker:Talker"),
    ("qwen3_omni.code2wav", "iterative",
     "edgeomni.runtime.families.qwen3_omni.code2wav:Code2Wav"),
)  # fmt: skip
