"""OpenAI's chat-completions body in, the runtime's request out; its responses and errors out.

A body is turned into one request of the request-file format (runtime/requests.py), so a served
request is validated, sampled and stopped exactly as ``edge-infer`` does it. OpenAI's fields map
to the file's; ``top_k``, ``repetition_penalty``, ``min_tokens`` (vLLM's) and the later stages'
keys the families declare (their prefixes: runtime/family.py) are accepted as extra body fields;
the audio/speech route maps the fields the families declare to their request controls.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import soundfile as sf

from edgeomni.runtime.audio import encoded, read_wav
from edgeomni.runtime.families import REQUEST_KEYS as FAMILY_KEYS
from edgeomni.runtime.families import STAGE_PREFIXES
from edgeomni.runtime.media import MediaError
from edgeomni.runtime.media.image import image_size
from edgeomni.runtime.requests import BadRequest, Request, lone_surrogate, parse_request_file

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repetition_penalty", "seed")
# fields OpenAI's clients send that change nothing here, or only at their default
IGNORED = ("model", "user", "stream_options", "store", "metadata", "service_tier")
DEFAULT_ONLY = {"n": 1, "logprobs": False, "presence_penalty": 0, "frequency_penalty": 0,
                "parallel_tool_calls": True}  # fmt: skip
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "response_format",
               "logit_bias", "top_logprobs", "prediction")  # fmt: skip
CHAT_AUDIO_FORMATS = ("wav", "pcm16", "flac")  # message.audio's; a stream's deltas are pcm16
KNOWN = ("messages", "stream", "max_tokens", "max_completion_tokens", "min_tokens", "stop",
         "modalities", "audio", "context_cache_key", *SAMPLING_FIELDS, *IGNORED, *DEFAULT_ONLY,
         *UNSUPPORTED)  # fmt: skip
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


class ApiError(Exception):
    """An error answered with OpenAI's error body: ``status``, a message, the field at fault,
    and OpenAI's ``code`` where it has one (``model_not_found``)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.code = code

    def body(self) -> dict[str, Any]:
        # a client's lone surrogate echoed back would make the body unencodable as UTF-8
        return {"error": {"message": _printable(self.message), "type": self.kind,
                          "param": None if self.param is None else _printable(self.param),
                          "code": self.code}}  # fmt: skip


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_unicode(body: Any) -> None:
    """A 400 naming the first string of a parsed JSON body (a key or a value, at any depth)
    that is not valid Unicode text: JSON's ``\\udc80`` escapes can make a lone surrogate, which
    no tokenizer or UTF-8 writer takes."""
    found = lone_surrogate(body)
    if found is None:
        return
    name = found.where or "the body"
    if found.key:
        raise ApiError(400, f"{name}: a field name is not valid Unicode text (a lone surrogate "
                       f"in {found.text!r})", found.where or None)  # fmt: skip
    raise ApiError(400, f"{name}: not valid Unicode text (a lone surrogate at character "
                   f"{found.index})", found.where or None)  # fmt: skip


def chat_audio(body: Mapping[str, Any]) -> str | None:
    """The audio format a chat body asks for (``modalities`` with "audio", and ``audio:
    {voice, format}``), or None for text only; an ApiError naming the field."""
    modalities = body.get("modalities") or ["text"]
    if not isinstance(modalities, list) or not all(isinstance(m, str) for m in modalities) or \
            not set(modalities) <= {"text", "audio"} or "text" not in modalities:  # fmt: skip
        raise ApiError(400, 'modalities must be ["text"] or ["text", "audio"]', "modalities")
    audio = body.get("audio")
    if "audio" not in modalities:
        if audio is not None:
            raise ApiError(400, 'audio goes with modalities ["text", "audio"]', "audio")
        return None
    if not isinstance(audio, Mapping) or not isinstance(audio.get("voice"), str):
        raise ApiError(400, "audio must be an object with a voice", "audio.voice")
    fmt = audio.get("format", "wav")
    if fmt not in CHAT_AUDIO_FORMATS:
        raise ApiError(400, f"audio.format must be one of {', '.join(CHAT_AUDIO_FORMATS)}, "
                       f"got {fmt!r}", "audio.format")  # fmt: skip
    if body.get("stream") is True and fmt != "pcm16":
        raise ApiError(400, "a streamed reply's audio is pcm16", "audio.format")
    return fmt


