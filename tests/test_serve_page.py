"""edge-serve's page at ``/`` in a real headless browser (Debian's chromium): it loads, shows
what the graph does, and a prompt typed into it and sent shows the streamed reply, which is
``Pipeline.run``'s (edge-infer's) for the same greedy request: text on the tiny Qwen3; text and
every audio sample on the tiny Qwen3-Omni with "speak" on (and a microphone recording and an
image picked through the page); audio on a tiny Qwen3-TTS. Stop cancels the request on the
server; the server's errors are shown. Screenshots go to test-artifacts/.

The browser is driven over the Chrome DevTools Protocol with websocket-client, not Selenium:
CDP is what chromium speaks itself, so nothing else (no chromedriver of a matching version) has
to be installed, and it gives real input events (Input.insertText, mouse clicks), file inputs,
a fake microphone and screenshots directly. Without chromium the tests skip, saying so; in CI
(``CI`` set) they fail instead, so CI cannot pass without running them.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import references

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from test_serve import GREEDY_SPEECH, start  # noqa: E402

from edgeomni.runtime.audio import pcm16  # noqa: E402
from edgeomni.runtime.pipeline import Pipeline  # noqa: E402
from edgeomni.runtime.requests import parse_request_file  # noqa: E402

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
WIDTH, HEIGHT = 1000, 900
OMNI_GREEDY = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 12}


class CdpError(RuntimeError):
    pass


class Browser:
    """Headless chromium with one tab, over the DevTools Protocol: a command waits for its
    reply; events are read only for the page's script errors and CSP violations."""

    def __init__(self, binary: str) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="edgeomni-chromium-"))
        self.log = (self.profile / "stderr.log").open("wb")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "--autoplay-policy=no-user-gesture-required",
             "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
             f"--window-size={WIDTH},{HEIGHT}", "--no-first-run", "--no-default-browser-check",
             "--disable-gpu", "--mute-audio", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=self.log,
        )  # fmt: skip
        self.ws: Any = None
        try:
            self._connect()
        except BaseException:
            self.close()  # no chromium left behind
            raise

    def _connect(self) -> None:
        import websocket

        active = self.profile / "DevToolsActivePort"
        deadline = time.time() + 60
        while not (active.is_file() and len(active.read_text().split()) >= 2):
            if self.proc.poll() is not None or time.time() > deadline:
                tail = (self.profile / "stderr.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"chromium did not start its DevTools endpoint:\n{tail}")
            time.sleep(0.05)
        port, path = active.read_text().split()[:2]
        self.ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=120,
                                              suppress_origin=True)  # fmt: skip
        self.ids = 0
        self.errors: list[str] = []  # uncaught exceptions, CSP violations, console.error
        self.session: str | None = None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        attached = self.call("Target.attachToTarget", targetId=target, flatten=True)
        self.session = attached["sessionId"]
        self.call("Runtime.enable")
        self.call("Log.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.ids += 1
        message: dict[str, Any] = {"id": self.ids, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            message["sessionId"] = self.session
        self.ws.send(json.dumps(message))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.ids:
                if "error" in reply:
                    raise CdpError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._event(reply)

    def _event(self, event: dict[str, Any]) -> None:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details["text"])
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            args = params["args"]
            self.errors.append(" ".join(str(a.get("value", a.get("description"))) for a in args))
        elif method == "Log.entryAdded":
            entry = params["entry"]
            if entry.get("source") in ("security", "javascript"):  # CSP violations are security
                self.errors.append(entry["text"])

    def js(self, expression: str) -> Any:
        got = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                        awaitPromise=True)  # fmt: skip
        if "exceptionDetails" in got:
            raise CdpError(f"{expression}: {got['exceptionDetails'].get('text')}")
        return got["result"].get("value")

    def wait(self, expression: str, timeout: float = 60.0) -> Any:
        deadline = time.time() + timeout
        while True:
            try:
                value = self.js(expression)
            except CdpError:  # the page is being replaced: its context went away
                value = None
            if value:
                return value
            assert time.time() < deadline, f"timed out waiting for {expression}; {self.errors}"
            time.sleep(0.05)

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait(f"location.href.startsWith({json.dumps(url)}) && window.edgeomniPage && "
                  "window.edgeomniPage.ready")  # fmt: skip

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the element's centre."""
        x, y = self.js(f"""(() => {{
            const el = document.querySelector({json.dumps(selector)});
            el.scrollIntoView({{block: "center"}});
            const r = el.getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2];
        }})()""")
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def type(self, selector: str, text: str) -> None:
        """Click into a field, select what it holds and type ``text`` over it."""
        self.click(selector)
        self.call("Input.dispatchKeyEvent", type="keyDown", key="a", code="KeyA",
                  modifiers=2, commands=["selectAll"])  # fmt: skip
        self.call("Input.dispatchKeyEvent", type="keyUp", key="a", code="KeyA", modifiers=2)
        self.call("Input.insertText", text=text)

    def visible(self, selector: str) -> bool:
        return self.js(f"!!document.querySelector({json.dumps(selector)})?.offsetParent")

    def screenshot(self, name: str) -> Path:
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / name
        path.write_bytes(data)
        return path

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        references.missing("no chromium on PATH (Debian: apt-get install chromium)",
                           ".ci/run installs Debian's chromium")  # fmt: skip
    references.require_module("websocket", "websocket-client")
    b = Browser(binary)
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Browser]:
    """The browser, checked after the test: the page's script threw nothing and broke no CSP."""
    browser.errors.clear()
    yield browser
    assert not browser.errors, browser.errors


