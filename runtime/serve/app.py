"""edge-serve's HTTP side (Starlette): OpenAI's routes over a ``Server``.

- ``GET /``: a page to try the graph in a browser (serve/page.py).
- ``GET /health``: 200 while the scheduler loop runs, 503 once it stopped.
- ``GET /v1/models``: the one model, named after the engine dir.
- ``GET /metrics``: Prometheus's text format (serve/metrics.py).
- ``POST /v1/audio/speech``: a graph that speaks a given text (Qwen3-TTS): wav, pcm or flac,
  whole or (``stream: true``) as raw bytes while the vocoder runs.
- ``POST /v1/audio/transcriptions``: a graph whose text model transcribes speech (Qwen3-ASR):
  OpenAI's multipart form in, json, text or verbose_json out, or streamed transcript deltas
  (serve/transcribe.py).
- ``POST /v1/chat/completions``: text in, text out, and with ``modalities: ["text", "audio"]``
  the spoken reply too (``message.audio``, base64); ``stream: true`` sends server-sent events,
  a chunk per text delta or audio delta (base64 pcm16) and a last one with the finish reason
  and usage.

Errors are OpenAI's error body: 400 for a bad request (the field named; text that is not valid
Unicode too), 401 without the API key when one is set, 404 ``model_not_found`` for a model
other than this one, 429 (with Retry-After) when the server is full, 500 for a request that
failed inside the runtime (the others go on), 503 once the scheduler loop has stopped. No error
holds a server-side path: a request's media files are named by the part they came from. A
request whose client disconnects is cancelled, streamed or not: the loop drops it at its next
turn and its rows are free; one that leaves before its whole body came is counted cancelled
(status 499 in the access log).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import shutil
import struct
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from edgeomni.runtime.audio import encoded, pcm16
from edgeomni.runtime.events import AudioChunk, Failed, Finished, TextDelta
from edgeomni.runtime.media.image import MAX_IMAGE_PIXELS
from edgeomni.runtime.requests import DEFAULT_MAX_GENERATE_LENGTH, Request
from edgeomni.runtime.serve.openai_api import (
    ApiError,
    Media,
    chat_audio,
    chat_request,
    check_unicode,
    chunk,
    completion,
    message_audio,
    speech_request,
)
from edgeomni.runtime.serve.page import page_endpoint
from edgeomni.runtime.serve.server import (
    DONE,
    Busy,
    Pending,
    Server,
    is_busy,
    is_client_error,
    scrub,
    usage_of,
)
from edgeomni.runtime.serve.transcribe import (
    Asked,
    Deltas,
    answer_body,
    read_form,
    sse,
    transcript,
    transcription_form,
    transcription_request,
)

T = TypeVar("T")
MAX_BODY = 32 << 20  # bytes of a request body (inline images and audio included)
AUDIO_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac"}


def make_app(server: Server, *, model: str, api_key: str | None = None,
             max_tokens: int = DEFAULT_MAX_GENERATE_LENGTH, max_audio_s: float = 60.0,
             max_pixels: int = MAX_IMAGE_PIXELS) -> Starlette:  # fmt: skip
    """The ASGI app over a started ``server``, serving one model, ``model`` (a body naming
    another is 404). ``max_tokens``: a request's default and cap; ``max_audio_s`` and
    ``max_pixels``: the largest inline audio and image a request may bring. Inline media go to
    ``app.state.media_root``, made as the app starts and removed as it shuts down."""

    def media_root() -> Path:
        if app.state.media_root is None:  # made here if the server ran no lifespan
            app.state.media_root = Path(tempfile.mkdtemp(prefix="edge-serve-media-"))
        return app.state.media_root

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        media_root()
        try:
            yield
        finally:
            shutil.rmtree(app.state.media_root, ignore_errors=True)
            app.state.media_root = None  # a later start makes another

    where = server.pipe.engine_dir
    # the engine dir as given and resolved, if absolute (never "/": that is every slash)
    engine_dirs = {d: model for d in {str(where), str(where.resolve())} if d.startswith("/")
                   and d != "/"}  # fmt: skip

    def scrubbed(labels: dict[str, str]) -> dict[str, str]:
        """Server-side paths a request's errors may hold -> what its client calls them: its
        media files, the media folder, the engine dir (as the model's name)."""
        return {**engine_dirs, str(media_root()): "(inline media)", **labels}

    def authorised(request: HttpRequest) -> bool:
        if api_key is None:
            return True
        given = request.headers.get("authorization", "")
        return secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode())

    async def health(request: HttpRequest) -> Response:
        if server.running:
            return JSONResponse({"status": "ok", "in_flight": server.in_flight})
        return JSONResponse({"status": "stopped"}, status_code=503)

    async def models(request: HttpRequest) -> Response:
        if not authorised(request):
            return _error(ApiError(401, "a valid API key is required", kind="authentication_error"))
        return JSONResponse({"object": "list", "data": [
            {"id": model, "object": "model", "created": 0, "owned_by": "edgeomni"}]})  # fmt: skip

    async def answer(
        request: HttpRequest,
        make: Callable[[Any, int, Media], tuple[Request, set[str] | None, Any]],
        streamed: Callable[[Pending, Any, list[Any]], Response],
        whole: Callable[[Pending, Any], Awaitable[Response]],
        read: Callable[[HttpRequest], Awaitable[Any]] | None = None,
    ) -> Response:
        """An API request into the server and its answer, or the error answer: the key, the
        JSON body, its model, ``make(body, index, media)`` -> (request, terminals, what the
        answer needs), then ``whole(pending, needs)``; or, streamed, ``streamed(pending, needs,
        seen)`` once its first output came, so a request that fails before it is an error
        status (raw audio bytes have no room for an error). ``read``: the body from the
        request, once its size is checked (default: JSON)."""
        if not authorised(request):
            return _error(ApiError(401, "a valid API key is required", kind="authentication_error"))
        try:
            declared = request.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > MAX_BODY:  # refused before it is read
                raise ApiError(413, f"the body is over {MAX_BODY} bytes")
            raw = await request.body()
            if len(raw) > MAX_BODY:
                raise ApiError(413, f"the body is over {MAX_BODY} bytes")
            body = parsed(raw) if read is None else await read(request)
            check_unicode(body)
            if isinstance(body, dict):
                check_model(body.get("model"))
            index = server.next_index()
            folder = media_root() / f"request-{index}"  # its inline media, removed as it leaves
            media = Media(folder, max_audio_s, max_pixels)
            try:
                req, terminals, extra = make(body, index, media)
                stream = body.get("stream", False)
                if not isinstance(stream, bool):
                    raise ApiError(400, f"stream must be true or false, got {stream!r}",
                                   "stream")  # fmt: skip
                try:
                    pending = server.submit(
                        req,
                        asyncio.get_running_loop(),
                        terminals,
                        lambda: shutil.rmtree(folder, ignore_errors=True),
                    )
                except Busy as e:
                    raise ApiError(429, f"{e}; retry later", kind="rate_limit_error") from None
                except RuntimeError as e:  # the scheduler loop has stopped
                    raise ApiError(503, str(e), kind="server_error") from None
                pending.labels = scrubbed(media.labels)
            except BaseException as e:  # not in the server: its media go now
                shutil.rmtree(folder, ignore_errors=True)
                if isinstance(e, ApiError):
                    e.message = scrub(e.message, scrubbed(media.labels))
                raise
        except ApiError as e:
            if e.status in (400, 404, 413):
                server.metrics.count("invalid")
            return _error(e)
        except ClientDisconnect:  # it left before its whole body came: nobody reads an answer
            server.metrics.count("cancelled")
            return Response(status_code=499)  # nginx's "client closed request", for the log
        if not stream:
            return await _until_disconnect(request, pending, whole(pending, extra))
        seen = await _until_disconnect(request, pending, _until_output(pending))
        failed = next((e for e in seen if isinstance(e, Failed)), None)
        if failed is not None:
            return _error(_failure(failed, pending))
        return streamed(pending, extra, seen)

    def check_model(name: Any) -> None:
        """A body may leave out ``model``; one it names must be this server's (OpenAI's
        servers answer 404 ``model_not_found`` for any other)."""
        if name is None or name == model:
            return
        if not isinstance(name, str):
            raise ApiError(400, f"model must be a string, got {type(name).__name__}", "model")
        raise ApiError(404, f"the model {name!r} does not exist; this server serves {model!r}",
                       "model", code="model_not_found")  # fmt: skip

    def make_chat(body: Any, index: int, media: Media) -> tuple[Request, set[str], str | None]:
        if not server.texts:
            raise ApiError(400, "this graph makes no text (a speech graph)", "messages")
        fmt = chat_audio(body) if isinstance(body, dict) else None
        if fmt is not None and not server.audio:
            raise ApiError(400, "this graph makes no audio", "modalities")
        terminals = server.texts | (server.audio if fmt is not None else set())
        media.folder.mkdir()
        req = chat_request(body, index, max_tokens, media)
        return req, terminals, fmt

    async def chat(request: HttpRequest) -> Response:
        return await answer(
            request, make_chat,
            lambda p, fmt, seen: StreamingResponse(_sse(server, p, model, seen),
                                                   media_type="text/event-stream"),
            lambda p, fmt: _whole(server, p, model, fmt),
        )  # fmt: skip

    def make_speech(body: Any, index: int, media: Media) -> tuple[Request, set[str], str]:
        if not server.audio or server.texts:
            raise ApiError(400, "this graph does not speak a given text (a Qwen3-TTS graph "
                           "does; an omni graph speaks its own reply)", "input")  # fmt: skip
        req, fmt = speech_request(body, index)
        if body.get("stream") is True and fmt == "flac":
            raise ApiError(400, "a streamed response is wav or pcm", "response_format")
        return req, server.audio, fmt

    async def speech(request: HttpRequest) -> Response:
        return await answer(
            request, make_speech,
            lambda p, fmt, seen: StreamingResponse(_audio_stream(p, fmt, seen),
                                                   media_type=AUDIO_TYPES[fmt]),
            lambda p, fmt: _whole(server, p, model, fmt, speech=True),
        )  # fmt: skip

    stt = transcription_form(server.pipe)

    def make_transcription(body: Any, index: int, media: Media) -> tuple[Request, set, Asked]:
        if stt is None:
            raise ApiError(400, "this graph transcribes no speech (an ASR graph does)", "file")
        media.folder.mkdir()
        req, asked = transcription_request(body, index, media, max_tokens, stt)
        return req, server.texts, asked

    async def transcriptions(request: HttpRequest) -> Response:
        return await answer(
            request, make_transcription,
            lambda p, asked, seen: StreamingResponse(
                sse(_transcript_events(server, p, stt, asked, seen)),
                media_type="text/event-stream"),
            lambda p, asked: _whole_transcript(server, p, stt, asked),
            read=read_form,
        )  # fmt: skip

    async def metrics(request: HttpRequest) -> Response:
        text = server.metrics.render(server.in_flight, server.capacity, lambda: server.running)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    app = Starlette(lifespan=lifespan, routes=[
        Route("/", page_endpoint(server, max_tokens=max_tokens, max_audio_s=max_audio_s),
              methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/audio/speech", speech, methods=["POST"]),
        Route("/v1/audio/transcriptions", transcriptions, methods=["POST"]),
    ])  # fmt: skip
    app.state.media_root = None  # where requests' inline media are kept, once made
    return app


def _error(e: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status == 429 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def parsed(raw: bytes) -> Any:
    """A request body's JSON; a 400 saying what is wrong with it."""
    try:
        return json.loads(raw)
    except UnicodeDecodeError as e:
        bad = e.object[e.start : e.start + 1]
        raise ApiError(400, f"the body is not UTF-8 text (byte 0x{bad.hex()} at offset "
                       f"{e.start})") from None  # fmt: skip
    except RecursionError:
        raise ApiError(400, "the body is not JSON this server reads: it nests too deeply") from None
    except ValueError as e:
        raise ApiError(400, f"the body is not JSON: {e}") from None


async def _events(pending: Pending, seen: list[Any] | None = None) -> AsyncIterator[Any]:
    """A request's events until it leaves the graph, those ``seen`` already first; cancelled
    if the caller stops reading."""
    try:
        for event in seen or ():
            if event is DONE:
                return
            yield event
        while (event := await pending.events.get()) is not DONE:
            yield event
    finally:
        if pending.state is None:  # the client left first: the loop drops it next turn
            pending.cancelled = True


async def _until_disconnect(request: HttpRequest, pending: Pending, answer: Awaitable[T]) -> T:
    """A whole (non-streamed) answer, or what a streamed one waits for before it starts, its
    request cancelled if the client goes away first: the server learns of that from the
    connection (ASGI's http.disconnect), as no response is being written to it yet."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        if pending.state is None:  # still in the graph: the loop drops it next turn
            pending.cancelled = True

    watcher = asyncio.create_task(watch())
    try:
        return await answer
    finally:
        watcher.cancel()


def _failure(event: Failed, pending: Pending) -> ApiError:
    if is_busy(event):
        return ApiError(429, f"{event.error}; retry later", kind="rate_limit_error")
    error = scrub(event.error, pending.labels)  # no server-side path reaches the client
    if is_client_error(event):  # a media part it names is the field at fault
        parts = [w for path, w in pending.labels.items() if path in event.error]
        return ApiError(400, error, next((w for w in parts if w.startswith("messages[")), None))
    return ApiError(500, f"{event.stage}: {error}", kind="server_error")


async def _whole(
    server: Server, pending: Pending, model: str, fmt: str | None, *, speech: bool = False
) -> Response:
    """A request's answer once it has left: the chat completion (with ``fmt``, its spoken reply
    in it), or with ``speech`` the audio alone, in ``fmt``."""
    rid = f"chatcmpl-{pending.index}"
    text, finish, failed, pieces, rate = [], "stop", None, [], 24000
    async for event in _events(pending):  # to the end: the request has left when it answers
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, AudioChunk):
            pieces.append(event.samples)
            rate = event.sample_rate
        elif isinstance(event, Finished) and event.stage in server.text_stages:
            finish = event.reason
        elif isinstance(event, Failed):
            failed = _failure(event, pending)
    if failed is not None:
        return _error(failed)
    samples = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    if speech:
        return Response(encoded(samples, rate, fmt), media_type=AUDIO_TYPES[fmt])
    usage = usage_of(pending.state, server.texts)
    audio = None if fmt is None else message_audio(rid, samples, rate, fmt, "".join(text))
    return JSONResponse(completion(rid, model, "".join(text), finish, usage, audio))


async def _whole_transcript(server: Server, pending: Pending, stt: Any, asked: Asked) -> Response:
    """A transcription's answer once its request has left: json, text or verbose_json."""
    text, failed = [], None
    async for event in _events(pending):
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, Failed):
            failed = _failure(event, pending)
    if failed is not None:
        return _error(failed)
    body = answer_body(stt, "".join(text), asked, usage_of(pending.state, server.texts))
    if isinstance(body, str):
        return PlainTextResponse(body)
    return JSONResponse(body)