class Media:
    """Where a request's inline media go: files in ``folder`` (the runtime reads media parts
    from files), within the server's limits; the caller removes the folder once the request
    has left. ``labels`` maps each file to the part it came from, so no error a client sees
    holds a server-side path."""

    def __init__(self, folder: Path, max_audio_s: float, max_pixels: int) -> None:
        self.folder, self.max_audio_s, self.max_pixels = folder, max_audio_s, max_pixels
        self.labels: dict[str, str] = {}

    def _write(self, data: bytes, suffix: str, where: str) -> Path:
        path = self.folder / f"part{len(self.labels) + 1}{suffix}"
        self.labels[str(path)] = where
        path.write_bytes(data)
        return path

    def image(self, url: Any, where: str) -> str:
        match = re.match(r"data:image/([\w.+-]+);base64,(.*)$", url, re.S) if isinstance(
            url, str) else None  # fmt: skip
        if match is None:
            raise ApiError(400, "an image must be a data URL (data:image/...;base64,...): no "
                           "URL is fetched", where)  # fmt: skip
        path = self._write(_b64(match.group(2), where), "." + match.group(1).split("+")[0], where)
        try:  # its header: no image, or one over the cap, is refused before it is decoded
            image_size(path, self.max_pixels)
        except ImportError:
            raise ApiError(400, "this server reads no images (the image extra is missing)",
                           where) from None  # fmt: skip
        except (OSError, ValueError) as e:  # a MediaError names the file, which app.py scrubs
            raise ApiError(400, str(e) if isinstance(e, MediaError) else
                           f"not an image: {_reason(e, path)}", where) from None  # fmt: skip
        return str(path)

    def audio(self, part: Any, where: str) -> str:
        if not isinstance(part, Mapping) or not isinstance(part.get("data"), str):
            raise ApiError(400, "input_audio must be {data: base64, format}", where)
        fmt = part.get("format", "wav")
        if fmt not in ("wav", "flac"):
            raise ApiError(400, f"input_audio.format must be wav or flac, got {fmt!r}",
                           where + ".format")  # fmt: skip
        data = _b64(part["data"], where + ".data")
        return self._sound(data, "." + fmt, where, where + ".data", f"{fmt} audio")[0]

    def upload(self, data: bytes, name: str | None, where: str) -> tuple[str, float]:
        """An uploaded audio file (any format soundfile reads): its path and seconds."""
        suffix = Path(name or "audio").suffix.lower()
        suffix = suffix if re.fullmatch(r"\.[a-z0-9]{1,5}", suffix) else ".audio"
        return self._sound(data, suffix, where, where, "audio soundfile reads")

    def _sound(self, data: bytes, suffix: str, where: str, field: str,
               what: str) -> tuple[str, float]:  # fmt: skip
        path = self._write(data, suffix, where)
        try:
            seconds = sf.info(str(path)).duration
        except Exception as e:
            raise ApiError(400, f"not {what}: {_reason(e, path)}", field) from None
        if seconds > self.max_audio_s:
            raise ApiError(400, f"the audio is {seconds:.1f} s long; at most "
                           f"{self.max_audio_s:g} s here", where)  # fmt: skip
        try:  # its samples, as the request's preparation reads them (no samples, NaN)
            read_wav(path)
        except (OSError, ValueError) as e:  # a MediaError names the file, which app.py scrubs
            raise ApiError(400, str(e) if isinstance(e, MediaError) else
                           f"not {what}: {_reason(e, path)}", where) from None  # fmt: skip
        return str(path), seconds


