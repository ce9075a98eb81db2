"""edge-serve's bad flags, addresses, bodies and interrupts, as tables, and a fuzz of bodies.

- CLI rows: ``edge-serve``'s main in this process. Each gives its exit status and one line with
  a fragment of its message, never a traceback; an exit 2 row opens no engine (flags and the
  address are checked before anything heavy runs) and leaves the engine dir and TMPDIR as they
  were.
- HTTP rows: a body sent to a real edge-serve process per tiny build. Each gives its status and
  OpenAI's error body (a fragment of the message, the field), never a server-side path; after
  each, the engine dir is unchanged and no request's media folder is left. The processes
  themselves must end by SIGTERM with exit 0, no traceback and no 500 in their stderr, and
  their media folders removed.
- The fuzz: seeded, mutated chat and speech bodies (types, unicode with lone surrogates, huge
  and empty values, unknown keys, nested parts, raw and invalid UTF-8 bytes) against the same
  processes; every answer is 200 or a JSON 4xx the README documents.
- A second Ctrl-C (or SIGTERM) while draining cuts the requests in flight: one line, 130 (143).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from serve_process import free_port, sigterm, wait_healthy  # noqa: E402
from test_serve import SLOW_SERVE, own_tmpdir, start  # noqa: E402, F401 (autouse: TMPDIR of its own)

from edgeomni.runtime.pipeline import Pipeline  # noqa: E402
from edgeomni.runtime.serve import cli  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"
HI = [{"role": "user", "content": "Hello there"}]
CHAT, SPEECH = "/v1/chat/completions", "/v1/audio/speech"


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


# -- the command line ---------------------------------------------------------------------------
@dataclass(frozen=True)
class CliRow:
    id: str
    argv: Callable[[Path, int], list[str]]  # (engine dir, a port for the row) -> flags
    code: int
    message: str
    listening: bool = False  # another socket listens on the row's port
    patch: Callable[[pytest.MonkeyPatch], None] | None = None  # a fault injected first


def flags(*more: str) -> Callable[[Path, int], list[str]]:
    """A run over the engine on the row's port, with ``more`` flags (later ones win)."""
    return lambda eng, port: ["--config", str(eng), "--port", str(port), "--warmup", "off", *more]


def interrupted_while_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    real = Pipeline.open

    def opening(self: Pipeline, ids: Any) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler raises here
        real(self, ids)

    monkeypatch.setattr(Pipeline, "open", opening)


def warm_up_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(server: Any, **kw: Any) -> None:
        raise RuntimeError("a warm-up request of 1 failed: injected")

    monkeypatch.setattr("edgeomni.runtime.serve.warmup.warm_up", fail)


def app_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(*args: Any, **kw: Any) -> None:
        raise TypeError("a bug")

    monkeypatch.setattr("edgeomni.runtime.serve.app.make_app", bug)


