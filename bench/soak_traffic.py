"""The soak's requests (bench/soak.py): a bounded set of request templates per family, each
greedy with a fixed length so its answer is known once (edge-infer's path, ``Pipeline.run``,
on the request-file twin of the HTTP body), and the sending and judging of one request.

Every request ends in exactly one outcome:

- ``ok``: 200 and the answer equals edge-infer's (text exactly; audio as many samples, each
  within ``AUDIO_STEPS`` of edge-infer's pcm16: the stateful vocoder streams in chunks as the
  frames come, other groupings under load or across Ray deployments agree within 1e-4, about
  3.3 steps, tests/test_ray_serve_http.py's ``same_audio``)
- ``mismatch``: 200 but another answer
- ``refused``: a bad body answered 4xx with OpenAI's JSON error (a message)
- ``busy``: 429 with the JSON error and Retry-After (the server is full)
- ``left``: the client went away first (mid-stream, or before a whole answer came)
- ``replica``: (``--ray``) failed with a clear status (5xx JSON error, or an error in the
  stream) while a replica had just been killed: in flight at the kill or within its grace
- ``error``: any other status (a 5xx, a 4xx for a good body, a refusal without a message)
- ``lost``: no answer (a timeout, a dropped connection, a stream cut without its end)
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

OUTCOMES = ("ok", "mismatch", "refused", "busy", "left", "replica", "error", "lost")
AUDIO_STEPS = 4  # pcm16 steps a sample may differ from edge-infer's (see the docstring)
OMNI_GREEDY = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 10}
TTS_GREEDY = {"talker_do_sample": 0, "subtalker_dosample": 0, "talker_max_new_tokens": 9}
PROMPTS = ("Hello! How are you today?", "Tell me a story about a fox.", "What is 2 + 2?",
           "Name three colours.")  # fmt: skip
CHAT = "/v1/chat/completions"
SPEECH = "/v1/audio/speech"
STT = "/v1/audio/transcriptions"
MAX_TOKENS = 16  # the servers' --max-tokens: every good request asks for at most this
MAX_AUDIO_S = 3.0  # the servers' --max-audio-seconds
MAX_PIXELS = 64 * 64  # the servers' --max-image-pixels


@dataclass
class Template:
    """One request the soak may send: its route, body (JSON, a multipart form, or raw bytes),
    whether it streams, whether its client leaves early, and for a good one the request-file
    entry edge-infer runs for its answer (``want`` once computed)."""

    family: str
    name: str
    route: str
    body: Any = None  # JSON
    form: dict[str, str] | None = None  # multipart text fields (with ``upload``)
    upload: bytes | None = None
    raw: bytes | None = None
    stream: bool = False
    leave: bool = False
    bad: bool = False
    kind: str = "text"  # text | spoken | speech | transcript
    offline: dict[str, Any] | None = None  # the request-file entry (good templates)
    terminals: tuple[str, ...] | None = None  # Pipeline.run's requested (None: all)
    continue_final: bool = False
    want: dict[str, Any] = field(default_factory=dict)  # text, audio (int16), language


def wav_bytes(seconds: float, seed: int, rate: int = 16000) -> bytes:
    """A mono PCM-16 wav of low noise and a tone (deterministic)."""
    import soundfile as sf

    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    x = 0.2 * np.sin(2 * np.pi * (220 + 110 * seed) * t) + 0.02 * rng.standard_normal(t.size)
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def png_bytes(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    image = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _user(content: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def _chat_pair(family: str, name: str, messages: list, offline_messages: list, tokens: int,
               extra: dict[str, Any], **kw: Any) -> list[Template]:  # fmt: skip
    """A chat template whole, streamed and streamed-then-left (same answer)."""
    body = {"messages": messages, "max_tokens": tokens, **extra}
    offline = {"messages": offline_messages, "max_generate_length": tokens}
    out = []
    for tag, stream, leave in (("", False, False), ("-stream", True, False),
                               ("-leave", True, True)):  # fmt: skip
        b = {**body, "stream": True} if stream else dict(body)
        if stream and "audio" in b:
            b["audio"] = {**b["audio"], "format": "pcm16"}
        out.append(Template(family, name + tag, CHAT, body=b, stream=stream, leave=leave,
                            offline=offline, **kw))  # fmt: skip
    return out


def _bad_chat(family: str) -> list[Template]:
    """Bodies every chat graph refuses: not JSON, wrong types, over the token cap."""
    hi = _user("hi")
    return [
        Template(family, "bad-json", CHAT, raw=b'{"messages": [', bad=True),
        Template(family, "bad-type", CHAT, body={"messages": "hi"}, bad=True),
        Template(family, "bad-temperature", CHAT, body={"messages": hi, "temperature": "hot"},
                 bad=True),  # fmt: skip
        Template(family, "bad-max-tokens", CHAT, body={"messages": hi,
                 "max_tokens": MAX_TOKENS + 1}, bad=True),  # fmt: skip
        Template(family, "bad-model", CHAT, body={"messages": hi, "model": "nope"}, bad=True),
    ]


def templates(family: str, media: Path) -> list[Template]:
    """The family's templates; media files (the same bytes the bodies carry inline) go to
    ``media`` for the offline runs."""
    media.mkdir(parents=True, exist_ok=True)
    greedy = {"temperature": 0, "top_k": 1}
    out: list[Template] = []
    if family == "qwen3":
        for i, prompt in enumerate(PROMPTS):
            out += _chat_pair(family, f"chat{i}", _user(prompt), _user(prompt),
                              4 + 3 * i, greedy)  # fmt: skip
        return out + _bad_chat(family)
    if family == "qwen3_vl":
        for i, (w, h) in enumerate(((64, 48), (40, 40))):
            png = png_bytes(w, h, i)
            (media / f"vl{i}.png").write_bytes(png)
            text = {"type": "text", "text": "What is this?"}
            inline = [{"type": "image_url", "image_url": {
                "url": f"data:image/png;base64,{_b64(png)}"}}, text]  # fmt: skip
            path = [{"type": "image", "image": str(media / f"vl{i}.png")}, text]
            out += _chat_pair(family, f"image{i}", _user(inline), _user(path), 6 + 4 * i, greedy)
        out += _chat_pair(family, "text", _user(PROMPTS[0]), _user(PROMPTS[0]), 8, greedy)
        big = png_bytes(80, 80, 9)  # over --max-image-pixels
        out.append(Template(family, "bad-image-size", CHAT, bad=True, body={"messages": _user([
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_b64(big)}"}}])}))
        return out + _bad_chat(family)
    if family == "qwen3_omni_moe":
        spoken = {**OMNI_GREEDY, "modalities": ["text", "audio"],
                  "audio": {"voice": "ethan", "format": "wav"}}  # fmt: skip
        for i, prompt in enumerate(PROMPTS[:2]):
            out += _chat_pair(family, f"spoken{i}", _user(prompt), _user(prompt), 4 + 2 * i,
                              spoken, kind="spoken", want={"voice": "ethan"})  # fmt: skip
        out += _chat_pair(family, "text", _user(PROMPTS[2]), _user(PROMPTS[2]), 6,
                          OMNI_GREEDY, terminals=("thinker:text",))  # fmt: skip
        wav = wav_bytes(1.0, 1)
        (media / "omni.wav").write_bytes(wav)
        text = {"type": "text", "text": "What do you hear?"}
        inline = [{"type": "input_audio", "input_audio": {"data": _b64(wav), "format": "wav"}},
                  text]  # fmt: skip
        path = [{"type": "audio", "audio": str(media / "omni.wav")}, text]
        out += _chat_pair(family, "audio-in", _user(inline), _user(path), 5, OMNI_GREEDY,
                          terminals=("thinker:text",))  # fmt: skip
        long = wav_bytes(MAX_AUDIO_S + 1, 2)  # over --max-audio-seconds
        out.append(Template(family, "bad-audio-length", CHAT, bad=True, body={"messages": _user([
            {"type": "input_audio", "input_audio": {"data": _b64(long), "format": "wav"}}])}))
        out.append(Template(family, "bad-voice-format", CHAT, bad=True, body={
            "messages": _user("hi"), "modalities": ["text", "audio"], "stream": True,
            "audio": {"voice": "ethan", "format": "wav"}}))  # fmt: skip
        return out + _bad_chat(family)
    if family == "qwen3_tts":
        for i, (text, voice) in enumerate((("Hello there, this is a test.", "vivian"),
                                           ("Good morning to you.", "ryan"))):  # fmt: skip
            offline = {"prompt": text, "speaker": voice, "sampling": TTS_GREEDY}
            body = {"input": text, "voice": voice, **TTS_GREEDY}
            for tag, extra, leave in (("-wav", {"response_format": "wav"}, False),
                                      ("-pcm", {"response_format": "pcm"}, False),
                                      ("-stream", {"response_format": "pcm", "stream": True},
                                       False),
                                      ("-leave", {"response_format": "pcm", "stream": True},
                                       True)):  # fmt: skip
                out.append(Template(family, f"speech{i}{tag}", SPEECH, body={**body, **extra},
                                    stream=bool(extra.get("stream")), leave=leave,
                                    kind="speech", offline=offline))  # fmt: skip
        return out + [
            Template(family, "bad-json", SPEECH, raw=b"input=hello", bad=True),
            Template(family, "bad-voice", SPEECH, body={"input": "Hi there.", "voice": "nobody",
                     **TTS_GREEDY}, bad=True),  # fmt: skip
            Template(family, "bad-format", SPEECH, body={"input": "Hi.", "voice": "vivian",
                     "response_format": "mp3"}, bad=True),  # fmt: skip
            Template(family, "bad-input", SPEECH, body={"input": "", "voice": "vivian"}, bad=True),
            Template(family, "bad-chat", CHAT, body={"messages": _user("hi")}, bad=True),
        ]
    if family == "qwen3_asr":
        for i, (seconds, language) in enumerate(((1.0, None), (1.5, "en"))):
            wav = wav_bytes(seconds, 3 + i)
            (media / f"asr{i}.wav").write_bytes(wav)
            form = {"model": "eng", "temperature": "0"} | ({"language": language}
                                                            if language else {})  # fmt: skip
            want = {"path": str(media / f"asr{i}.wav"), "language": language}
            for tag, stream, leave in (("", False, False), ("-stream", True, False),
                                       ("-leave", True, True)):  # fmt: skip
                f = {**form, "stream": "true"} if stream else dict(form)
                out.append(Template(family, f"asr{i}{tag}", STT, form=f, upload=wav,
                                    stream=stream, leave=leave, kind="transcript",
                                    offline={}, want=dict(want)))  # fmt: skip
        wav = wav_bytes(1.0, 3)
        long = wav_bytes(MAX_AUDIO_S + 1, 5)
        return out + [
            Template(family, "bad-no-file", STT, form={"model": "eng"}, bad=True),
            Template(family, "bad-format", STT, form={"response_format": "srt"}, upload=wav,
                     bad=True),  # fmt: skip
            Template(family, "bad-language", STT, form={"language": "klingon"}, upload=wav,
                     bad=True),  # fmt: skip
            Template(family, "bad-audio-length", STT, form={}, upload=long, bad=True),
            Template(family, "bad-not-form", STT, raw=b'{"file": "x"}', bad=True),
        ]
    raise ValueError(f"no soak templates for the family {family!r}")


def compute_expected(engine: Path, temps: list[Template], threads: int = 1) -> None:
    """Each good template's answer by edge-infer's path (``Pipeline.run``, greedy, one
    request at a time, as edge-infer --batch-size 1 runs a request file, on the servers'
    ``threads``): its ``want``."""
    from edgeomni.runtime.audio import pcm16
    from edgeomni.runtime.engine import Engines
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file
    from edgeomni.runtime.serve.transcribe import Asked, transcript, transcription_form

    pipe = Pipeline(engine, engines=Engines(threads=threads))
    stt = transcription_form(pipe)
    done: dict[str, dict[str, Any]] = {}
    for t in temps:
        if t.bad:
            continue
        file: dict[str, Any] = {"max_generate_length": MAX_TOKENS}
        if t.kind == "transcript":
            messages = stt.messages(t.want["path"], t.want["language"], None)
            file["requests"] = [{"messages": messages, "max_generate_length": MAX_TOKENS,
                                 "sampling": {"temperature": 0.0}}]  # fmt: skip
            file["continue_final_message"] = messages[-1].get("role") == "assistant"
        else:
            entry = dict(t.offline or {})
            if t.kind == "spoken":
                entry["voice"] = t.want["voice"]
            if t.route == CHAT:
                sampling = {k: v for k, v in t.body.items() if k in ("temperature", "top_k")
                            or k.startswith("talker_")}  # fmt: skip
                entry["sampling"] = sampling
            file["requests"] = [entry]
        key = json.dumps([file, t.terminals], sort_keys=True)
        if key not in done:
            requests, _ = parse_request_file(file)
            (o,) = pipe.run(requests, batch_size=1, requested=t.terminals)
            if not o.entry["ok"]:
                raise RuntimeError(f"{t.family} {t.name}: edge-infer failed: {o.entry['error']}")
            want: dict[str, Any] = {"text": o.entry["output_text"]}
            if t.kind == "transcript":
                asked = Asked("json", False, t.want["language"], 0.0)
                want["text"] = transcript(stt, o.entry["output_text"], asked)[1]
            if t.kind in ("spoken", "speech"):
                want["audio"] = np.frombuffer(pcm16(o.audio), np.int16)
                want["rate"] = o.sample_rate
            done[key] = want
        t.want = {**t.want, **done[key]}


def audio_diff(got: np.ndarray, want: np.ndarray) -> int | None:
    """The largest difference of two pcm16 sample runs, in steps (None: not as many)."""
    if got.size != want.size or got.size == 0:
        return None
    return int(np.abs(got.astype(np.int32) - want).max())


def _wav_int16(data: bytes) -> np.ndarray:
    import soundfile as sf

    samples, _ = sf.read(io.BytesIO(data), dtype="int16")
    return samples


def judge(t: Template, text: str | None, audio: np.ndarray | None) -> dict[str, Any]:
    """The outcome of a whole 200 answer against edge-infer's."""
    problems = []
    if text is not None and text != t.want.get("text"):
        problems.append(f"text {text!r} != {t.want.get('text')!r}")
    extra = {}
    if "audio" in t.want:
        got = audio if audio is not None else np.zeros(0, np.int16)
        diff = audio_diff(got, t.want["audio"])
        extra = {"audio_diff": diff, "audio_exact": diff == 0}
        if diff is None or diff > AUDIO_STEPS:
            problems.append(f"audio of {got.size} samples, {diff} steps from edge-infer's "
                            f"{t.want['audio'].size}")  # fmt: skip
    if problems:
        return {"outcome": "mismatch", "detail": "; ".join(problems), **extra}
    return {"outcome": "ok", **extra}


