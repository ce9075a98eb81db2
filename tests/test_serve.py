"""edge-serve driven over HTTP by OpenAI's own Python client, on the tiny Qwen3 CPU build: its
greedy replies equal ``Pipeline.run``'s (what edge-infer writes) for the same requests, streamed
or not and with many clients at once; bad requests get 400 naming the field; a full server
answers 429 and loses no accepted request; a client that disconnects frees its slot."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from serve_process import free_port, wait_healthy  # noqa: E402

from edgeomni.runtime.pipeline import Pipeline  # noqa: E402
from edgeomni.runtime.requests import parse_request_file  # noqa: E402
from edgeomni.runtime.serve.app import make_app  # noqa: E402
from edgeomni.runtime.serve.server import DONE, Server  # noqa: E402
from edgeomni.runtime.serve.warmup import needed, warm_up  # noqa: E402

PROMPTS = ["Hello! How are you?", "Tell me a story about a fox.", "What is two plus two?",
           "The capital of France is", "Write a haiku.", "Count to ten.", "Why is the sky blue?",
           "Say something nice."]  # fmt: skip
LENGTHS = (3, 5, 8, 12)  # max_tokens of the offline runs: 8 prompts x 4 = 32 requests
MODEL = "tiny-qwen3"


def start(engine: Path, *, batch_size: int, max_queue: int, api_key: str | None = None,
          step_s: float = 0.0, slow: str = "llm", warm: bool = False,
          **options: Any) -> Any:  # fmt: skip
    """A server over the engine dir on a free localhost port, its loop and uvicorn on threads.
    ``step_s``: each step of stage ``slow`` takes at least this long (a test's time to act
    while a request runs). ``warm``: edge-serve's warm-up first (edge-serve --warmup on).
    ``options``: the Pipeline's."""
    pipe = Pipeline(engine, **options)
    server = Server(pipe, batch_size=batch_size, max_queue=max_queue)
    if step_s:
        pipe.open({slow})
        stage = pipe.slot_stage(slow)
        step = stage.step
        stage.step = lambda slots: (time.sleep(step_s), step(slots))[1]
    server.start()
    if warm:
        warm_up(server, batch_size=batch_size, tokens=3, frames=6)
    app = make_app(server, model=MODEL, api_key=api_key, max_tokens=48, max_audio_s=5.0)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    web = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=web.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not web.started:
        assert time.time() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    def stop() -> None:
        web.should_exit = True
        thread.join(10)
        server.stop(10)

    return SimpleNamespace(url=url, server=server, stop=stop, media_root=app.state.media_root)


@pytest.fixture(scope="module", autouse=True)
def own_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The module's temp dir (tempfile's and TMPDIR, which edge-serve processes inherit), of
    its own so no other run's files count: once every server here has stopped, it must hold
    no edge-serve folder (media, warm-up). In-process servers once left their media folder
    behind, one each."""
    root = tmp_path_factory.mktemp("tmpdir")
    saved = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = str(root), str(root)
    try:
        yield root
    finally:
        tempfile.tempdir = saved[0]
        if saved[1] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[1]
    left = sorted(p.name for p in root.glob("edge-serve-*"))
    assert not left, f"edge-serve folders left in TMPDIR: {left}"


@pytest.fixture(scope="module")
def served(qwen3_engine: Path) -> Iterator[Any]:
    s = start(qwen3_engine, batch_size=3, max_queue=16)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def offline(qwen3_engine: Path) -> dict[tuple[str, int], tuple[str, int]]:
    """(prompt, max tokens) -> (text, tokens) of edge-infer's path, greedy."""
    pipe = Pipeline(qwen3_engine)
    keys = [(p, n) for p in PROMPTS for n in LENGTHS]
    body = {"requests": [{"messages": [{"role": "user", "content": p}],
                          "max_generate_length": n} for p, n in keys],
            "temperature": 0.0}  # fmt: skip
    requests, _ = parse_request_file(body)
    outcomes = pipe.run(requests, batch_size=3)
    out = {}
    for key, o in zip(keys, outcomes, strict=True):
        assert o.entry["ok"], o.entry["error"]
        out[key] = (o.entry["output_text"], o.entry["stages"]["llm"]["generated_tokens"])
    return out