CLI_ROWS = [
    # -- flags, checked before anything is read
    CliRow("port-above-range", flags("--port", "70000"), 2,
           "argument --port: must be 0..65535, got 70000"),
    CliRow("port-negative", flags("--port", "-1"), 2, "argument --port: must be 0..65535, got -1"),
    CliRow("port-not-a-number", flags("--port", "http"), 2, "argument --port: not an integer"),
    CliRow("batch-size-zero", flags("--batch-size", "0"), 2, "argument --batch-size: must be >= 1"),
    CliRow("max-queue-negative", flags("--max-queue", "-1"), 2,
           "argument --max-queue: must be >= 0, got -1"),
    CliRow("max-tokens-zero", flags("--max-tokens", "0"), 2, "argument --max-tokens: must be >= 1"),
    CliRow("max-audio-seconds-zero", flags("--max-audio-seconds", "0"), 2,
           "argument --max-audio-seconds: must be a number of seconds > 0"),
    CliRow("max-audio-seconds-nan", flags("--max-audio-seconds", "nan"), 2,
           "argument --max-audio-seconds: must be a number of seconds > 0, got nan"),
    CliRow("max-image-pixels-zero", flags("--max-image-pixels", "0"), 2,
           "argument --max-image-pixels: must be 1..178956970, got 0"),
    CliRow("max-image-pixels-over-pillows-limit", flags("--max-image-pixels", "178956971"), 2,
           "argument --max-image-pixels: must be 1..178956970, got 178956971"),
    CliRow("stage-patience-negative", flags("--stage-patience", "-2"), 2,
           "argument --stage-patience: must be >= 0"),
    CliRow("threads-zero", flags("--threads", "0"), 2, "argument --threads: must be >= 1"),
    CliRow("threads-above-the-cores", flags("--threads", "100000"), 2,
           "--threads 100000 is more than the"),
    CliRow("vocoder-threads-above-the-cores", flags("--vocoder-threads", "100000"), 2,
           "--vocoder-threads 100000 is more than the"),
    CliRow("vocoder-threads-with-ray", flags("--ray", "--vocoder-threads", "1"), 2,
           "--vocoder-threads is for edge-serve without --ray"),
    CliRow("warmup-unknown", flags("--warmup", "maybe"), 2, "argument --warmup: invalid choice"),
    CliRow("unknown-flag", flags("--colour", "red"), 2, "unrecognized arguments: --colour red"),
    CliRow("placement-without-ray", flags("--placement", "p.json"), 2,
           "--placement, --ray-address, --ray-cpus and --ray-start-timeout go with --ray"),
    CliRow("ray-address-and-local-cpus", flags("--ray", "--ray-address", "auto", "--ray-cpus", "2"),
           2, "--ray-cpus sizes a local cluster; --ray-address joins one"),
    CliRow("ray-start-timeout-zero", flags("--ray", "--ray-start-timeout", "0"), 2,
           "argument --ray-start-timeout: must be a number of seconds > 0, got 0"),
    CliRow("ray-start-timeout-without-ray", flags("--ray-start-timeout", "5"), 2,
           "--placement, --ray-address, --ray-cpus and --ray-start-timeout go with --ray"),
    CliRow("placement-unreadable", flags("--ray", "--placement", "/nonexistent/p.json"), 2,
           "/nonexistent/p.json: $: cannot read /nonexistent/p.json"),
    CliRow("no-config", lambda eng, port: ["--port", str(port)], 2,
           "the following arguments are required: --config"),
    # -- the engine dir and the flags against its build, before the address
    CliRow("config-missing", lambda eng, port: ["--config", str(eng / "nothing")], 2,
           "nothing: No such file or directory"),
    CliRow("batch-size-over-the-build", flags("--batch-size", "4"), 2,
           "--batch-size 4 is over the build's max batch, 3"),
    CliRow("max-tokens-over-the-kv-cache", flags("--max-tokens", "128"), 2,
           "--max-tokens 128 does not fit the build: its KV cache holds 128 tokens"),
    # -- the address, bound before any engine loads
    CliRow("port-in-use", flags(), 2, "the port is in use", listening=True),
    CliRow("host-unknown", flags("--host", "no-such-host.invalid"), 2,
           "--host 'no-such-host.invalid': not an address or a known host name"),
    CliRow("host-not-this-machine", flags("--host", "192.0.2.1"), 2,
           "--host 192.0.2.1: not an address of this machine"),
    # -- after the engines loaded, before the port opens
    CliRow("interrupted-while-loading", flags(), 130, "edge-serve: interrupted",
           patch=interrupted_while_loading),
    CliRow("warm-up-fails", flags("--warmup", "on"), 1,
           "edge-serve: error: the warm-up failed: a warm-up request of 1 failed: injected",
           patch=warm_up_fails),
    CliRow("internal-error", flags(), 1, "edge-serve: error: internal error: TypeError: a bug",
           patch=app_bug),
]  # fmt: skip


@pytest.mark.parametrize("row", CLI_ROWS, ids=lambda r: r.id)
def test_cli_fault(row: CliRow, qwen3_engine: Path, monkeypatch: Any, capsys: Any) -> None:
    """One line and the row's status; exit 2 before any engine opens; the engine dir, TMPDIR
    and the port as they were (a socket it bound is closed again)."""
    tmpdir = Path(tempfile.gettempdir())  # the module's own (test_serve.own_tmpdir)
    opened: list[Any] = []
    real_open = Pipeline.open
    monkeypatch.setattr(Pipeline, "open", lambda self, ids: (opened.append(ids), real_open(self, ids))[1])  # fmt: skip
    if row.patch is not None:
        row.patch(monkeypatch)
    engine, tmp = snapshot(qwen3_engine), sorted(tmpdir.iterdir())
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        port = other.getsockname()[1]
        if row.listening:
            other.listen()
        else:
            other.close()
        capsys.readouterr()
        code = cli.main(row.argv(qwen3_engine, port))
    err = capsys.readouterr().err
    assert code == row.code, err
    assert row.message in err and "Traceback" not in err, err
    assert err.strip().count("\n") == 0, err
    if code == 2:
        assert err.startswith("edge-serve: error:"), err
        assert not opened, "an engine was opened before the flags and the address were checked"
    assert snapshot(qwen3_engine) == engine
    assert sorted(tmpdir.iterdir()) == tmp
    with socket.socket() as again:  # nothing of the run holds the port
        again.bind(("127.0.0.1", port))