def _clear_error(status: int, body: bytes, headers: Any) -> str | None:
    """Why an error answer is not clear (OpenAI's JSON error with a message; a 429 also
    Retry-After), or None."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"{status} without OpenAI's JSON error: {body[:120]!r}"
    if not isinstance(message, str) or not message:
        return f"{status} with an empty message"
    if status == 429 and "retry-after" not in headers:
        return "429 without Retry-After"
    return None


def _error_outcome(t: Template, status: int, body: bytes, headers: Any) -> dict[str, Any]:
    unclear = _clear_error(status, body, headers)
    if unclear is not None:
        return {"outcome": "error", "detail": unclear}
    detail = json.loads(body)["error"]["message"]
    if status == 429:
        return {"outcome": "busy"}
    if t.bad and 400 <= status < 500:
        return {"outcome": "refused", "detail": detail}
    return {"outcome": "error", "detail": detail, "failed": status >= 500}


def _post_kwargs(t: Template) -> dict[str, Any]:
    if t.raw is not None:
        return {"content": t.raw, "headers": {"content-type": "application/json"}}
    if t.form is not None:
        files = None if t.upload is None else {"file": ("clip.wav", t.upload, "audio/wav")}
        return {"data": t.form, "files": files}
    return {"json": t.body}


def _sse_payloads(line: str) -> Any:
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    return "[DONE]" if data == "[DONE]" else json.loads(data)


async def _streamed(t: Template, r: Any) -> dict[str, Any]:
    """Read a streamed 200 answer: text/audio pieces until its end ([DONE] or the bytes' end);
    a client that leaves goes after its first piece."""
    text, audio, done, error, final = [], [], False, None, None
    if t.route == SPEECH:
        async for piece in r.aiter_bytes():
            audio.append(piece)
            if t.leave and piece:
                return {"outcome": "left"}
        pcm = np.frombuffer(b"".join(audio), np.int16)
        return judge(t, None, pcm)
    async for line in r.aiter_lines():
        item = _sse_payloads(line)
        if item is None:
            continue
        if item == "[DONE]":
            done = True
            break
        if "error" in item:
            error = item["error"]
            break
        if t.route == STT:
            if item.get("type") == "transcript.text.delta":
                text.append(item["delta"])
            elif item.get("type") == "transcript.text.done":
                final = item["text"]
        else:
            delta = item["choices"][0]["delta"]
            text.append(delta.get("content") or "")
            if delta.get("audio"):
                audio.append(base64.b64decode(delta["audio"]["data"]))
        if t.leave and (any(text) or audio):
            return {"outcome": "left"}
    if error is not None:
        if not isinstance(error, dict) or not error.get("message"):
            return {"outcome": "error", "detail": f"an unclear error in the stream: {error}"}
        return {"outcome": "error", "detail": f"in the stream: {error}", "failed": True}
    if not done:
        return {"outcome": "lost", "detail": "the stream ended without [DONE]"}
    joined = "".join(text)
    if t.route == STT and joined != final:
        return {"outcome": "mismatch", "detail": f"deltas {joined!r} != done {final!r}"}
    pcm = np.frombuffer(b"".join(audio), np.int16) if t.kind == "spoken" else None
    return judge(t, joined, pcm)


async def _whole(t: Template, r: Any) -> dict[str, Any]:
    body = await r.aread()
    if t.route == SPEECH:
        fmt = t.body.get("response_format", "wav")
        return judge(t, None, _wav_int16(body) if fmt == "wav" else np.frombuffer(body, np.int16))
    answer = json.loads(body)
    if t.route == STT:
        return judge(t, answer["text"], None)
    message = answer["choices"][0]["message"]
    audio = None
    if t.kind == "spoken":
        audio = _wav_int16(base64.b64decode(message["audio"]["data"])) if message.get(
            "audio") else np.zeros(0, np.int16)  # fmt: skip
    return judge(t, message["content"], audio)


async def send(client: Any, url: str, t: Template, timeout: float, leave_after: float | None
               ) -> dict[str, Any]:  # fmt: skip
    """One request: its outcome (``OUTCOMES``) with ``status`` and ``detail`` where known.
    ``leave_after``: a whole (non-streamed) request's client gives up after that long."""
    import httpx

    async def go() -> dict[str, Any]:
        async with client.stream("POST", url + t.route, **_post_kwargs(t)) as r:
            if r.status_code != 200:
                return {"status": r.status_code, **_error_outcome(
                    t, r.status_code, await r.aread(), r.headers)}  # fmt: skip
            if t.bad:
                await r.aread()
                return {"status": 200, "outcome": "error", "detail": "a bad body was taken"}
            judged = await (_streamed(t, r) if t.stream else _whole(t, r))
            return {"status": 200, **judged}

    try:
        if leave_after is not None:
            try:
                return await asyncio.wait_for(go(), leave_after)
            except asyncio.TimeoutError:
                return {"outcome": "left", "detail": f"gave up after {leave_after:.2f} s"}
        return await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        return {"outcome": "lost", "detail": f"no answer in {timeout:.0f} s"}
    except httpx.HTTPError as e:
        return {"outcome": "lost", "detail": f"{type(e).__name__}: {e}"}


def pick(rng: random.Random, temps: list[Template]) -> tuple[Template, float | None]:
    """A template for the next arrival: 1 in 6 a bad body, else a good one (streamed or
    whole; one whose client leaves mid-stream at a third of the others' weight; 1 in 8 of the
    whole ones give up after 0.05-1 s)."""
    bad = [t for t in temps if t.bad]
    good = [t for t in temps if not t.bad]
    if bad and rng.random() < 1 / 6:
        return rng.choice(bad), None
    (t,) = rng.choices(good, weights=[1 / 3 if g.leave else 1.0 for g in good])
    if not t.stream and rng.random() < 1 / 8:
        return t, rng.uniform(0.05, 1.0)
    return t, None
