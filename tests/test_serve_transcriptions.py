"""edge-serve's POST /v1/audio/transcriptions, driven by OpenAI's own client: the route's form
handling, its three formats and its stream, on a graph whose text model reads audio. Here that
is the tiny Qwen3-Omni thinker with a stand-in speech-to-text form (a family's
``transcription``, runtime/family.py), so what is pinned down is the route, not a model."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("python_multipart")

from test_serve import MODEL, client, start  # noqa: E402

from edgeomni.runtime.pipeline import Pipeline  # noqa: E402
from edgeomni.runtime.requests import parse_request_file  # noqa: E402
from edgeomni.runtime.serve import transcribe  # noqa: E402


class StandIn:
    """A speech-to-text form whose model answers "<lang>:" then the transcript: a forced
    language is given to it in the prompt, as Qwen3-ASR's prefill does."""

    def messages(self, audio: str, language: str | None, prompt: str | None) -> list[dict]:
        if language not in (None, "en", "English"):
            raise ValueError(f"language {language!r} is not one this model knows")
        text = (prompt or "") + ("" if language is None else " English:")
        return [{"role": "user", "content": [{"type": "audio", "audio": audio},
                                             {"type": "text", "text": text}]}]  # fmt: skip

    def parse(self, text: str) -> tuple[str | None, str]:
        head, sep, rest = text.partition("e")  # the tiny model's random text: "e" the marker
        return ("English", rest.strip()) if sep else (None, text.strip())

    def partial(self, text: str) -> str | None:
        head, sep, rest = text.partition("e")
        return rest.lstrip() if sep else None


def wav_bytes(seconds: float, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    sf.write(buf, (0.1 * rng.standard_normal(int(16000 * seconds))).astype(np.float32), 16000,
             format="WAV", subtype="PCM_16")  # fmt: skip
    return buf.getvalue()


@pytest.fixture(scope="module")
def served(omni_engine: Path) -> Any:
    patched = pytest.MonkeyPatch()
    patched.setitem(transcribe.TRANSCRIPTION, "qwen3_omni_moe", f"{__name__}:StandIn")
    s = start(omni_engine, batch_size=2, max_queue=4)
    yield s
    s.stop()
    patched.undo()


def offline(engine: Path, tmp: Path, audio: bytes, language: str | None = None) -> str:
    """edge-infer's reply for the same audio and language (greedy)."""
    (tmp / "a.wav").write_bytes(audio)
    req = {"messages": StandIn().messages(str(tmp / "a.wav"), language, None),
           "max_generate_length": 48, "sampling": {"temperature": 0.0}}  # fmt: skip
    requests, _ = parse_request_file({"requests": [req]})
    (out,) = Pipeline(engine).run(requests, batch_size=1, requested=("thinker:text",))
    assert out.entry["ok"], out.entry["error"]
    return out.entry["output_text"]


def test_formats_and_stream_equal_edge_infers(served: Any, omni_engine: Path,
                                              tmp_path: Path) -> None:  # fmt: skip
    """json, text, verbose_json and the stream all carry the transcript edge-infer's reply
    parses to; the stream's deltas join to it; a forced language is the answer's."""
    audio = wav_bytes(1.3)
    reply = offline(omni_engine, tmp_path, audio)
    language, words = StandIn().parse(reply)
    c = client(served)
    got = c.audio.transcriptions.create(model=MODEL, file=("a.wav", audio))
    assert got.text == words and got.usage.output_tokens > 0
    assert c.audio.transcriptions.create(model=MODEL, file=("a.wav", audio),
                                         response_format="text").strip() == words  # fmt: skip
    forced = StandIn().parse(offline(omni_engine, tmp_path, audio, "en"))
    verbose = c.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), language="en",
                                            response_format="verbose_json")  # fmt: skip
    assert verbose.text == forced[1] and verbose.duration == pytest.approx(1.3)
    assert verbose.language == (forced[0] or "en").lower()
    events = list(c.audio.transcriptions.create(model=MODEL, file=("a.wav", audio), stream=True))
    assert [e.type for e in events][-1] == "transcript.text.done"
    assert "".join(e.delta for e in events[:-1]) == events[-1].text == words
    if words:
        assert len(events) > 2  # streamed as it grew, not sent whole at the end