def test_a_placement_larger_than_the_local_cluster_is_refused_before_ray_starts(
        qwen3_engine: Path, tmp_path: Path) -> None:  # fmt: skip
    """--ray-cpus sizes the local cluster: a group whose replica needs more CPUs is one line at
    its JSON path, exit 2, before Ray starts (without the check, Ray Serve waited for the CPUs
    forever; hence a process and a time limit)."""
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed")
    placement = tmp_path / "p.json"
    placement.write_text(json.dumps({"groups": [{"name": "all", "stages": ["llm"],
                                                 "num_cpus": 64}]}))  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "edgeomni.runtime.serve.cli", "--config", str(qwen3_engine),
         "--port", str(free_port()), "--ray", "--ray-cpus", "2", "--placement", str(placement)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr == (f"edge-serve: error: {placement}: $.groups[0].num_cpus: group 'all' "
                          "needs 64 CPU a replica; the local cluster (--ray-cpus 2) has 2 "
                          "CPU\n"), run.stderr  # fmt: skip
    assert run.stdout == ""  # no Ray: it never started


def exit_statuses(text: str) -> set[int]:
    """The statuses an ``exit status:`` list in --help's epilog names."""
    section = text.split("exit status:", 1)[1]
    return {int(m) for m in re.findall(r"^\s+(\d+)\s", section, re.M)} | {
        int(m) for m in re.findall(r"; (\d+) ", section)}  # fmt: skip


def test_exit_statuses_are_documented() -> None:
    """Every status a row here gives (and 0 and 1) is in --help's epilog and README's section."""
    statuses = {r.code for r in CLI_ROWS} | {0, 1, 130, 143}
    assert statuses <= exit_statuses(cli.parser().format_help())
    section = README.read_text().split("### edge-serve", 1)[1].split("\n### ", 1)[0]
    line = next(x for x in section.split("\n- ") if x.startswith("Exit status:"))
    assert statuses <= {int(n) for n in re.findall(r"\b(\d{1,3})\b", line)}, line


# -- HTTP ---------------------------------------------------------------------------------------
@dataclass
class Proc:
    """An edge-serve process: its URL, the engine dir it serves, its TMPDIR, the file of its
    stderr and stdout (uvicorn's access log)."""

    proc: subprocess.Popen
    url: str
    engine: Path
    tmp: Path
    log: Path
    model: str = field(init=False)

    def __post_init__(self) -> None:
        self.model = self.engine.name

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def launch(engine: Path, root: Path, *more: str, script: Path | None = None) -> Proc:
    """edge-serve on a free port with a TMPDIR of its own, once /health answers."""
    tmp = root / "tmp"
    tmp.mkdir(parents=True)
    port = free_port()
    log = root / "stderr.txt"
    command = [str(script)] if script else ["-m", "edgeomni.runtime.serve.cli"]
    proc = subprocess.Popen(
        [sys.executable, *command, "--config", str(engine), "--port", str(port),
         "--max-tokens", "8", "--max-audio-seconds", "2", *more],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(tmp)},
    )  # fmt: skip
    p = Proc(proc, f"http://127.0.0.1:{port}", engine, tmp, log)
    wait_healthy(proc, p.url, 90, p.stderr)
    return p


def stop(p: Proc) -> None:
    """SIGTERM: exit 0 once drained, no traceback in its output, its media folder gone."""
    err = sigterm(p.proc, 30, p.stderr)
    for bad in ("Traceback", "Exception in ASGI"):
        assert bad not in err, err
    assert not list(p.tmp.glob("edge-serve-*")), list(p.tmp.iterdir())