async def _transcript_events(
    server: Server, pending: Pending, stt: Any, asked: Asked, seen: list[Any]
) -> AsyncIterator[tuple[str, Any]]:
    """A streamed transcription's items: ("delta", text) as the transcript grows, ("done",
    (transcript, usage)) at its end, or ("error", body) for a failure after the first output."""
    deltas = Deltas(stt)
    text = []
    async for event in _events(pending, seen):
        if isinstance(event, TextDelta) and event.text:
            text.append(event.text)
            if grown := deltas.add(event.text):
                yield "delta", grown
        elif isinstance(event, Failed):
            yield "error", _failure(event, pending).body()
            return
    words = transcript(stt, "".join(text), asked)[1]
    if rest := deltas.finish(words):
        yield "delta", rest
    yield "done", (words, usage_of(pending.state, server.texts))


async def _until_output(pending: Pending) -> list[Any]:
    """A request's events up to its first text or audio, a failure or its end (DONE): what a
    streamed answer waits for before its status (200, or the failure's) is sent."""
    seen: list[Any] = []
    while True:
        seen.append(event := await pending.events.get())
        if event is DONE or isinstance(event, Failed):
            return seen
        if isinstance(event, TextDelta) and event.text:
            return seen
        if isinstance(event, AudioChunk) and event.samples.size:
            return seen