def client(served: Any, **kw: Any) -> Any:
    return openai.OpenAI(base_url=served.url + "/v1", api_key=kw.pop("api_key", "none"),
                         max_retries=0, **kw)  # fmt: skip


def test_chat_replies_equal_edge_infers(served: Any, offline: dict) -> None:
    c = client(served)
    for prompt in PROMPTS[:3]:
        got = c.chat.completions.create(model=MODEL, temperature=0, max_tokens=12,
                                        messages=[{"role": "user", "content": prompt}])  # fmt: skip
        text, tokens = offline[(prompt, 12)]
        assert got.choices[0].message.content == text
        assert got.choices[0].finish_reason in ("stop", "length")
        assert got.usage.completion_tokens == tokens and got.usage.prompt_tokens > 0
        assert got.model == MODEL and got.object == "chat.completion"


def test_streamed_deltas_join_to_the_reply(served: Any, offline: dict) -> None:
    c = client(served)
    stream = c.chat.completions.create(model=MODEL, temperature=0, max_tokens=12, stream=True,
                                       messages=[{"role": "user", "content": PROMPTS[1]}])  # fmt: skip
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == offline[(PROMPTS[1], 12)][0]
    assert len(chunks) > 2 and chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage.completion_tokens == offline[(PROMPTS[1], 12)][1]


def test_many_clients_at_once_each_get_their_own_reply(served: Any, offline: dict) -> None:
    """32 clients with different prompts and lengths at once (3 rows run, 16 wait, the rest
    are turned away with 429 and retried by the client): each reply is the one that request
    gets offline."""
    keys = [(p, n) for p in PROMPTS for n in LENGTHS]
    c = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=8)

    def ask(key: tuple[str, int]) -> str:
        prompt, n = key
        got = c.chat.completions.create(model=MODEL, temperature=0, max_tokens=n,
                                        messages=[{"role": "user", "content": prompt}])  # fmt: skip
        return got.choices[0].message.content

    with ThreadPoolExecutor(32) as pool:
        replies = list(pool.map(ask, keys))
    assert replies == [offline[k][0] for k in keys]
    assert served.server.in_flight == 0


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 49}, "max_tokens"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "x"}]}, "tools"),
        ({"messages": [{"role": "user", "content": "hi"}], "colour": "red"}, "colour"),
        ({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "data:x"}}],
                    }
                ]
            },
            "messages[0].content[0].image_url",  # not a data URL of an image
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_bad_request_is_400_naming_the_field(served: Any, body: dict, param: str) -> None:
    r = httpx.post(served.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]


def test_a_body_that_is_not_json_is_400(served: Any) -> None:
    r = httpx.post(served.url + "/v1/chat/completions", content=b"{oops", timeout=30)
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]