@pytest.fixture(scope="module")
def servers(qwen3_engine: Path, omni_engine: Path, tts_engine: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Proc]]:  # fmt: skip
    """edge-serve processes over the tiny builds, started on first use and stopped (and
    checked, see ``stop``) at the module's end."""
    engines = {"qwen3": qwen3_engine, "omni": omni_engine, "tts": tts_engine}
    running: dict[str, Proc] = {}

    def get(name: str) -> Proc:
        if name not in running:
            running[name] = launch(engines[name], tmp_path_factory.mktemp(f"serve-{name}"))
        return running[name]

    yield get
    for p in running.values():
        stop(p)


def wav(samples: int, rate: int = 16000, value: float = 0.0) -> str:
    """A WAV of ``samples`` equal samples, base64: PCM, or float for a value PCM cannot hold."""
    import numpy as np
    import soundfile as sf

    buf = io.BytesIO()
    subtype = "PCM_16" if np.isfinite(value) else "FLOAT"
    sf.write(buf, np.full(samples, value, np.float32), rate, format="WAV", subtype=subtype)
    return base64.b64encode(buf.getvalue()).decode()


def png_of_size(width: int, height: int) -> str:
    """A data URL of a PNG whose header says ``width`` x ``height`` (its data cut short)."""
    from test_image import png_header

    with tempfile.TemporaryDirectory() as folder:
        data = png_header(Path(folder) / "a.png", width, height).read_bytes()
    return "data:image/png;base64," + base64.b64encode(data).decode()


def png(truncate: int | None = None) -> str:
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8)).save(
        buf, format="PNG")  # fmt: skip
    data = buf.getvalue()[:truncate]
    return "data:image/png;base64," + base64.b64encode(data).decode()


def parts(*content: dict) -> dict:
    return {"messages": [{"role": "user", "content": list(content)}]}