def _reason(e: Exception, path: Path) -> str:
    """A decoder's complaint about a file without the file's (server-side) path."""
    text = str(e).replace(repr(str(path)), "").replace(str(path), "")
    return re.sub(r"\s+([:.,])", r"\1", re.sub(r"\s{2,}", " ", text)).strip(" :") or type(
        e).__name__  # fmt: skip


def _b64(data: str, where: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, "not valid base64", where) from None


def _media_message(msg: Any, i: int, media: Media | None) -> Any:
    """A message with OpenAI's media parts (image_url data URLs, input_audio) as the runtime's
    (files in the request's media folder); other parts and messages as they are."""
    parts = msg.get("content") if isinstance(msg, Mapping) else None
    if not isinstance(parts, list):
        return msg
    out = []
    for j, part in enumerate(parts):
        where = f"messages[{i}].content[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("image_url", "input_audio") and media is None:
            raise ApiError(400, f"{kind} parts are not served by this route", where + ".type")
        if kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, Mapping) else url
            out.append({"type": "image", "image": media.image(url, where + ".image_url")})
        elif kind == "input_audio":
            path = media.audio(part.get("input_audio"), where + ".input_audio")
            out.append({"type": "audio", "audio": path})
        elif kind in ("image", "audio", "video"):  # the request file's kinds take paths: not here
            raise ApiError(400, f"a {kind} part takes a path, which is not served here (inline "
                           f"media: image_url, input_audio)", where + ".type")  # fmt: skip
        else:
            out.append(part)
    return {**msg, "content": out}


def _check_fields(body: Any, known: tuple[str, ...]) -> None:
    """A 400 unless ``body`` is an object of Unicode text whose fields are all ``known`` or a
    later stage's (by the prefixes the families declare)."""
    if not isinstance(body, Mapping):
        raise ApiError(400, "the body must be a JSON object")
    check_unicode(body)
    unknown = [k for k in body if k not in known and not k.startswith(STAGE_PREFIXES)]
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r}", unknown[0])


def chat_request(body: Any, index: int, max_tokens: int, media: Media | None = None) -> Request:
    """The runtime request of a chat-completions body; an ApiError (400) naming the field at
    fault. ``max_tokens``: the default and the cap (the build's); ``media``: where inline
    images and audio go (None: none taken)."""
    _check_fields(body, KNOWN)
    for key in UNSUPPORTED:
        if body.get(key) not in (None, [], {}):
            raise ApiError(400, f"{key} is not supported by this server", key)
    for key, default in DEFAULT_ONLY.items():
        if key in body and body[key] not in (None, default):
            raise ApiError(400, f"{key} must be {default!r} here", key)
    if "messages" not in body:
        raise ApiError(400, "messages is required", "messages")
    messages = body["messages"]
    if isinstance(messages, list):
        messages = [_media_message(msg, i, media) for i, msg in enumerate(messages)]
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is None:
        limit = max_tokens
    elif isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= max_tokens:
        key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        raise ApiError(400, f"{key} must be an integer in 1..{max_tokens}, got {limit!r}", key)
    req: dict[str, Any] = {"messages": messages, "max_generate_length": limit}
    if chat_audio(body) is not None:
        req["voice"] = body["audio"]["voice"]
    if "min_tokens" in body:
        req["min_generate_length"] = body["min_tokens"]
    if body.get("stop") is not None:
        req["stop"] = body["stop"]
    if body.get("context_cache_key") is not None:  # the context cache's partition
        req["context_cache_key"] = body["context_cache_key"]
    sampling = {k: body[k] for k in SAMPLING_FIELDS if body.get(k) is not None}
    sampling.update({k: v for k, v in body.items() if k.startswith(STAGE_PREFIXES)})
    if sampling:
        req["sampling"] = sampling
    file: dict[str, Any] = {"requests": [req], "max_generate_length": max_tokens}
    try:
        (parsed,), _ = parse_request_file(file)
    except ValueError as e:  # a top-level fault of what was built here
        raise ApiError(400, str(e)) from None
    if isinstance(parsed, BadRequest):
        raise ApiError(400, parsed.error, _param(parsed.error, body))
    return dataclasses.replace(parsed, index=index)