async def _sse(server: Server, pending: Pending, model: str, seen: list[Any]) -> AsyncIterator[str]:
    rid = f"chatcmpl-{pending.index}"

    def line(obj: Any) -> str:
        return f"data: {json.dumps(obj)}\n\n"

    yield line(chunk(rid, model, {"role": "assistant", "content": ""}))
    finish, failed = "stop", None
    async for event in _events(pending, seen):
        if isinstance(event, TextDelta) and event.text:
            yield line(chunk(rid, model, {"content": event.text}))
        elif isinstance(event, AudioChunk) and event.samples.size:
            data = base64.b64encode(pcm16(event.samples)).decode()
            yield line(chunk(rid, model, {"audio": {"id": f"audio-{rid}", "data": data}}))
        elif isinstance(event, Finished) and event.stage in server.text_stages:
            finish = event.reason
        elif isinstance(event, Failed):  # headers are sent: the error goes in the stream
            failed = _failure(event, pending)
    if failed is not None:
        yield line(failed.body())
        return
    yield line(chunk(rid, model, {}, finish, usage_of(pending.state, server.texts)))
    yield "data: [DONE]\n\n"


def _wav_header(rate: int) -> bytes:
    """A 16-bit mono WAV header for a stream of unknown length (sizes at their maximum, as
    streaming players expect)."""
    return struct.pack("<4sI8sIHHIIHH4sI", b"RIFF", 0xFFFFFFFF, b"WAVEfmt ",
                       16, 1, 1, rate, rate * 2, 2, 16, b"data", 0xFFFFFFFF)  # fmt: skip


async def _audio_stream(pending: Pending, fmt: str, seen: list[Any]) -> AsyncIterator[bytes]:
    """The audio's bytes as the vocoder makes them (wav: a header first), from the events
    ``seen`` already on. A failure after the first bytes can only end the stream early."""
    started = False
    async for event in _events(pending, seen):
        if isinstance(event, AudioChunk):
            if not started and fmt == "wav":
                yield _wav_header(event.sample_rate)
            started = True
            if event.samples.size:
                yield pcm16(event.samples)