def state(browser: Browser) -> dict[str, Any]:
    return browser.js("JSON.parse(JSON.stringify(window.edgeomniPage))")


def send_and_wait(browser: Browser, timeout: float = 120.0) -> dict[str, Any]:
    sent = browser.js("window.edgeomniPage.sent")
    browser.click("#send")
    browser.wait(f"window.edgeomniPage.sent > {sent}", 10)  # it took the click
    browser.wait("window.edgeomniPage.done", timeout)
    return state(browser)


def shown_reply(browser: Browser) -> str:
    return browser.js("document.querySelector('#log .msg.assistant:last-child .text').textContent")


def check_png(path: Path) -> None:
    """The screenshot is a real picture of the page: a PNG of the window's size with many
    colours (text, buttons), not a blank frame."""
    from PIL import Image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, len(data)
    with Image.open(path) as im:
        assert im.size == (WIDTH, HEIGHT), im.size
        colours = im.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 50, "a near-blank screenshot"


def offline(engine: Path, body: dict[str, Any], **kw: Any) -> Any:
    requests, _ = parse_request_file(body)
    (want,) = Pipeline(engine).run(requests, batch_size=1, **kw)
    assert want.entry["ok"], want.entry["error"]
    return want


def pcm_sum(samples: Any) -> int:
    import numpy as np

    return int(np.frombuffer(pcm16(samples), "<i2").astype(np.int64).sum())


def test_text_page_streams_the_greedy_reply(page: Browser, qwen3_engine: Path) -> None:
    """The tiny Qwen3 (text only): the page offers a chat without microphone, image or voice;
    a prompt typed in and sent with temperature 0 and 12 tokens shows edge-infer's reply."""
    prompt = "Tell me a story about a fox."
    want = offline(qwen3_engine, {"requests": [{"messages": [{"role": "user", "content": prompt}],
                                                "max_generate_length": 12}], "temperature": 0.0})  # fmt: skip
    s = start(qwen3_engine, batch_size=2, max_queue=2)
    try:
        r = httpx.get(s.url + "/", timeout=30)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in r.headers["content-security-policy"]
        assert "http://" not in r.text and "https://" not in r.text  # no external URL
        page.open(s.url + "/")
        assert page.visible("#prompt") and page.visible("#temperature")
        assert not page.visible("#mic") and not page.visible("#image-button")
        assert not page.visible("#speak") and not page.visible("#voice")
        page.type("#prompt", prompt)
        page.type("#temperature", "0")
        page.type("#max-tokens", "12")
        got = send_and_wait(page)
        assert got["error"] is None and not got["stopped"]
        assert got["text"] == want.entry["output_text"] and got["text"]
        assert shown_reply(page) == want.entry["output_text"]
        meta = page.js("document.querySelector('#log .msg.assistant:last-child .meta').textContent")
        assert meta.startswith(f"{want.entry['stages']['llm']['generated_tokens']} tokens")
        assert page.js("document.querySelector('#prompt').value") == ""  # ready for the next
        check_png(page.screenshot("serve-page-text.png"))
    finally:
        s.stop()