def audio_part(data: str, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


@dataclass(frozen=True)
class HttpRow:
    id: str
    engine: str
    route: str
    body: Any  # a dict sent as JSON, bytes sent as they are, or a callable of the Proc
    status: int
    message: str = ""
    param: str | None = None
    code: str | None = None


SURROGATE = b'"x\\udc80y"'  # valid JSON: a lone surrogate escape
SPEAK = {"input": "Hello there.", "voice": "vivian", "talker_max_new_tokens": 4}
HTTP_ROWS = [
    # -- text that is not valid Unicode: a 400 naming the field, not the tokenizer's TypeError
    HttpRow("content-lone-surrogate", "qwen3", CHAT,
            b'{"messages": [{"role": "user", "content": ' + SURROGATE + b"}]}", 400,
            "messages[0].content: not valid Unicode text (a lone surrogate at character 1)",
            "messages[0].content"),
    HttpRow("text-part-lone-surrogate", "qwen3", CHAT,
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": '
            + SURROGATE + b"}]}]}", 400, "not valid Unicode text", "messages[0].content[0].text"),
    HttpRow("surrogate-as-utf8-bytes", "qwen3", CHAT,
            b'{"messages": [{"role": "user", "content": "x\xed\xb2\x80y"}]}', 400,
            "messages[0].content: not valid Unicode text", "messages[0].content"),
    HttpRow("stop-lone-surrogate", "qwen3", CHAT,
            b'{"messages": [{"role": "user", "content": "hi"}], "stop": [' + SURROGATE + b"]}",
            400, "stop[0]: not valid Unicode text", "stop[0]"),
    HttpRow("field-name-lone-surrogate", "qwen3", CHAT,
            b'{"messages": [{"role": "user", "content": "hi"}], ' + SURROGATE + b": 1}", 400,
            "the body: a field name is not valid Unicode text (a lone surrogate in 'x\\udc80y')"),
    HttpRow("body-invalid-utf8", "qwen3", CHAT,
            b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', 400,
            "the body is not UTF-8 text (byte 0xe9 at offset 46)"),
    HttpRow("body-nests-too-deeply", "qwen3", CHAT, b"[" * 100_000 + b"]" * 100_000, 400,
            "it nests too deeply"),
    HttpRow("body-not-an-object", "qwen3", CHAT, b'[{"role": "user", "content": "hi"}]', 400,
            "the body must be a JSON object"),
    HttpRow("body-over-the-limit", "qwen3", CHAT, lambda p: b" " * ((32 << 20) + 1), 413,
            f"the body is over {32 << 20} bytes"),
    HttpRow("speech-input-lone-surrogate", "tts", SPEECH,
            b'{"voice": "vivian", "input": ' + SURROGATE + b"}", 400,
            "input: not valid Unicode text", "input"),
    HttpRow("speech-voice-lone-surrogate", "tts", SPEECH,
            b'{"input": "Hello", "voice": ' + SURROGATE + b"}", 400,
            "voice: not valid Unicode text", "voice"),
    HttpRow("speech-instructions-lone-surrogate", "tts", SPEECH,
            b'{"input": "Hello", "voice": "vivian", "instructions": ' + SURROGATE + b"}", 400,
            "instructions: not valid Unicode text", "instructions"),
    # -- the model: the engine dir's name (what /v1/models lists), or none
    HttpRow("model-unknown", "qwen3", CHAT, {"model": "gpt-4o", "messages": HI}, 404,
            "the model 'gpt-4o' does not exist; this server serves 'eng'", "model",
            "model_not_found"),
    HttpRow("model-not-a-string", "qwen3", CHAT, {"model": ["eng"], "messages": HI}, 400,
            "model must be a string", "model"),
    HttpRow("model-listed", "qwen3", CHAT, {"model": "eng", "messages": HI, "max_tokens": 2},
            200),
    HttpRow("model-left-out", "qwen3", CHAT, {"messages": HI, "max_tokens": 2}, 200),
    HttpRow("speech-model-unknown", "tts", SPEECH, {"model": "tts-1", **SPEAK}, 404,
            "the model 'tts-1' does not exist", "model", "model_not_found"),
    HttpRow("speech-model-listed", "tts", SPEECH, {"model": "eng", **SPEAK}, 200),
    # -- a stream that fails before its first output: the error's status, not 200
    HttpRow("stream-prompt-over-the-build", "qwen3", CHAT,
            {"messages": [{"role": "user", "content": "word " * 200}], "stream": True}, 400,
            "the engine was built for at most"),
    HttpRow("speech-stream-unknown-voice", "tts", SPEECH, {**SPEAK, "voice": "nobody",
            "stream": True, "response_format": "pcm"}, 400, "unknown voice 'nobody'"),
    HttpRow("speech-input-over-the-build", "tts", SPEECH, {**SPEAK, "input": "word " * 100},
            400, "over the build's max_input_len"),
    # -- inline media: errors name the part, never the server's file for it
    HttpRow("audio-not-audio", "omni", CHAT,
            parts(audio_part(base64.b64encode(b"junk" * 20).decode())), 400,
            "not wav audio: Error opening: Format not recognised",
            "messages[0].content[0].input_audio.data"),
    HttpRow("audio-without-samples", "omni", CHAT, parts(audio_part(wav(0))), 400,
            "audio messages[0].content[0].input_audio: holds no samples",
            "messages[0].content[0].input_audio"),
    HttpRow("audio-nan", "omni", CHAT, parts(audio_part(wav(800, value=float("nan")))), 400,
            "audio messages[0].content[0].input_audio: 800 of its 800 samples are not finite "
            "numbers (NaN or infinity)", "messages[0].content[0].input_audio"),
    HttpRow("audio-infinite", "omni", CHAT, parts({"type": "text", "text": "hi"},
            audio_part(wav(800, value=float("-inf")))), 400, "800 of its 800 samples are not "
            "finite numbers", "messages[0].content[1].input_audio"),
    HttpRow("audio-too-long", "omni", CHAT,
            parts({"type": "text", "text": "hi"}, audio_part(wav(3 * 16000))), 400,
            "the audio is 3.0 s long; at most 2 s here", "messages[0].content[1].input_audio"),
    HttpRow("image-not-an-image", "omni", CHAT,
            parts(image_part("data:image/png;base64," + base64.b64encode(b"nope").decode())),
            400, "not an image: cannot identify image file", "messages[0].content[0].image_url"),
    HttpRow("image-over-the-cap", "omni", CHAT, parts(image_part(png_of_size(9800, 9800))), 400,
            "image messages[0].content[0].image_url: 9800x9800 pixels, over the cap of 16777216 "
            "(--max-image-pixels raises it, up to 178956970)", "messages[0].content[0].image_url"),
    HttpRow("image-over-pillows-limit", "omni", CHAT,
            parts(image_part(png_of_size(20000, 20000))), 400,
            "image messages[0].content[0].image_url: 400000000 pixels, over the cap of 16777216",
            "messages[0].content[0].image_url"),
    HttpRow("image-truncated", "omni", CHAT, parts(image_part(png(truncate=200))), 400,
            "image messages[0].content[0].image_url: image file is truncated",
            "messages[0].content[0].image_url"),
]  # fmt: skip


def leaks(p: Proc, text: str) -> list[str]:
    """Server-side paths in ``text``: its temp dir, the engine dir, a media folder's name."""
    marks = (str(p.tmp), str(p.engine), "edge-serve-media", tempfile.gettempdir() + "/")
    return [m for m in marks if m in text]


def send(p: Proc, route: str, body: Any, timeout: float = 60) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(p.url + route, content=body, timeout=timeout,
                          headers={"content-type": "application/json"})  # fmt: skip
    return httpx.post(p.url + route, json=body, timeout=timeout)


def media_left(p: Proc, within: float = 10.0) -> list[str]:
    """Request folders still in the server's media folder ``within`` seconds from now (each
    goes as its request leaves, which for a streamed reply is just after its last bytes: on
    a loaded machine the client can read them first)."""
    deadline = time.monotonic() + within
    while True:
        left = [q.name for q in p.tmp.glob("edge-serve-media-*/*")]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_a_client_that_leaves_while_sending_its_body(servers: Callable[[str], Proc]) -> None:
    """A client that closes its connection before its whole body came (as one that gives up
    on a busy server does; bench/soak.py found it): the server counts it cancelled, logs no
    traceback (starlette's ClientDisconnect once escaped as "Exception in ASGI application",
    one per such client), and answers the next request."""
    from urllib.parse import urlsplit

    from test_serve import metric

    p = servers("qwen3")
    cancelled = 'edgeomni_requests_total{outcome="cancelled"}'
    before = metric(p.url, cancelled)
    body = json.dumps({"messages": HI, "max_tokens": 2}).encode()
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) + 64}\r\n\r\n").encode()  # fmt: skip
    url = urlsplit(p.url)
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(head + body)  # 64 bytes short: the server waits for them
        time.sleep(0.3)
    deadline = time.monotonic() + 10
    while metric(p.url, cancelled) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(p.url, cancelled) == before + 1
    err = p.stderr()
    for bad in ("Traceback", "Exception in ASGI", "ClientDisconnect"):
        assert bad not in err, err
    assert send(p, CHAT, {"messages": HI, "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize("row", HTTP_ROWS, ids=lambda r: r.id)
def test_http_fault(row: HttpRow, servers: Callable[[str], Proc]) -> None:
    p = servers(row.engine)
    engine = snapshot(p.engine)
    r = send(p, row.route, row.body(p) if callable(row.body) else row.body)
    assert r.status_code == row.status, r.text
    assert not leaks(p, r.text), r.text
    if row.status != 200:
        error = r.json()["error"]
        assert row.message in error["message"], error
        assert error["type"] == "invalid_request_error" and error["code"] == row.code, error
        if row.param is not None:
            assert error["param"] == row.param, error
    assert snapshot(p.engine) == engine
    assert media_left(p) == []


def test_a_runtime_error_names_no_server_path(qwen3_engine: Path) -> None:
    """An engine call that fails with its file's path in the message (as ONNX Runtime's do):
    the 500 names the file under the model's name, not where the server keeps it."""
    s = start(qwen3_engine, batch_size=1, max_queue=0, step_s=0.001)
    try:
        stage = s.server.pipe.slot_stage("llm")

        def broken(slots: Any) -> None:
            raise RuntimeError(f"{qwen3_engine / 'llm.onnx'}: injected failure")

        stage.step = broken
        r = httpx.post(s.url + CHAT, json={"messages": HI, "max_tokens": 3}, timeout=30)
    finally:
        s.stop()
    assert r.status_code == 500, r.text
    error = r.json()["error"]
    assert error["type"] == "server_error" and str(qwen3_engine) not in r.text, r.text
    assert "tiny-qwen3/llm.onnx: injected failure" in error["message"], error


# -- the fuzz -----------------------------------------------------------------------------------
WORDS = ["", " ", "hi", "x" * 5000, "\x00", "é", "日本語", "\U0001f600", "\u202e", "\ud800",
         "a\udc80b", "\ufeff", "\\", '"', "{}", "null", "data:image/png;base64,AAAA", "A" * 3]  # fmt: skip
KEYS = ["messages", "role", "content", "type", "text", "model", "stream", "max_tokens",
        "temperature", "top_p", "top_k", "seed", "stop", "modalities", "audio", "voice",
        "input", "instructions", "language", "response_format", "image_url", "input_audio",
        "talker_top_k", "cp_top_k", "n", "tools", "colour", "\udc80", ""]  # fmt: skip


def fuzz_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(11 if depth < 3 else 8)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 2, 7, 10**30, -(10**20), 2**63])
    if kind == 3:
        return rng.choice([0.0, -0.5, 0.5, 1e308, -1e-308, float("nan"), float("inf")])
    if kind in (4, 5, 6, 7):
        return "".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 4)))
    if kind == 8:
        return [fuzz_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 9:
        return {rng.choice(KEYS): fuzz_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return {"type": rng.choice(["text", "image_url", "input_audio", "image", "audio", "video"]),
            rng.choice(["text", "image_url", "input_audio"]): fuzz_value(rng, depth + 1)}  # fmt: skip


def mutate(rng: random.Random, body: Any, depth: int = 0) -> Any:
    """One change somewhere in ``body``: a value replaced, a key dropped or added, a value
    wrapped in a list."""
    if isinstance(body, dict) and body and rng.random() < 0.7 and depth < 4:
        key = rng.choice(list(body))
        out = dict(body)
        choice = rng.randrange(5)
        if choice == 0:
            del out[key]
        elif choice == 1:
            out[rng.choice(KEYS)] = fuzz_value(rng)
        else:
            out[key] = mutate(rng, body[key], depth + 1)
        return out
    if isinstance(body, list) and body and rng.random() < 0.7 and depth < 4:
        i = rng.randrange(len(body))
        return [*body[:i], mutate(rng, body[i], depth + 1), *body[i + 1 :]]
    if isinstance(body, str) and rng.random() < 0.6:  # text of another kind, still text
        return "".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 4)))
    return [body] if rng.random() < 0.15 else fuzz_value(rng)


