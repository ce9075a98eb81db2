"""The media hook of a vision-language LLM (Qwen3-VL's, and Qwen3.5's, whose processor and
positions are Qwen3-VL's): the shared hook (runtime/media/hook.py) reading images and
videos through the visual encoder, with Qwen3VLProcessor's video layout (each temporal group of
frames ``<t seconds><|vision_start|>`` + its placeholder tokens + ``<|vision_end|>``, in place of
the template's ``<|vision_start|><|video_pad|><|vision_end|>``) and
get_rope_index's positions (runtime/media/mrope.py), done on the host."""

from __future__ import annotations

from edgeomni.runtime.media.hook import Encoded, MediaHook, Span
from edgeomni.runtime.media.mrope import vision_rope_index
from edgeomni.runtime.prompt import MediaPart, Prompt


class VisionMedia(MediaHook):
    """Images and videos through the LLM's visual encoder, Qwen3VLProcessor's layout."""

    TOKENS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    KINDS = ("image", "video")

    def pieces(self, part: MediaPart, encoded: Encoded) -> list[Span | list[int]]:
        """An image's rows; a video's frames, one temporal group at a time after its time."""
        if part.kind != "video":
            return super().pieces(part, encoded)
        _, h, w = encoded.extent
        merge = self.encoder("visual").merge
        n = h * w // (merge * merge)
        start, end = self.tokens["vision_start_token_id"], self.tokens["vision_end_token_id"]
        out: list[Span | list[int]] = []
        for f, seconds in enumerate(encoded.times):
            rows = slice(f * n, (f + 1) * n)
            deep = None if encoded.deepstack is None else encoded.deepstack[:, rows]
            out += [self.tokenizer.encode(f"<{seconds:.1f} seconds>"), [start],
                    Span(encoded.rows[rows], deep), [end]]  # fmt: skip
        return out

    def wrapper(self, part: MediaPart) -> tuple[int, int] | None:
        """A video's frames each have a start and an end token, so the template's pair around the
        video's placeholder goes, as Qwen3VLProcessor drops it (transformers >= 5.25, and the
        model's original processor; 5.24 kept it)."""
        if part.kind != "video":
            return None
        return self.tokens["vision_start_token_id"], self.tokens["vision_end_token_id"]

    def positions(self, prompt: Prompt) -> None:
        if prompt.image_grids or prompt.video_grids:
            prompt.positions, prompt.delta = vision_rope_index(
                prompt.ids.tolist(), self.tokens["image_token_id"], self.tokens["video_token_id"],
                image_grids=prompt.image_grids, video_grids=prompt.video_grids,
                merge=self.encoder("visual").merge,
            )  # fmt: skip