def test_page_shows_the_servers_error(page: Browser, qwen3_engine: Path) -> None:
    """With an API key set: a request without it shows the 401 error body's message; typed into
    the key field, the same request goes through; a max_tokens over the cap shows the 400 with
    its field."""
    s = start(qwen3_engine, batch_size=1, max_queue=1, api_key="sesame")
    try:
        page.open(s.url + "/")
        page.type("#prompt", "hi")
        page.type("#max-tokens", "3")
        got = send_and_wait(page)
        assert got["error"].startswith("401 authentication_error: a valid API key is required")
        assert page.js("document.getElementById('error').textContent") == got["error"]
        assert page.visible("#error")
        page.type("#key", "sesame")
        got = send_and_wait(page)
        assert got["error"] is None and got["text"] and not page.visible("#error")
        page.type("#prompt", "hi")
        page.type("#max-tokens", "49")
        got = send_and_wait(page)
        assert got["error"].startswith("400 invalid_request_error (max_tokens): max_tokens must")
    finally:
        s.stop()


def test_stop_cancels_the_request(page: Browser, qwen3_engine: Path) -> None:
    """Stop, clicked while a reply streams, aborts the fetch: the server cancels the request
    and frees its slot; the page keeps what came and says it stopped."""
    s = start(qwen3_engine, batch_size=1, max_queue=0, step_s=0.05)
    try:
        page.open(s.url + "/")
        page.type("#prompt", "Tell me a story about a fox.")
        page.type("#extra", '{"min_tokens": 48}')
        sent = page.js("window.edgeomniPage.sent")
        page.click("#send")
        page.wait(f"window.edgeomniPage.sent > {sent} && window.edgeomniPage.text", 30)
        page.click("#stop")
        page.wait("window.edgeomniPage.done", 30)
        got = state(page)
        assert got["stopped"] and got["error"] is None and got["text"]
        assert shown_reply(page) == got["text"]
        deadline = time.time() + 20
        while s.server.in_flight:
            assert time.time() < deadline, "the stopped request kept its slot"
            time.sleep(0.05)
        assert s.server.cancelled == 1 and s.server.finished == 1
        meta = page.js("document.querySelector('#log .msg.assistant:last-child .meta').textContent")
        assert meta.endswith("stopped")
    finally:
        s.stop()


@pytest.fixture(scope="module")
def omni_served(omni_engine: Path) -> Iterator[Any]:
    s = start(omni_engine, batch_size=2, max_queue=2)
    yield s
    s.stop()


def test_omni_page_speaks_the_reply(page: Browser, omni_engine: Path, omni_served: Any) -> None:
    """The tiny Qwen3-Omni with "speak" on: the page streams the text and plays the pcm16
    deltas; the text, the number of samples and their sum are edge-infer's for the request."""
    prompt = "Hello! How are you today?"
    page.open(omni_served.url + "/")
    for selector in ("#mic", "#image-button", "#speak", "#voice"):
        assert page.visible(selector), selector
    voice = page.js("document.getElementById('voice').value")
    voices = page.js("[...document.getElementById('voice').options].map(o => o.value)")
    assert voice and voice in voices and "ethan" in voices
    page.type("#prompt", prompt)
    page.click("#speak")
    assert page.js("document.getElementById('speak').checked")
    page.type("#max-tokens", "8")
    page.type("#extra", json.dumps(OMNI_GREEDY))
    got = send_and_wait(page)
    want = offline(omni_engine, {"requests": [{"messages": [{"role": "user", "content": prompt}],
                                               "voice": voice, "max_generate_length": 8}],
                                 **OMNI_GREEDY})  # fmt: skip
    assert got["error"] is None, got["error"]
    assert got["text"] == want.entry["output_text"] == shown_reply(page)
    assert got["audioSamples"] == want.audio.size > 0
    assert got["audioSum"] == pcm_sum(want.audio)
    # the replay player holds the page's own WAV of what came: chromium reads its length
    duration = page.wait("document.querySelector('#log .msg.assistant:last-child audio')"
                         "?.duration", 10)  # fmt: skip
    assert round(duration * 24000) == want.audio.size
    check_png(page.screenshot("serve-page-omni.png"))