def encode(rng: random.Random, body: Any) -> bytes:
    """The body as bytes, as a client might send it: JSON (escaped or raw UTF-8, lone
    surrogates as their three bytes), now and then with bytes changed or cut off."""
    text = json.dumps(body, ensure_ascii=rng.random() < 0.5)
    raw = text.encode("utf-8", "surrogatepass")
    roll = rng.random()
    if roll < 0.1:  # a byte that is not UTF-8, or any byte, somewhere
        i = rng.randrange(len(raw) + 1)
        raw = raw[:i] + bytes([rng.choice([0xFF, 0xC0, 0xE9, 0x80, rng.randrange(256)])]) + raw[i:]
    elif roll < 0.15:
        raw = raw[: rng.randrange(len(raw) + 1)]
    return raw


BASES = {
    "qwen3": [
        {"messages": HI, "max_tokens": 3},
        {"messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
         "temperature": 0.7, "top_k": 5, "seed": 1, "stop": ["."], "max_tokens": 3},
        {"model": "eng", "messages": HI, "stream": True, "max_tokens": 3},
    ],
    "omni": [
        {**parts(image_part(png()), {"type": "text", "text": "What is this?"}), "max_tokens": 2},
        {**parts(audio_part(wav(1600)), {"type": "text", "text": "Hi"}), "max_tokens": 2,
         "stream": True},
        {"messages": HI, "max_tokens": 2, "modalities": ["text", "audio"],
         "audio": {"voice": "ethan", "format": "wav"}, "talker_max_new_tokens": 3},
    ],
    "tts": [
        SPEAK,
        {"model": "eng", "input": "Hi.", "voice": "vivian", "response_format": "pcm",
         "language": "english", "talker_max_new_tokens": 3, "stream": True},
    ],
}  # fmt: skip
# what a route may answer: 200, 400 naming the fault, 404 for another model, 413 (too big)
ALLOWED = {200, 400, 404, 413}


