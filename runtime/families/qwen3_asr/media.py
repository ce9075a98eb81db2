"""Qwen3-ASR's media hook: the shared hook (runtime/media/hook.py) over the audio encoder found
beside the llm; its prompts keep plain 1-D positions (transformers' Qwen3-ASR gives its Qwen3
decoder arange positions, the audio rows included)."""

from __future__ import annotations

from edgeomni.runtime.media.hook import MediaHook


class AsrMedia(MediaHook):
    """Audio parts only: each ``audio_token_id`` placeholder becomes the clip's encoder rows."""

    TOKENS = ("audio_token_id",)
    KINDS = ("audio",)