def test_omni_page_sends_microphone_and_image(page: Browser, omni_engine: Path,
                                             omni_served: Any, tmp_path: Path) -> None:  # fmt: skip
    """A recording from chromium's fake microphone and an image picked in the file input go as
    input_audio (a WAV the page encodes) and image_url parts: the reply is edge-infer's for the
    same files by path."""
    import numpy as np
    from PIL import Image

    image = (np.random.default_rng(3).random((40, 56, 3)) * 255).astype(np.uint8)
    Image.fromarray(image).save(tmp_path / "i.png")
    page.open(omni_served.url + "/")
    page.click("#mic")
    page.wait("document.getElementById('mic').classList.contains('on')", 10)
    time.sleep(1.0)
    page.click("#mic")
    page.wait("window.edgeomniPage.recorded", 10)
    node = page.call("Runtime.evaluate", expression="document.getElementById('image')")
    page.call("DOM.setFileInputFiles", files=[str(tmp_path / "i.png")],
              objectId=node["result"]["objectId"])  # fmt: skip
    page.wait("document.querySelectorAll('#attachments .chip').length === 2", 10)
    page.type("#prompt", "What is this?")
    page.type("#max-tokens", "6")
    page.type("#extra", '{"top_k": 1}')
    got = send_and_wait(page)
    assert got["error"] is None, got["error"]
    recorded = base64.b64decode(got["recorded"])
    import soundfile as sf

    samples, rate = sf.read(io.BytesIO(recorded), dtype="float32")
    assert rate >= 8000 and 0.5 < samples.size / rate <= 5.0 and np.abs(samples).max() > 0.01
    (tmp_path / "a.wav").write_bytes(recorded)
    want = offline(omni_engine, {"requests": [{"messages": [{"role": "user", "content": [
        {"type": "image", "image": str(tmp_path / "i.png")},
        {"type": "audio", "audio": str(tmp_path / "a.wav")},
        {"type": "text", "text": "What is this?"}]}], "max_generate_length": 6}], "top_k": 1},
        requested=("thinker:text",))  # fmt: skip
    assert got["text"] == want.entry["output_text"] == shown_reply(page)
    assert got["audioSamples"] == 0  # speak is off
    assert page.js("document.querySelectorAll('#attachments .chip').length") == 0  # sent
    assert page.js("!![...document.querySelectorAll('#log .msg.user')].pop().querySelector('img')")
    check_png(page.screenshot("serve-page-media.png"))


def test_speech_page_plays_the_tts_audio(page: Browser, tts_engine: Path) -> None:
    """A Qwen3-TTS graph: the page offers a text to speak and its voices (no chat fields);
    the audio it receives from /v1/audio/speech (streamed pcm) is edge-infer's, sample for
    sample."""
    text = "Hello there, this is a test."
    s = start(tts_engine, batch_size=2, max_queue=2)
    try:
        page.open(s.url + "/")
        assert page.visible("#voice") and not page.visible("#temperature")
        assert not page.visible("#mic") and not page.visible("#speak")
        voice = page.js("document.getElementById('voice').value")
        assert voice
        page.type("#prompt", text)
        page.type("#extra", json.dumps(GREEDY_SPEECH))
        got = send_and_wait(page)
        assert got["error"] is None, got["error"]
        want = offline(tts_engine, {"requests": [{"prompt": text, "speaker": voice,
                                                  "sampling": GREEDY_SPEECH}]})  # fmt: skip
        assert got["audioSamples"] == want.audio.size > 0
        assert got["audioSum"] == pcm_sum(want.audio)
        check_png(page.screenshot("serve-page-speech.png"))
    finally:
        s.stop()
