"""A thinker's prompt, and the hook that prepares its media.

``Prompt`` is what the text model's runner prefills: token ids with each media placeholder
expanded to its encoder's rows, the rows to splice over them, and 3-axis positions when the
model's media need them. How a request's audio and image parts become those is the family's
(each family's runtime package declares its media preparation by the engine config's
``model_type``: runtime/families/, ``MEDIA``); a thinker whose model type declares none reads
text only (``TextOnly``).

A media hook is a class with

- ``check(folder, config, locations)`` (a classmethod): what opening it reads beside the
  thinker's folder, checked without loading an engine (an ArtifactError naming the file);
- ``__init__(folder, config, *, threads, locations, tokenizer)``: the thinker's folder and
  config.json, the ONNX Runtime threads of its engines, the stage config's ``encoders`` (kind
  -> folder relative to the thinker's, or None) and the thinker's tokenizer (for text a hook
  puts into the prompt: Qwen3-VL's video timestamps);
- ``require(parts)``: a RequestError, before anything is rendered or encoded, for media parts
  the thinker cannot read;
- ``expand(ids, parts)``: the rendered prompt's ids and the request's media parts (in the
  order the template renders them) -> a ``Prompt``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from edgeomni.runtime.artifacts import CONFIG, ArtifactError
from edgeomni.runtime.stage import RequestError, load_factory


@dataclass
class Prompt:
    ids: np.ndarray  # int64 [S]
    spans: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (start, rows [n, H])
    deepstack: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (start, [K, n, H])
    positions: np.ndarray | None = None  # [3, S] when an image makes positions 3-D; else 0..S-1
    delta: int = 0  # decode positions are past_len + delta
    image_grids: list[tuple[int, int, int]] = field(default_factory=list)
    audio_frames: list[int] = field(default_factory=list)
    video_grids: list[tuple[int, int, int]] = field(default_factory=list)
    reply_start: str = ""  # a continued assistant message's text: the reply's start, given

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class PromptRows:
    """What a thinker hands its talker with a prompt's embeddings (its first ``HiddenRows``
    event): the prompt's ids, the accept-layer states of its media positions (None for a
    text-only prompt), and its media's image grids and audio frame counts."""

    ids: np.ndarray  # int64 [S]
    hidden: np.ndarray | None  # [S, H] accept-layer states, when the prompt holds media
    image_grids: tuple[tuple[int, int, int], ...] = ()
    audio_frames: tuple[int, ...] = ()


class MediaPart(NamedTuple):
    """An audio, image or video part of a request: its file, and for an image whether it is
    resized to the model's target size (upstream's ``do_resize``; false: it must be that size).
    A video is a file (``path``) or frame image files (``frames``, ``path`` their first),
    with the frames' rate (``fps``) or each frame's time in seconds (``timestamps``)."""

    kind: str
    path: str
    do_resize: bool = True
    frames: tuple[str, ...] = ()
    fps: float | None = None
    timestamps: tuple[float, ...] | None = None

    def files(self) -> tuple[str, ...]:
        """Every file the part reads."""
        return self.frames or (self.path,)


MEDIA_KINDS = ("audio", "image", "video")


def media_parts(messages: Sequence[Mapping[str, Any]]) -> list[MediaPart]:
    """Every audio, image and video part, in the order the template renders them."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            continue
        for part in content:
            kind = part.get("type")
            if kind not in MEDIA_KINDS:
                continue
            value = part[kind]
            frames = tuple(str(f) for f in value) if isinstance(value, list | tuple) else ()
            stamps = part.get("timestamps")
            out.append(MediaPart(
                kind, frames[0] if frames else str(value), bool(part.get("do_resize", True)),
                frames, part.get("fps"), None if stamps is None else tuple(stamps),
            ))  # fmt: skip
    return out


def refuse_media(parts: Sequence[MediaPart]) -> None:
    """The RequestError of a thinker that reads text only, when the request has media parts."""
    kinds = sorted({part.kind for part in parts})
    if kinds:
        raise RequestError(
            f"this model reads text only; the request has {' and '.join(kinds)} parts"
        )


class TextOnly:
    """The media hook of a thinker whose model type declares no media preparation: text only.
    Its folder must not promise media (``media_tokens`` in its config, ``encoders`` in its
    stage config): that would be a build whose family this runtime does not know, not a
    text model."""

    def __init__(
        self,
        folder: Path,
        config: Mapping[str, Any],
        *,
        threads: int | None = None,
        locations: Mapping[str, str] | None = None,
        tokenizer: Any = None,
        max_image_pixels: int | None = None,
    ) -> None:
        self.folder = folder

    @classmethod
    def check(
        cls, folder: Path, config: Mapping[str, Any], locations: Mapping[str, str] | None
    ) -> None:
        from edgeomni.runtime.families import MEDIA

        model_type = config.get("model_type")
        if config.get("media_tokens"):
            raise ArtifactError(
                folder / CONFIG, f"has media_tokens, but its model_type {model_type!r} declares "
                f"no media preparation (the runtime's families declare it for: "
                f"{', '.join(sorted(MEDIA))})"
            )  # fmt: skip
        if locations:
            raise ArtifactError(
                folder / CONFIG, f"the stage config names encoders ({', '.join(locations)}), "
                f"but model_type {model_type!r} reads text only"
            )  # fmt: skip

    def require(self, parts: Sequence[MediaPart]) -> None:
        refuse_media(parts)

    def expand(self, ids: list[int], parts: Sequence[MediaPart]) -> Prompt:
        refuse_media(parts)
        return Prompt(np.asarray(ids, np.int64))


def media_hook(config: Mapping[str, Any]) -> Any:
    """The media hook class for a thinker's config.json: the one its family declares for its
    ``model_type`` (imported now, on first use), else ``TextOnly``."""
    from edgeomni.runtime.families import MEDIA

    factory = MEDIA.get(str(config.get("model_type")))
    return TextOnly if factory is None else load_factory(factory)