def check_answer(p: Proc, r: httpx.Response, sent: bytes) -> None:
    assert r.status_code in ALLOWED, (r.status_code, r.text[:500], sent[:300])
    assert not leaks(p, r.text if r.status_code != 200 else ""), r.text
    kind = r.headers.get("content-type", "")
    if r.status_code != 200:
        error = r.json()["error"]
        assert isinstance(error["message"], str) and error["message"], r.text
        assert error["type"] == "invalid_request_error", r.text
    elif kind.startswith("text/event-stream"):
        events = [line[5:].strip() for line in r.text.splitlines() if line.startswith("data:")]
        assert events, r.text
        for e in events[:-1]:
            assert "error" not in json.loads(e), r.text
        if events[-1] != "[DONE]":  # a fault found once the stream had begun: the client's
            assert json.loads(events[-1])["error"]["type"] == "invalid_request_error", r.text
    elif kind.startswith("application/json"):
        assert r.json()["object"] == "chat.completion", r.text
    else:
        assert kind.startswith("audio/") and r.content, kind


@pytest.mark.parametrize(("engine", "route", "count"), [("qwen3", CHAT, 400), ("omni", CHAT, 100),
                                                       ("tts", SPEECH, 150)])  # fmt: skip
def test_fuzz(engine: str, route: str, count: int, servers: Callable[[str], Proc]) -> None:
    """Seeded: the same bodies each run, a fixed count (about 18 s for all three on two
    shared CPU cores). Every answer is one a client can read; the server stays up; its output
    is checked for tracebacks when it stops (``stop``)."""
    p = servers(engine)
    rng = random.Random(f"edge-serve-{route}")
    statuses: dict[int, int] = {}
    start = time.time()
    with httpx.Client(timeout=60, headers={"content-type": "application/json"}) as http:
        for _ in range(count):
            body = rng.choice(BASES[engine])
            for _ in range(rng.choice((1, 1, 2, 3))):
                body = mutate(rng, body)
            raw = encode(rng, body)
            r = http.post(p.url + route, content=raw)
            check_answer(p, r, raw)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
    assert httpx.get(p.url + "/health", timeout=10).status_code == 200
    assert media_left(p) == []
    assert statuses.get(200, 0) >= count // 40 and statuses.get(400, 0) > count // 3, statuses
    assert time.time() - start < 60, f"{time.time() - start:.0f} s: keep the fuzz bounded"


