"""OpenAI's ``POST /v1/audio/transcriptions`` on a graph whose text model transcribes speech.

The form's ``file`` becomes the audio part of one request built by the graph's speech-to-text
form (a family's ``transcription``: runtime/family.py), so a served transcription is the same
request edge-infer runs for that audio, language and prompt. Fields: ``file`` (required; any
format soundfile reads: wav, flac, ogg, mp3), ``model``, ``language`` (an ISO-639-1 code or a
name the model knows; none: the model says which), ``prompt`` (context for the model),
``response_format`` (json | text | verbose_json), ``temperature`` (0, the default, is greedy),
``stream`` (server-sent ``transcript.text.delta`` events, then ``transcript.text.done``).
OpenAI's other fields are refused by name (a 400), never ignored.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from edgeomni.runtime.artifacts import CONFIG
from edgeomni.runtime.families import TRANSCRIPTION
from edgeomni.runtime.requests import BadRequest, Request, parse_request_file
from edgeomni.runtime.serve.openai_api import ApiError, Media
from edgeomni.runtime.stage import load_factory

FORMATS = ("json", "text", "verbose_json")
FIELDS = ("file", "model", "language", "prompt", "response_format", "temperature", "stream")
# OpenAI's fields with no counterpart here: a 400 naming them
UNSUPPORTED = ("timestamp_granularities", "timestamp_granularities[]", "include", "include[]",
               "chunking_strategy", "known_speaker_names", "known_speaker_references")  # fmt: skip


def transcription_form(pipe: Any) -> Any | None:
    """The speech-to-text form of the graph's text model (its config's model_type in the
    families' table), or None for a graph that transcribes nothing."""
    for port in pipe.text_terminals():
        stage = pipe.graph.stage(port.split(":")[0])
        config = pipe.engine_dir / stage.artifact / CONFIG
        try:
            model_type = json.loads(config.read_text()).get("model_type")
        except (OSError, ValueError):
            continue  # opening the graph has checked it; a stage without one reads no audio
        factory = TRANSCRIPTION.get(str(model_type))
        if factory is not None:
            form = load_factory(factory)
            return form() if isinstance(form, type) else form
    return None


@dataclasses.dataclass(frozen=True)
class Asked:
    """What a transcription body asks besides its request: the answer's format, streaming,
    and the language it forced (None: the model names it)."""

    fmt: str
    stream: bool
    language: str | None
    seconds: float


def _text_field(form: Mapping[str, Any], key: str) -> str | None:
    value = form.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError(400, f"{key} must be a text field, not a file", key)
    return value


def transcription_request(
    form: Mapping[str, Any], index: int, media: Media, max_tokens: int, stt: Any
) -> tuple[Request, Asked]:
    """The runtime request of a transcription form (field -> text, or for ``file`` (name,
    bytes)); an ApiError (400) naming the field at fault."""
    for key in form:
        if key in UNSUPPORTED:
            raise ApiError(400, f"{key} is not supported by this server", key)
        if key not in FIELDS:
            raise ApiError(400, f"unknown field {key!r}", key)
    upload = form.get("file")
    if not isinstance(upload, tuple):
        raise ApiError(400, "file is required: the audio, as a multipart file field", "file")
    fmt = _text_field(form, "response_format") or "json"
    if fmt not in FORMATS:
        raise ApiError(400, f"response_format must be one of {', '.join(FORMATS)}, got {fmt!r}",
                       "response_format")  # fmt: skip
    stream = form.get("stream", False)  # read_form made "true"/"false" a bool
    if not isinstance(stream, bool):
        raise ApiError(400, f"stream must be true or false, got {stream!r}", "stream")
    if stream and fmt != "json":
        raise ApiError(400, "a streamed transcription is json events; response_format must be "
                       "json", "response_format")  # fmt: skip
    temperature = _text_field(form, "temperature") or "0"
    try:
        temp = float(temperature)
    except ValueError:
        raise ApiError(400, f"temperature must be a number, got {temperature!r}",
                       "temperature") from None  # fmt: skip
    if not 0.0 <= temp <= 2.0:
        raise ApiError(400, f"temperature must be in 0..2, got {temp:g}", "temperature")
    language = _text_field(form, "language") or None
    prompt = _text_field(form, "prompt") or None
    name, data = upload
    path, seconds = media.upload(data, name, "file")
    try:
        messages = stt.messages(path, language, prompt)
    except ValueError as e:
        raise ApiError(400, str(e), "language") from None
    req = {"messages": messages, "max_generate_length": max_tokens,
           "sampling": {"temperature": temp}}  # fmt: skip
    body: dict[str, Any] = {"requests": [req], "max_generate_length": max_tokens}
    if messages and messages[-1].get("role") == "assistant":
        # the form's messages end with the reply's start (Qwen3-ASR's forced language, or an
        # empty assistant turn), which the model continues, as its processor renders them
        body["continue_final_message"] = True
    try:
        (parsed,), _ = parse_request_file(body)
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    if isinstance(parsed, BadRequest):
        raise ApiError(400, parsed.error)
    asked = Asked(fmt, stream, language, seconds)
    return dataclasses.replace(parsed, index=index), asked