def message_audio(rid: str, samples: Any, rate: int, fmt: str, transcript: str) -> dict:
    """A reply's ``message.audio``: the whole utterance, base64."""
    data = encoded(samples, rate, "pcm" if fmt == "pcm16" else fmt)
    return {"id": f"audio-{rid}", "data": base64.b64encode(data).decode(), "expires_at": 0,
            "transcript": transcript}  # fmt: skip


def _param(error: str, body: Mapping[str, Any]) -> str | None:
    """The body field an error of the request parser names, in OpenAI's terms."""
    match = re.match(r"([A-Za-z_][\w]*)(\[[^\s:]*|\.[^\s:]*)*", error)
    if match is None:
        return None
    word = match.group(1)
    renamed = {"max_generate_length": "max_tokens", "min_generate_length": "min_tokens",
               "sampling_seed": "seed", "sampling": None}  # fmt: skip
    if word in renamed:
        return renamed[word]
    if word in body or word in SAMPLING_FIELDS:
        return match.group(0)
    return next((k for k in SAMPLING_FIELDS if k in error and k in body), None)


def completion(rid: str, model: str, text: str, finish: str, usage: dict[str, Any],
               audio: dict | None = None) -> dict:  # fmt: skip
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if audio is not None:
        message["audio"] = audio
    return {
        "id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": message,
                     "finish_reason": FINISH.get(finish, finish), "logprobs": None}],
        "usage": usage,
    }  # fmt: skip


def chunk(rid: str, model: str, delta: dict[str, Any], finish: str | None = None,
          usage: dict[str, Any] | None = None) -> dict:  # fmt: skip
    out: dict[str, Any] = {
        "id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None,
                     "finish_reason": None if finish is None else FINISH.get(finish, finish)}],
    }  # fmt: skip
    if usage is not None:
        out["usage"] = usage
    return out


SPEECH_FORMATS = ("wav", "pcm", "flac")
# the speech body's fields that set a request key: voice the speaker, and the fields the
# families declare for their request controls
SPEECH_KEYS = {
    "voice": "speaker",
    "context_cache_key": "context_cache_key",
    **{k.speech_field: key for key, k in FAMILY_KEYS.items() if k.speech_field},
}
SPEECH_FIELDS = ("model", "input", "voice", "response_format", "speed", "stream",
                 "stream_format", *(f for f in SPEECH_KEYS if f != "voice"))  # fmt: skip


def speech_request(body: Any, index: int) -> tuple[Request, str]:
    """The runtime request of an audio/speech body (the text to speak as the user message, as
    edge-infer's --prompt) and the response format; an ApiError (400) naming the field."""
    _check_fields(body, SPEECH_FIELDS)
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise ApiError(400, "input must be a non-empty string", "input")
    fmt = body.get("response_format", "wav")
    if fmt not in SPEECH_FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(SPEECH_FORMATS)}, "
                       f"got {fmt!r}", "response_format")  # fmt: skip
    if body.get("speed", 1.0) != 1.0:
        raise ApiError(400, "speed must be 1.0 here", "speed")
    if body.get("stream_format", "audio") != "audio":
        raise ApiError(400, "stream_format must be 'audio' (raw bytes as they are made)",
                       "stream_format")  # fmt: skip
    req: dict[str, Any] = {"prompt": text}
    for theirs, ours in SPEECH_KEYS.items():
        if body.get(theirs) is not None:
            req[ours] = body[theirs]
    extras = {k: v for k, v in body.items() if k.startswith(STAGE_PREFIXES)}
    if extras:
        req["sampling"] = extras
    try:
        (parsed,), _ = parse_request_file({"requests": [req]})
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    if isinstance(parsed, BadRequest):
        mapped = {**{ours: theirs for theirs, ours in SPEECH_KEYS.items()}, "prompt": "input"}
        word = _param(parsed.error, req)
        raise ApiError(400, parsed.error, mapped.get(word or "", word))
    return dataclasses.replace(parsed, index=index), fmt
