"""The media hook the Qwen3 families' hooks build on (runtime/prompt.py says what a hook has):
token ids with each audio, image or video placeholder expanded to its encoder's token count,
and the encoder rows (and DeepStack features) to splice over those positions. The encoders are
found beside the LLM's folder and opened on first use. A family's hook subclasses ``MediaHook``
for the media kinds it reads (``KINDS``), the token ids its config must name (``TOKENS``), what
a placeholder becomes (``pieces``: the encoder's rows, with text around them where the model
reads some) and its positions (``positions``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from edgeomni.runtime.artifacts import CONFIG, ArtifactError, check_folder, require_keys
from edgeomni.runtime.media import MediaError
from edgeomni.runtime.media.image import MAX_IMAGE_PIXELS
from edgeomni.runtime.prompt import MediaPart, Prompt, refuse_media
from edgeomni.runtime.stage import RequestError

MEDIA_TOKENS = ("image_token_id", "video_token_id", "audio_token_id", "vision_start_token_id",
                "audio_start_token_id")  # fmt: skip
ENCODER_KINDS = ("audio", "visual")


def encoder_dir(folder: Path, locations: Mapping[str, str] | None, kind: str) -> Path | None:
    """Where a thinker's ``kind`` encoder is: the folder its stage config names, else
    ``kind/`` beside it, else ``multimodal/kind/``; None when none holds a config.json."""
    named = [folder / locations[kind]] if locations and kind in locations else []
    for candidate in (*named, folder / kind, folder / "multimodal" / kind):
        if (candidate / CONFIG).is_file():
            return candidate
    return None


def check_encoders(folder: Path, locations: Mapping[str, str] | None) -> None:
    """The encoders found beside a thinker (and any its stage config names) can be opened."""
    from edgeomni.runtime.media.audio_encoder import ARTIFACT as AUDIO
    from edgeomni.runtime.media.visual_encoder import ARTIFACT as VISUAL

    for kind, named in (locations or {}).items():
        if kind not in ENCODER_KINDS:
            raise ArtifactError(folder, f"the stage config names an unknown encoder {kind!r} "
                                f"(known: {', '.join(ENCODER_KINDS)})")  # fmt: skip
        if not (folder / named / CONFIG).is_file():
            raise ArtifactError(
                folder / named / CONFIG, f"missing: the stage config names {named!r} as its "
                f"{kind} encoder"
            )  # fmt: skip
    for kind, artifact in (("audio", AUDIO), ("visual", VISUAL)):
        where = encoder_dir(folder, locations, kind)
        if where is not None:
            check_folder(where, artifact)


class Encoded(NamedTuple):
    """One media part through its encoder: rows [n, H] for its placeholder positions, their
    DeepStack features [K, n, H] (or None), its extent (an audio's mel frames, an image's or a
    video's grid (t, h, w)) and, for a video, the time of each temporal group in seconds."""

    rows: np.ndarray
    deepstack: np.ndarray | None
    extent: Any
    times: tuple[float, ...] = ()


class Span(NamedTuple):
    """Placeholder positions of one piece of a part: encoder rows and their DeepStack rows."""

    rows: np.ndarray
    deepstack: np.ndarray | None


class Loaded(NamedTuple):
    """One media part read and preprocessed, before its encoder runs: for "audio" its log-mel
    [mels, frames] and frame count, for "visual" its patches and grid (t, h, w) (and a
    video's group times)."""

    encoder: str  # "audio" or "visual"
    data: np.ndarray
    extent: Any
    times: tuple[float, ...] = ()


# patches one visual encoder call takes when it encodes the images and videos of several
# requests together (an item larger than this goes alone): bounds the call's activations
VISUAL_PATCHES_PER_CALL = 16384


class MediaHook:
    """A media hook over the audio and visual encoders found beside the LLM, opened on first
    use. Its prompts have plain positions; a subclass sets them (``positions``)."""

    # the media_tokens its config must name (checked when the graph is opened)
    TOKENS: tuple[str, ...] = ("audio_token_id", "image_token_id")
    # the kinds of media parts it reads
    KINDS: tuple[str, ...] = ("audio", "image")

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
        self.folder = folder
        self.max_image_pixels = max_image_pixels  # an image file's cap (image.py)
        self.locations = dict(locations or {})  # kind -> folder relative to the thinker's
        self.threads = threads
        self.tokenizer = tokenizer  # the thinker's (runtime/tokenizer.py), for text a hook adds
        tokens = config.get("media_tokens") or {}
        self.tokens = dict(tokens)  # empty: a build that reads text only
        self.audio_token = tokens.get("audio_token_id")
        self.image_token = tokens.get("image_token_id")
        # each kind's placeholder token
        self.placeholders = {kind: tokens.get(f"{kind}_token_id") for kind in self.KINDS}
        # the prompt tokens the LLM was built for: a clip past it fails before it is encoded
        self.max_input_len = int((config.get("builder_config") or {}).get("max_input_len") or 0)
        self._encoders: dict[str, Any] = {}

    @classmethod
    def check(
        cls, folder: Path, config: Mapping[str, Any], locations: Mapping[str, str] | None
    ) -> None:
        """What opening reads, without loading an engine: the config's media_tokens, and the
        encoders found beside the thinker (and any its stage config names)."""
        if config.get("media_tokens"):
            require_keys(folder / CONFIG, config["media_tokens"], cls.TOKENS,
                         within="media_tokens")  # fmt: skip
        check_encoders(folder, locations)

    def require(self, parts: Sequence[MediaPart]) -> None:
        """A RequestError, before anything is rendered or encoded, for media parts this thinker
        has no encoder for (a build without media_tokens reads text only)."""
        if not self.tokens:
            refuse_media(parts)
        for kind in sorted({part.kind for part in parts}):
            if kind not in self.KINDS:
                raise RequestError(f"this model reads no {kind} (it reads "
                                   f"{', '.join(self.KINDS)}); the request has {kind} parts")  # fmt: skip
            encoder = "audio" if kind == "audio" else "visual"
            if encoder_dir(self.folder, self.locations, encoder) is None:
                raise RequestError(
                    f"this engine dir has no {encoder} encoder ({encoder}/ is missing) for the "
                    f"request's {kind} parts"
                )

    def encoder(self, kind: str) -> Any:
        if kind not in self._encoders:
            where = encoder_dir(self.folder, self.locations, kind)
            if where is None:
                raise RequestError(f"this engine dir has no {kind} encoder ({kind}/ is missing)")
            if kind == "audio":
                from edgeomni.runtime.media.audio_encoder import AudioEncoder as cls
            else:
                from edgeomni.runtime.media.visual_encoder import (
                    VisualEncoder as cls,
                )
            self._encoders[kind] = cls(where, threads=self.threads)
        return self._encoders[kind]

    def expand(self, ids: list[int], parts: list[MediaPart]) -> Prompt:
        """Encode each part and expand its single placeholder token to the encoder's rows (and
        the text the model reads around them, ``pieces``)."""
        if not parts:
            return Prompt(np.asarray(ids, np.int64))
        if not self.tokens:
            refuse_media(parts)
        encoded = self._encode_many([self._load(part) for part in parts])
        for enc in encoded:
            if isinstance(enc, Exception):
                raise enc
        return self._splice(ids, parts, encoded)

    def expand_many(self, items: Sequence[tuple[list[int], list[MediaPart]]]) -> list[Any]:
        """``expand`` for the prompts of requests that arrived together, one result each (a
        Prompt, or the exception that fails that request alone): every part is read first,
        then each encoder runs once for as many of them as a call takes (``_encode_many``)."""
        out: list[Any] = [None] * len(items)
        loaded: list[tuple[int, Loaded]] = []
        for i, (ids, parts) in enumerate(items):
            if not parts:
                out[i] = Prompt(np.asarray(ids, np.int64))
                continue
            try:
                if not self.tokens:
                    refuse_media(parts)
                loaded.extend((i, self._load(part)) for part in parts)
            except Exception as e:
                out[i] = e
        loaded = [(i, item) for i, item in loaded if out[i] is None]
        encoded: dict[int, list[Any]] = {}
        for (i, _), enc in zip(loaded, self._encode_many([x for _, x in loaded]), strict=True):
            encoded.setdefault(i, []).append(enc)
        for i, encs in encoded.items():
            failed = next((e for e in encs if isinstance(e, Exception)), None)
            try:
                if failed is not None:
                    raise failed
                out[i] = self._splice(items[i][0], items[i][1], encs)
            except Exception as e:
                out[i] = e
        return out

    def _splice(self, ids: list[int], parts: list[MediaPart], encoded: list[Encoded]) -> Prompt:
        """The prompt: each placeholder token expanded to its part's ``pieces``."""
        out: list[int] = []
        prompt = Prompt(np.zeros(0, np.int64))
        extents = {"audio": prompt.audio_frames, "image": prompt.image_grids,
                   "video": prompt.video_grids}  # fmt: skip
        queue = list(zip(parts, encoded, strict=True))
        placeholders = {token: kind for kind, token in self.placeholders.items()}
        skip_next = False
        for i, token in enumerate(ids):
            if skip_next:
                skip_next = False
                continue
            if token not in placeholders:
                out.append(token)
                continue
            if not queue:
                raise RequestError("the prompt has more media placeholders than media parts")
            part, enc = queue.pop(0)
            if token != self.placeholders.get(part.kind):
                raise RequestError(f"media placeholders are out of order at {part.path}")
            wrapper = self.wrapper(part)
            if wrapper and out and out[-1] == wrapper[0] and ids[i + 1 : i + 2] == [wrapper[1]]:
                out.pop()  # the pieces bring their own start and end tokens
                skip_next = True
            for piece in self.pieces(part, enc):
                if isinstance(piece, Span):
                    prompt.spans.append((len(out), piece.rows))
                    if piece.deepstack is not None:
                        prompt.deepstack.append((len(out), piece.deepstack))
                    out.extend([token] * len(piece.rows))
                else:
                    out.extend(piece)
            extents[part.kind].append(enc.extent)
        if queue:
            raise RequestError("the chat template rendered no placeholder for some media parts")
        prompt.ids = np.asarray(out, np.int64)
        self.positions(prompt)
        return prompt

    def pieces(self, part: MediaPart, encoded: Encoded) -> list[Span | list[int]]:
        """What a part's placeholder token becomes: token ids (text the model reads) and spans
        of the encoder's rows; here its rows alone."""
        return [Span(encoded.rows, encoded.deepstack)]

    def wrapper(self, part: MediaPart) -> tuple[int, int] | None:
        """The start and end tokens that, right around the part's placeholder in the rendered
        template, its ``pieces`` replace too (they bring their own); here none."""
        return None

    def positions(self, prompt: Prompt) -> None:
        """Set ``prompt.positions`` and ``prompt.delta`` where the model's media need them;
        here none do (positions 0..S-1)."""

    def _check_audio_length(self, path: str, encoder: Any, frames: int) -> None:
        """A RequestError, before the clip is encoded, when its audio tokens alone pass the
        prompt length the LLM was built for (the encoder itself takes any length, a call of
        whole attention windows at a time)."""
        from edgeomni.runtime.media.audio_input import HOP_LENGTH, SAMPLING_RATE

        tokens = encoder.token_count(frames)
        if not self.max_input_len or tokens <= self.max_input_len:
            return
        per_second = encoder.token_count(encoder.chunk_frames) * SAMPLING_RATE / (
            encoder.chunk_frames * HOP_LENGTH)  # fmt: skip
        raise RequestError(
            f"audio {path}: {frames * HOP_LENGTH / SAMPLING_RATE:.2f} s of audio makes {tokens} "
            f"audio tokens; the engine was built for at most {self.max_input_len} prompt "
            f"tokens (--max-input-len), about {self.max_input_len / per_second:.1f} s of audio"
        )

    def _encode_many(self, loaded: Sequence[Loaded]) -> list[Any]:
        """Each loaded part through its encoder, the parts of one encoder in as few calls as
        it takes (audio: AudioEncoder.encode_many; images and videos: packed up to
        VISUAL_PATCHES_PER_CALL patches a call, the visual engine encoding the items of one call
        exactly as alone: attention never crosses an item). One result per part: its Encoded,
        or the exception of the call it was in."""
        out: list[Any] = [None] * len(loaded)
        audio = [i for i, x in enumerate(loaded) if x.encoder == "audio"]
        if audio:
            try:
                rows = self.encoder("audio").encode_many([loaded[i].data for i in audio])
                for i, r in zip(audio, rows, strict=True):
                    out[i] = Encoded(r, None, loaded[i].extent)
            except Exception as e:
                for i in audio:
                    out[i] = e
        calls: list[list[int]] = []
        patches = 0
        for i, x in enumerate(loaded):
            if x.encoder != "visual":
                continue
            if not calls or patches + len(x.data) > VISUAL_PATCHES_PER_CALL:
                calls.append([])
                patches = 0
            calls[-1].append(i)
            patches += len(x.data)
        for call in calls:
            try:
                for i, enc in zip(call, self._visual_call([loaded[i] for i in call]), strict=True):
                    out[i] = enc
            except Exception as e:
                for i in call:
                    out[i] = e
        return out

    def _visual_call(self, items: Sequence[Loaded]) -> list[Encoded]:
        """One visual encoder call for several images or videos, split back per item."""
        visual = self.encoder("visual")
        grids = [tuple(int(g) for g in x.extent) for x in items]
        embeds, deep = visual.encode(np.concatenate([x.data for x in items]), grids)
        unit = visual.merge * visual.merge
        bounds = np.cumsum([0] + [t * h * w // unit for t, h, w in grids])
        return [
            Encoded(embeds[a:b], None if deep is None else deep[:, a:b], grid, x.times)
            for x, grid, a, b in zip(items, grids, bounds[:-1], bounds[1:], strict=True)
        ]

    def _encode(self, part: MediaPart) -> Encoded:
        """One part through its encoder."""
        (enc,) = self._encode_many([self._load(part)])
        if isinstance(enc, Exception):
            raise enc
        return enc

    def _load(self, part: MediaPart) -> Loaded:
        """A part read and preprocessed for its encoder (a RequestError naming it when it
        cannot be read); its audio checked against the build's prompt length first."""
        kind, path = part.kind, part.path
        try:
            if kind == "audio":
                from edgeomni.runtime.audio import read_wav, resample
                from edgeomni.runtime.media.audio_input import (
                    SAMPLING_RATE,
                    audio_features,
                )

                encoder = self.encoder("audio")
                wav, rate = read_wav(path)
                feats, frames = audio_features(
                    resample(wav, rate, SAMPLING_RATE), min_samples=encoder.min_samples
                )
                self._check_audio_length(path, encoder, frames)
                return Loaded("audio", feats, frames)
            if kind == "video":
                return self._load_video(part)
            from edgeomni.runtime.media.image import (
                load_image,
                preprocess,
                smart_resize,
            )

            settings = self._visual("image")[1]
            image = load_image(path, self.max_image_pixels)
            if not part.do_resize:  # the caller resized it: it must be the model's target size
                height, width = image.shape[:2]
                target = smart_resize(
                    height, width, settings.patch_size * settings.merge_size,
                    settings.min_pixels, settings.max_pixels,
                )  # fmt: skip
                if tuple(target) != (height, width):
                    raise RequestError(
                        f"image {path}: do_resize is false, so it must be the model's target "
                        f"size for it, {target[1]}x{target[0]} (width x height); it is "
                        f"{width}x{height}"
                    )
                settings = dataclasses.replace(settings, do_resize=False)
            pixels, grid = preprocess(image, settings)
            return Loaded("visual", pixels, tuple(int(g) for g in grid))
        except (OSError, ValueError, ImportError) as e:  # ImportError: the image/video extra
            if isinstance(e, RequestError):
                raise
            if isinstance(e, MediaError):  # it names the file already
                raise RequestError(str(e)) from None
            raise RequestError(f"{kind} {path}: {e}") from None

    def _load_video(self, part: MediaPart) -> Loaded:
        """A video file (sampled as its processor samples) or frame files, as the visual
        encoder's patches, with each temporal group's time."""
        from edgeomni.runtime.media.video import (
            frame_timestamps,
            load_frames,
            preprocess_video,
            read_video,
        )

        settings = self._visual("video")[1]
        if part.frames:
            video = load_frames(part.frames, part.fps, part.timestamps, self.max_image_pixels)
        else:
            video = read_video(part.path, settings, part.fps)
        times = frame_timestamps(video.indices, video.fps, settings.temporal_patch_size)
        pixels, grid = preprocess_video(video.frames, settings)
        return Loaded("visual", pixels, tuple(int(g) for g in grid), tuple(times))

    def _visual(self, kind: str) -> tuple[Any, Any]:
        """The visual encoder and its ``kind`` ("image" or "video") processor settings."""
        visual = self.encoder("visual")
        settings = getattr(visual, f"{kind}_settings")
        if settings is None:
            raise RequestError(f"the visual engine folder has no {kind}_processor settings")
        return visual, settings