def test_models_and_health(served: Any) -> None:
    assert client(served).models.list().data[0].id == MODEL
    r = httpx.get(served.url + "/health", timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok"


def test_full_server_429s_and_a_disconnect_frees_the_slot(qwen3_engine: Path) -> None:
    """One row and no queue: while a streamed request runs, another gets 429 with Retry-After
    (nothing lost: the first goes on); the first client then disconnects mid-stream, its
    request is cancelled at the loop's next turn, and the slot serves the next request."""
    s = start(qwen3_engine, batch_size=1, max_queue=0, step_s=0.05)
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[1]}],
                "max_tokens": 48, "stream": True, "min_tokens": 48}  # fmt: skip
        small = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                 "max_tokens": 4, "min_tokens": 4}  # fmt: skip
        with httpx.Client(timeout=30) as http:
            with http.stream("POST", s.url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                lines = r.iter_lines()
                first = next(line for line in lines if line.startswith("data:"))
                assert "assistant" in first
                busy = http.post(s.url + "/v1/chat/completions",
                                 json={**small, "stream": False})  # fmt: skip
                assert busy.status_code == 429 and busy.headers["Retry-After"] == "1"
                assert busy.json()["error"]["type"] == "rate_limit_error"
                next(line for line in lines if line.startswith("data:"))  # still streaming
            # the stream is closed here, mid-reply: the server drops the request
            deadline = time.time() + 20
            while s.server.in_flight:
                assert time.time() < deadline, "the disconnected request kept its slot"
                time.sleep(0.05)
            after = http.post(s.url + "/v1/chat/completions", json=small)
            assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 4
        assert s.server.finished == 2 and s.server.cancelled == 1
    finally:
        s.stop()
    assert s.server.error is None and not s.server.running


@pytest.mark.parametrize("route", ["chat", "speech"])
def test_a_disconnect_cancels_a_whole_request(qwen3_engine: Path, tts_engine: Path,
                                              route: str) -> None:  # fmt: skip
    """A non-streamed request's client that gives up (a read timeout here) cancels it: the loop
    drops it at its next turn, long before it would have ended, and the slot is free again."""
    chat = route == "chat"
    s = start(qwen3_engine if chat else tts_engine, batch_size=1, max_queue=0,
              step_s=0.05, slow="llm" if chat else "talker")  # fmt: skip
    try:
        if chat:
            path, body = "/v1/chat/completions", {
                "messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 48,
                "min_tokens": 48}  # fmt: skip
        else:  # 200 frames at 50 ms: 10 s if it ran to its end
            path, body = "/v1/audio/speech", {"input": "Hello there.", "voice": "vivian",
                                              "talker_max_new_tokens": 200,
                                              "talker_min_new_tokens": 200}  # fmt: skip
        start_s = time.time()
        with pytest.raises(httpx.ReadTimeout), httpx.Client(timeout=0.5) as http:
            http.post(s.url + path, json=body)
        deadline = time.time() + 20
        while s.server.in_flight:
            assert time.time() < deadline, "the abandoned request kept its slot"
            time.sleep(0.02)
        assert time.time() - start_s < 2.0  # at 50 ms a step it had over 2 s to go
        assert s.server.finished == 1 and s.server.cancelled == 1
        assert metric(s.url, 'edgeomni_requests_total{outcome="cancelled"}') == 1
    finally:
        s.stop()
    assert s.server.error is None


def test_api_key(qwen3_engine: Path) -> None:
    s = start(qwen3_engine, batch_size=1, max_queue=1, api_key="sesame")
    try:
        with pytest.raises(openai.AuthenticationError):
            client(s, api_key="wrong").models.list()
        got = client(s, api_key="sesame").chat.completions.create(
            model=MODEL, max_tokens=3, temperature=0,
            messages=[{"role": "user", "content": "hi"}])  # fmt: skip
        assert got.usage.completion_tokens == 3
    finally:
        s.stop()


def test_edge_serve_refuses_what_it_cannot_serve(tmp_path: Path, capsys: Any) -> None:
    """edge-serve exits 2 with one line for an engine dir it cannot open, before any port."""
    from edgeomni.runtime.serve.cli import main, parser

    assert "--max-queue" in parser().format_help()
    assert main(["--config", str(tmp_path / "nothing")]) == 2
    assert "edge-serve:" in capsys.readouterr().err
    assert main(["--config", str(tmp_path), "--max-tokens", "0"]) == 2


def test_max_tokens_stays_within_the_build(qwen3_engine: Path, capsys: Any) -> None:
    """--max-tokens past the text stage's KV cache is refused at start (exit 2, saying the
    capacity); without it, the default is cut to what the cache holds."""
    from edgeomni.runtime.serve.cli import main, token_limit

    server = Server(Pipeline(qwen3_engine), batch_size=1, max_queue=0)
    room = next(s.max_seq for s in server.pipe.graph.stages if s.id == "llm")
    assert token_limit(server, None) == min(256, room - 1)
    assert token_limit(server, room - 1) == room - 1
    with pytest.raises(ValueError, match=f"holds {room} tokens"):
        token_limit(server, room)
    assert main(["--config", str(qwen3_engine), "--max-tokens", str(room)]) == 2
    assert f"at most {room - 1}" in capsys.readouterr().err


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    line = next(x for x in text.splitlines() if x.startswith(name + " "))
    return float(line.split()[-1])


def test_metrics_count_what_happened(served: Any) -> None:
    """/metrics (Prometheus's text format): a request that went through adds to ok, its tokens
    and the first-token histogram; a bad one to invalid; one whose prompt is too long for the
    build (refused while it is prepared) to invalid too."""
    names = ('edgeomni_requests_total{outcome="ok"}', 'edgeomni_requests_total{outcome="invalid"}',
             "edgeomni_generated_tokens_total", "edgeomni_time_to_first_token_seconds_count")  # fmt: skip
    before = [metric(served.url, n) for n in names]
    got = client(served).chat.completions.create(
        model=MODEL, max_tokens=5, temperature=0, messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    bad = httpx.post(served.url + "/v1/chat/completions", json={"messages": []}, timeout=30)
    long = httpx.post(served.url + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "word " * 200}], "max_tokens": 4})  # fmt: skip
    assert bad.status_code == 400 and long.status_code == 400, long.text
    after = [metric(served.url, n) for n in names]
    assert after[0] - before[0] == 1 and after[1] - before[1] == 2
    assert after[2] - before[2] == got.usage.completion_tokens and after[3] - before[3] == 1
    assert metric(served.url, "edgeomni_requests_in_flight") == 0
    assert metric(served.url, "edgeomni_loop_running") == 1
    text = httpx.get(served.url + "/metrics", timeout=30).text
    assert "# TYPE edgeomni_time_to_first_token_seconds histogram" in text
    assert 'edgeomni_time_to_first_token_seconds_bucket{le="+Inf"}' in text


