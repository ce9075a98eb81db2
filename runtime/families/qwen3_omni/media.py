"""Qwen3-Omni's media hook for its thinker: the shared hook (runtime/media/hook.py) with
3-axis positions when an image needs them (transformers' Qwen3-Omni processor and
get_rope_index, done on the host)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgeomni.runtime.media.hook import MediaHook
from edgeomni.runtime.media.image import MAX_IMAGE_PIXELS
from edgeomni.runtime.media.mrope import MropeIds, rope_index
from edgeomni.runtime.prompt import Prompt

MEDIA_TOKENS = ("image_token_id", "video_token_id", "audio_token_id", "vision_start_token_id",
                "audio_start_token_id")  # fmt: skip


class MediaEncoders(MediaHook):
    """Qwen3-Omni's media hook: the thinker's audio and visual encoders, and its 3-axis
    positions."""

    TOKENS = MEDIA_TOKENS  # MropeIds' token fields

    def __init__(
        self,
        folder: Path,
        config: Mapping[str, Any],
        *,
        threads: int | None,
        locations: Mapping[str, str] | None = None,
        tokenizer: Any = None,
        max_image_pixels: int = MAX_IMAGE_PIXELS,
    ) -> None:
        super().__init__(folder, config, threads=threads, locations=locations,
                         tokenizer=tokenizer, max_image_pixels=max_image_pixels)  # fmt: skip
        self.ids: MropeIds | None = None  # no media_tokens: a build that reads text only
        if self.tokens:
            per_second = self.tokens.get("position_id_per_seconds") or 25
            self.ids = MropeIds(**{k: self.tokens[k] for k in MEDIA_TOKENS},
                                position_id_per_seconds=per_second)  # fmt: skip

    def positions(self, prompt: Prompt) -> None:
        if prompt.image_grids and self.ids is not None:
            prompt.positions, prompt.delta = rope_index(
                prompt.ids.tolist(), self.ids, image_grids=prompt.image_grids,
                audio_mel_frames=prompt.audio_frames,
            )  # fmt: skip