def transcript(stt: Any, text: str, asked: Asked) -> tuple[str | None, str]:
    """(language, transcript) of the model's whole reply: the language it names, else the one
    the request forced (a forced language is not repeated in the reply)."""
    language, words = stt.parse(text)
    if language is None and asked.language is not None:
        name = getattr(stt, "language_name", None)  # the form's name for a code it was given
        language = name(asked.language) if name is not None else asked.language
    return language, words


def answer_body(stt: Any, text: str, asked: Asked, usage: dict[str, Any]) -> Any:
    """The whole answer: OpenAI's json ({text, usage}), text, or verbose_json (task, language,
    duration, text; no segments: the model gives no timestamps)."""
    language, words = transcript(stt, text, asked)
    if asked.fmt == "text":
        return words
    if asked.fmt == "verbose_json":
        return {"task": "transcribe", "language": (language or "").lower(),
                "duration": round(asked.seconds, 3), "text": words}  # fmt: skip
    return {"text": words, "usage": {"type": "tokens", "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"]}}  # fmt: skip


class Deltas:
    """The transcript's deltas as the model's text arrives: what ``stt.parse`` makes of the
    text so far, sent once it can only grow (the family's ``partial(text)``: the transcript so
    far, or None while the text is still its header; a form without it is sent whole at the
    end)."""

    def __init__(self, stt: Any) -> None:
        self.stt = stt
        self.text = ""
        self.sent = ""

    def add(self, piece: str) -> str:
        self.text += piece
        partial = getattr(self.stt, "partial", None)
        if partial is None:
            return ""
        so_far = partial(self.text)
        if so_far is None or not so_far.startswith(self.sent):
            return ""
        # hold back trailing whitespace: the whole transcript is stripped
        grown = so_far.rstrip()[len(self.sent) :]
        self.sent += grown
        return grown

    def finish(self, words: str) -> str:
        """The rest of the transcript once the reply is whole."""
        if words.startswith(self.sent):
            return words[len(self.sent) :]
        return ""  # cannot happen for a partial that only grows; nothing is sent twice


async def read_form(request: Any) -> dict[str, Any]:
    """A multipart form as a body: text fields as text (``stream`` "true"/"false" a bool, as a
    JSON body's), a file field as (its name, its bytes); a 400 for a body that is no form."""
    try:
        form = await request.form(max_files=1, max_fields=32)
    except Exception as e:  # Starlette's parser: a malformed body or a missing multipart extra
        raise ApiError(400, f"the body is not a multipart form this server reads: {e}") from None
    out: dict[str, Any] = {}
    try:
        for key, value in form.multi_items():
            if key in out:
                raise ApiError(400, f"field {key!r} is given twice", key)
            if isinstance(value, str):
                flag = value.strip().lower()
                out[key] = (
                    flag == "true" if key == "stream" and flag in ("true", "false") else value
                )
            else:
                out[key] = (value.filename, await value.read())
    finally:
        await form.close()
    return out


async def sse(events: AsyncIterator[tuple[str, Any]]) -> AsyncIterator[str]:
    """OpenAI's transcription stream: ``transcript.text.delta`` events, then
    ``transcript.text.done`` (with usage), then [DONE]; an error body in the stream."""
    async for kind, value in events:
        if kind == "delta":
            body = {"type": "transcript.text.delta", "delta": value}
        elif kind == "done":
            text, usage = value
            body = {"type": "transcript.text.done", "text": text,
                    "usage": {"type": "tokens", "input_tokens": usage["prompt_tokens"],
                              "output_tokens": usage["completion_tokens"],
                              "total_tokens": usage["total_tokens"]}}  # fmt: skip
        else:
            body = value
        yield f"data: {json.dumps(body)}\n\n"
        if kind == "error":
            return
    yield "data: [DONE]\n\n"