def test_context_cache_shows_in_usage_and_metrics(qwen3_engine: Path) -> None:
    """A chat that begins as an earlier one did reports the prompt tokens the context cache gave
    (OpenAI's usage.prompt_tokens_details.cached_tokens), /metrics counts them; another
    context_cache_key shares nothing; a key that is not a string is a 400 naming it."""
    s = start(qwen3_engine, batch_size=2, max_queue=8, context_cache_mb=16)
    try:
        def chat(question: str, **extra: Any) -> dict:
            body = {"messages": [{"role": "system", "content": "Be brief and kind."},
                                 {"role": "user", "content": question}],
                    "max_tokens": 3, "temperature": 0, **extra}  # fmt: skip
            r = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()["usage"]

        cached = 'edgeomni_prompt_tokens_total{source="cached"}'
        computed = 'edgeomni_prompt_tokens_total{source="computed"}'
        first = chat("Two plus two?")
        assert first["prompt_tokens_details"]["cached_tokens"] == 0
        before = metric(s.url, cached), metric(s.url, computed)
        second = chat("A colour?")
        hit = second["prompt_tokens_details"]["cached_tokens"]
        assert 0 < hit < second["prompt_tokens"]
        assert metric(s.url, cached) - before[0] == hit
        assert metric(s.url, computed) - before[1] == second["prompt_tokens"] - hit
        apart = chat("A colour?", context_cache_key="tenant-b")
        assert apart["prompt_tokens_details"]["cached_tokens"] == 0
        bad = httpx.post(s.url + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "hi"}], "context_cache_key": 7})  # fmt: skip
        assert bad.status_code == 400 and "context_cache_key" in bad.text
    finally:
        s.stop()


GREEDY_SPEECH = {"talker_do_sample": 0, "subtalker_dosample": 0, "talker_max_new_tokens": 9}