# -- a second Ctrl-C ----------------------------------------------------------------------------
@pytest.mark.parametrize(("signum", "code", "name"), [(signal.SIGINT, 130, "Ctrl-C"),
                                                     (signal.SIGTERM, 143, "SIGTERM")])  # fmt: skip
def test_second_signal_cuts_the_requests_in_flight(qwen3_engine: Path, tmp_path: Path,
                                                   signum: int, code: int, name: str) -> None:  # fmt: skip
    """The first signal drains (no new connections), a second while a stream runs cuts it:
    the process exits at once with the shell's status, one line saying how many were cut, no
    traceback, its media folder removed; the client's stream ends early, without [DONE]."""
    script = tmp_path / "slow_serve.py"
    script.write_text(SLOW_SERVE)
    p = launch(qwen3_engine, tmp_path, "--max-tokens", "48", script=script)
    try:
        body = {"messages": HI, "max_tokens": 40, "min_tokens": 40, "stream": True}
        seen: list[str] = []
        with httpx.Client(timeout=30) as http, \
                http.stream("POST", p.url + CHAT, json=body) as r:  # fmt: skip
            lines = r.iter_lines()
            seen.append(next(line for line in lines if line.startswith("data:")))
            p.proc.send_signal(signum)
            time.sleep(0.3)
            with pytest.raises(httpx.ConnectError):  # draining: no new connections
                httpx.get(p.url + "/health", timeout=2)
            cut_at = time.time()
            p.proc.send_signal(signum)
            # the stream ends early: its request cancelled (an error event), or cut off
            with contextlib.suppress(httpx.RemoteProtocolError):
                seen.extend(line for line in lines if line.startswith("data:"))
        assert p.proc.wait(10) == code, p.stderr()
        assert time.time() - cut_at < 5  # 40 steps of 50 ms were left: it did not wait
    finally:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()
    assert "data: [DONE]" not in seen and len(seen) < 40, seen
    err = p.stderr()
    assert "Traceback" not in err and "Exception in ASGI" not in err, err
    last = err.strip().splitlines()[-1]
    assert last == f"edge-serve: {name} again while draining: cut the 1 request in flight", err
    assert not list(p.tmp.glob("edge-serve-*"))