@pytest.mark.parametrize(
    ("files", "data", "param"),
    [
        ({"file": ("a.wav", b"RIFF junk")}, {}, "file"),
        ({}, {"model": MODEL}, "file"),
        ({"file": ("a.wav", wav_bytes(6.0))}, {}, "file"),  # over the server's 5 s
        ({"file": ("a.wav", wav_bytes(0.5))}, {"language": "xx"}, "language"),
        ({"file": ("a.wav", wav_bytes(0.5))}, {"response_format": "srt"}, "response_format"),
        ({"file": ("a.wav", wav_bytes(0.5))}, {"stream": "maybe"}, "stream"),
        ({"file": ("a.wav", wav_bytes(0.5))}, {"stream": "true", "response_format": "text"},
         "response_format"),
        ({"file": ("a.wav", wav_bytes(0.5))}, {"temperature": "hot"}, "temperature"),
        ({"file": ("a.wav", wav_bytes(0.5))}, {"timestamp_granularities[]": "word"},
         "timestamp_granularities[]"),
        ({"file": ("a.wav", wav_bytes(0.5))}, {"speed": "2"}, "speed"),
    ],
)  # fmt: skip
def test_a_bad_upload_is_400_naming_the_field(served: Any, files: dict, data: dict,
                                              param: str) -> None:  # fmt: skip
    r = httpx.post(served.url + "/v1/audio/transcriptions", files=files, data=data, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
    assert "/tmp" not in r.text and "edge-serve-media" not in r.text  # no server-side path
    assert not any(served.media_root.iterdir())  # the upload went with the refused request


def float_wav(samples: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples.astype(np.float32), 16000, format="WAV", subtype="FLOAT")
    return buf.getvalue()


@pytest.mark.parametrize(
    ("audio", "message"),
    [
        (float_wav(np.full(8000, np.nan)),
         "audio file: 8000 of its 8000 samples are not finite numbers (NaN or infinity)"),
        (float_wav(np.r_[np.zeros(7999), np.inf]),
         "audio file: 1 of its 8000 samples are not finite numbers (NaN or infinity)"),
        (float_wav(np.zeros(0)), "audio file: holds no samples"),
    ],
)  # fmt: skip
def test_an_upload_without_usable_samples_is_400(served: Any, audio: bytes, message: str) -> None:
    """NaN or infinite samples (which would be transcribed from NaN features) and none at
    all: a 400 naming the field, said once ("audio file file holds no samples" said it
    twice)."""
    r = httpx.post(served.url + "/v1/audio/transcriptions", files={"file": ("a.wav", audio)},
                   timeout=60)  # fmt: skip
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["message"], error["param"]) == (message, "file"), error
    assert not any(served.media_root.iterdir())


def test_a_json_body_or_another_model_is_refused(served: Any) -> None:
    url = served.url + "/v1/audio/transcriptions"
    r = httpx.post(url, json={"file": "a.wav"}, timeout=30)
    assert r.status_code == 400 and "multipart" in r.json()["error"]["message"]
    r = httpx.post(url, files={"file": ("a.wav", wav_bytes(0.5))}, data={"model": "other"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_a_graph_that_transcribes_nothing_says_so(qwen3_engine: Path) -> None:
    s = start(qwen3_engine, batch_size=1, max_queue=1)
    try:
        r = httpx.post(s.url + "/v1/audio/transcriptions", timeout=30,
                       files={"file": ("a.wav", wav_bytes(0.5))})  # fmt: skip
        assert r.status_code == 400 and "transcribes no speech" in json.loads(r.text)["error"][
            "message"]  # fmt: skip
    finally:
        s.stop()