def test_speech_equals_edge_infers_audio(tts_engine: Path) -> None:
    """POST /v1/audio/speech on a Qwen3-TTS graph, through the openai client: the audio is the
    one edge-infer makes for the same text and voice (greedy), as pcm, as wav and streamed;
    a chat request or a bad format is 400 on this graph."""
    import io

    import numpy as np
    import soundfile as sf

    from edgeomni.runtime.audio import pcm16

    text, voice = "Hello there, this is a test.", "vivian"
    requests, _ = parse_request_file({"requests": [
        {"prompt": text, "speaker": voice, "sampling": GREEDY_SPEECH}]})  # fmt: skip
    (want,) = Pipeline(tts_engine).run(requests, batch_size=1)
    assert want.entry["ok"], want.entry["error"]
    s = start(tts_engine, batch_size=2, max_queue=2)
    try:
        c = client(s)
        pcm = c.audio.speech.create(model=MODEL, input=text, voice=voice, response_format="pcm",
                                    extra_body=GREEDY_SPEECH).content  # fmt: skip
        assert pcm == pcm16(want.audio) and len(pcm) == 2 * want.audio.size > 0
        wav = c.audio.speech.create(model=MODEL, input=text, voice=voice, response_format="wav",
                                    extra_body=GREEDY_SPEECH).content  # fmt: skip
        samples, rate = sf.read(io.BytesIO(wav), dtype="int16")
        assert rate == want.sample_rate and samples.tobytes() == pcm
        body = {"model": MODEL, "input": text, "voice": voice, "response_format": "pcm",
                "stream": True, **GREEDY_SPEECH}  # fmt: skip
        with httpx.stream("POST", s.url + "/v1/audio/speech", json=body, timeout=60) as r:
            assert r.status_code == 200
            parts = list(r.iter_bytes())
        assert b"".join(parts) == pcm
        for bad, param in (({"input": text, "voice": voice, "response_format": "mp3"},
                            "response_format"), ({"input": "", "voice": voice}, "input"),
                           ({"input": text, "voice": "nobody"}, None)):  # fmt: skip
            r = httpx.post(s.url + "/v1/audio/speech", json=bad, timeout=60)
            assert r.status_code == 400, r.text
            if param is not None:
                assert r.json()["error"]["param"] == param
        chat = httpx.post(s.url + "/v1/chat/completions", timeout=60,
                          json={"messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
        assert np.isclose(metric(s.url, "edgeomni_audio_seconds_total"),
                          3 * want.audio.size / want.sample_rate)  # fmt: skip
    finally:
        s.stop()


def test_omni_chat_speaks_its_reply(omni_engine: Path) -> None:
    """Chat completions with modalities ["text", "audio"] on the tiny Qwen3-Omni: the text and
    the audio (message.audio, base64 wav; streamed, base64 pcm16 deltas) are what edge-infer
    makes for the same request, greedy; a text-only request runs the thinker alone."""
    import base64
    import io

    import soundfile as sf

    from edgeomni.runtime.audio import pcm16

    greedy = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 12}
    prompt, voice = "Hello! How are you today?", "ethan"
    requests, _ = parse_request_file({"requests": [{
        "messages": [{"role": "user", "content": prompt}], "voice": voice,
        "max_generate_length": 8}], **greedy})  # fmt: skip
    (want,) = Pipeline(omni_engine).run(requests, batch_size=1)
    assert want.entry["ok"] and want.audio is not None and want.audio.size > 0
    s = start(omni_engine, batch_size=2, max_queue=2, warm=True)  # the warm-up leaves no trace
    try:
        c = client(s)
        messages = [{"role": "user", "content": prompt}]
        got = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                        modalities=["text", "audio"],
                                        audio={"voice": voice, "format": "wav"},
                                        extra_body=greedy)  # fmt: skip
        message = got.choices[0].message
        assert message.content == want.entry["output_text"]
        assert message.audio.transcript == message.content
        samples, rate = sf.read(io.BytesIO(base64.b64decode(message.audio.data)), dtype="int16")
        assert rate == want.sample_rate and samples.tobytes() == pcm16(want.audio)
        stream = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                           modalities=["text", "audio"], stream=True,
                                           audio={"voice": voice, "format": "pcm16"},
                                           extra_body=greedy)  # fmt: skip
        text, audio = [], []
        for ch in stream:
            delta = ch.choices[0].delta if ch.choices else None
            if delta is None:
                continue
            text.append(delta.content or "")
            # an audio delta is vLLM-Omni's extension: the client keeps it as an extra field
            part = getattr(delta, "audio", None) or (delta.model_extra or {}).get("audio")
            if part:
                data = part["data"] if isinstance(part, dict) else part.data
                audio.append(base64.b64decode(data))
        assert "".join(text) == want.entry["output_text"]
        assert b"".join(audio) == pcm16(want.audio)
        plain = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                          extra_body={"top_k": 1})  # fmt: skip
        assert plain.choices[0].message.content == want.entry["output_text"]
        assert plain.choices[0].message.audio is None
        bad = httpx.post(s.url + "/v1/chat/completions", timeout=60, json={
            "messages": messages, "modalities": ["text", "audio"], "stream": True,
            "audio": {"voice": voice, "format": "wav"}})  # fmt: skip
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "audio.format"
    finally:
        s.stop()


