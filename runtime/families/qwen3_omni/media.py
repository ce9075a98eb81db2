"""Qwen3-Omni's media hook for its thinker: the shared hook (runtime/media/hook.py) with
3-axis positions when an image needs them (transformers' Qwen3-Omni processor and
get_rope_index, done on the host)."""

from __future__ import annotations

import functools

from edgeomni.runtime.media.hook import MediaHook
from edgeomni.runtime.media.mrope import MropeIds, rope_index
from edgeomni.runtime.prompt import Prompt

MEDIA_TOKENS = ("image_token_id", "video_token_id", "audio_token_id", "vision_start_token_id",
                "audio_start_token_id")  # fmt: skip


class MediaEncoders(MediaHook):
    """Qwen3-Omni's media hook: the thinker's audio and visual encoders, and its 3-axis
    positions."""

    TOKENS = MEDIA_TOKENS  # MropeIds' token fields

    @functools.cached_property
    def ids(self) -> MropeIds | None:
        """The token ids 3-axis positions read; None for a build that reads text only."""
        if not self.tokens:
            return None
        per_second = self.tokens.get("position_id_per_seconds") or 25
        return MropeIds(**{k: self.tokens[k] for k in MEDIA_TOKENS},
                        position_id_per_seconds=per_second)  # fmt: skip

    def positions(self, prompt: Prompt) -> None:
        if prompt.image_grids and self.ids is not None:
            prompt.positions, prompt.delta = rope_index(
                prompt.ids.tolist(), self.ids, image_grids=prompt.image_grids,
                audio_mel_frames=prompt.audio_frames,
            )  # fmt: skip