def test_omni_chat_takes_inline_image_and_audio(omni_engine: Path, tmp_path: Path) -> None:
    """An image as a data URL and audio as input_audio (base64), on the tiny Qwen3-Omni: the
    reply is edge-infer's for the same files given by path; the request's files are removed
    once it has left; a URL to fetch, bad base64 and audio over the limit are 400."""
    import base64

    import numpy as np
    import soundfile as sf
    from PIL import Image

    image = (np.random.default_rng(3).random((40, 56, 3)) * 255).astype(np.uint8)
    Image.fromarray(image).save(tmp_path / "i.png")
    t = np.arange(16000) / 16000
    sf.write(tmp_path / "a.wav", 0.3 * np.sin(2 * np.pi * 440 * t), 16000, subtype="PCM_16")
    requests, _ = parse_request_file({"requests": [{"messages": [{"role": "user", "content": [
        {"type": "image", "image": str(tmp_path / "i.png")},
        {"type": "audio", "audio": str(tmp_path / "a.wav")},
        {"type": "text", "text": "What is this?"}]}], "max_generate_length": 6}],
        "top_k": 1})  # fmt: skip
    (want,) = Pipeline(omni_engine).run(requests, batch_size=1, requested=("thinker:text",))
    assert want.entry["ok"], want.entry["error"]
    png = base64.b64encode((tmp_path / "i.png").read_bytes()).decode()
    wav = base64.b64encode((tmp_path / "a.wav").read_bytes()).decode()
    sf.write(tmp_path / "long.wav", np.zeros(6 * 16000), 16000, subtype="PCM_16")
    long = base64.b64encode((tmp_path / "long.wav").read_bytes()).decode()
    s = start(omni_engine, batch_size=2, max_queue=2)
    try:
        content = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                   {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
                   {"type": "text", "text": "What is this?"}]  # fmt: skip
        got = client(s).chat.completions.create(model=MODEL, max_tokens=6, extra_body={"top_k": 1},
                                                messages=[{"role": "user", "content": content}])  # fmt: skip
        assert got.choices[0].message.content == want.entry["output_text"]
        assert not any(s.media_root.iterdir())  # its files went once the request left
        for part, param in (
            ({"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
             "messages[0].content[0].image_url"),
            ({"type": "input_audio", "input_audio": {"data": "@@@", "format": "wav"}},
             "messages[0].content[0].input_audio.data"),
            ({"type": "image", "image": str(tmp_path / "i.png")}, "messages[0].content[0].type"),
            ({"type": "input_audio", "input_audio": {"data": long, "format": "wav"}},
             "messages[0].content[0].input_audio"),  # 6 s, over the server's 5
        ):  # fmt: skip
            r = httpx.post(s.url + "/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": [part]}]})  # fmt: skip
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    finally:
        s.stop()


SLOW_SERVE = """
import sys, time
from edgeomni.runtime import pipeline

opened = pipeline.Pipeline.open


def slow_open(self, ids):  # each llm step takes 50 ms: the test's time to act mid-request
    opened(self, ids)
    stage = self.slot_stage("llm")
    if stage is not None and not hasattr(stage, "slowed"):
        step = stage.step
        stage.step = lambda slots: (time.sleep(0.05), step(slots))[1]
        stage.slowed = True


pipeline.Pipeline.open = slow_open
from edgeomni.runtime.serve.cli import main

sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_drains_what_is_in_flight(qwen3_engine: Path, tmp_path: Path) -> None:
    """SIGTERM to edge-serve mid-stream: it stops taking connections, the streamed request
    runs to its end (every token, then [DONE]), and the process exits 0, its media folder
    removed."""
    import signal
    import subprocess
    import sys
    import tempfile

    def media() -> set[Path]:
        return set(Path(tempfile.gettempdir()).glob("edge-serve-media-*"))

    media_before = media()

    script = tmp_path / "slow_serve.py"
    script.write_text(SLOW_SERVE)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, str(script), "--config", str(qwen3_engine), "--port", str(port),
         "--batch-size", "2", "--max-tokens", "48"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_healthy(proc, url, 60, lambda: "edge-serve did not start")
        body = {"messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": 40,
                "min_tokens": 40, "temperature": 0, "stream": True}  # fmt: skip
        chunks: list[dict] = []
        with httpx.Client(timeout=30) as http, \
                http.stream("POST", url + "/v1/chat/completions", json=body) as r:  # fmt: skip
            assert r.status_code == 200
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            proc.send_signal(signal.SIGTERM)  # 40 steps of 50 ms: most of the reply to come
            time.sleep(0.3)
            with pytest.raises(httpx.ConnectError):  # no new connections while it drains
                httpx.get(url + "/health", timeout=2)
            ended = False
            for line in lines:
                if line == "data: [DONE]":
                    ended = True
                elif line.startswith("data:"):
                    chunks.append(json.loads(line[5:]))
        assert ended, "the stream ended without [DONE]"
        assert chunks[-1]["usage"]["completion_tokens"] == 40
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
        assert media() == media_before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("graph", ["qwen3", "omni", "tts"])
def test_warm_up_runs_every_batch_size_as_a_client_would(
    graph: str, qwen3_engine: Path, omni_engine: Path, tts_engine: Path
) -> None:
    """The warm-up sends 1, 2, .. batch-size requests at once through the server's loop, each
    what a client would send (spoken where the graph speaks), every one of them served in
    full; then the counts start from zero. On a CPU build it is not needed (no CUDA graphs)."""
    from edgeomni.runtime.events import AudioChunk

    engine = {"qwen3": qwen3_engine, "omni": omni_engine, "tts": tts_engine}[graph]
    server = Server(Pipeline(engine), batch_size=2, max_queue=0)
    cohorts: list[int] = []
    audio: list[int] = []
    unread: set[int] = set()  # requests whose end the warm-up has not yet read
    submit, event = server.submit, server.on_event

    def counted_submit(request: Any, loop: Any, terminals: Any = None, cleanup: Any = None) -> Any:
        # a new cohort starts once the warm-up has read the end of every request before it
        # (not once they have left the server: a tiny request can leave between two submits)
        if not unread:
            cohorts.append(0)
        cohorts[-1] += 1
        pending = submit(request, loop, terminals, cleanup)
        unread.add(pending.index)
        get = pending.events.get

        async def counted_get() -> Any:
            event = await get()
            if event is DONE:
                unread.discard(pending.index)
            return event

        pending.events.get = counted_get  # type: ignore[method-assign]
        return pending

    def counted_event(e: Any) -> None:
        if isinstance(e, AudioChunk):
            audio.append(e.samples.size)
        event(e)

    server.submit, server.on_event = counted_submit, counted_event  # type: ignore[method-assign]
    server.start()
    try:
        assert not needed(server)
        done = warm_up(server, batch_size=2, tokens=3, frames=6)
        assert cohorts == [1, 2] and done["requests"] == 3
        assert done["route"] == ("speech" if graph == "tts" else "chat")
        if graph == "qwen3":
            assert not audio
        else:  # the same 6 frames for each of the 3 requests
            assert len(audio) >= 3 and sum(audio) > 0 and sum(audio) % 3 == 0
        assert server.finished == 0 and server.in_flight == 0
        text = server.metrics.render(0, 2, lambda: True)
        assert 'edgeomni_requests_total{outcome="ok"} 0' in text
    finally:
        server.stop(10)
    assert server.error is None
