"""edge-serve --ray as users start it: the command line, a placement file, a local Ray cluster it
starts itself, the HTTP API. The tiny Qwen3-TTS's talker and code2wav in two deployments speak
edge-infer's audio; the tiny Qwen3's chat completion is edge-infer's text; SIGTERM drains and
exits 0. Skipped where Ray Serve is not installed (the ray extra)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'edgeomni[ray]')")

from edgeomni.runtime.audio import pcm16  # noqa: E402
from edgeomni.runtime.pipeline import Pipeline  # noqa: E402
from edgeomni.runtime.requests import parse_request_file  # noqa: E402

GREEDY_SPEECH = {"talker_do_sample": 0, "subtalker_dosample": 0, "talker_max_new_tokens": 9}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    def __init__(self, engine: Path, root: Path, *flags: str) -> None:
        self.port, self.log = free_port(), root / "edge-serve.txt"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgeomni.runtime.serve.cli", "--config", str(engine),
             "--port", str(self.port), "--batch-size", "2", "--ray", "--ray-cpus", "2",
             "--threads", "1", *flags],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT,
            env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.time() + 180
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None and time.time() < deadline, self.output()
            time.sleep(0.25)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        try:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(60) == 0, self.output()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        assert "Traceback" not in self.output(), self.output()


def same_audio(got: bytes, want: bytes) -> None:
    """pcm16 within 4 steps of edge-infer's: the vocoder streams in chunks as the frames come,
    and across deployments they come in other groupings than in one process; the stateful
    vocoder's chunkings agree within 1e-4 (tests/test_code2wav_stream.py), about 3.3 steps of
    16-bit audio, so a sample may round to a neighbouring step."""
    a, b = np.frombuffer(got, np.int16), np.frombuffer(want, np.int16)
    assert a.size == b.size > 0
    assert np.abs(a.astype(np.int32) - b).max() <= 4


def test_speech_through_two_deployments(tts_engine: Path, tmp_path: Path) -> None:
    text, voice = "Hello there, this is a test.", "vivian"
    requests, _ = parse_request_file({"requests": [
        {"prompt": text, "speaker": voice, "sampling": GREEDY_SPEECH}]})  # fmt: skip
    (want,) = Pipeline(tts_engine).run(requests, batch_size=1)
    assert want.entry["ok"], want.entry["error"]
    placement = tmp_path / "placement.json"
    placement.write_text(json.dumps({"groups": [
        {"name": "talker", "stages": ["talker"], "num_cpus": 0.5},
        {"name": "vocoder", "stages": ["code2wav"], "num_cpus": 0.5}]}))  # fmt: skip
    served = Served(tts_engine, tmp_path, "--placement", str(placement))
    try:
        body = {"input": text, "voice": voice, "response_format": "pcm", **GREEDY_SPEECH}
        r = httpx.post(served.url + "/v1/audio/speech", json=body, timeout=120)
        assert r.status_code == 200, r.text
        same_audio(r.content, pcm16(want.audio))
        with httpx.stream("POST", served.url + "/v1/audio/speech", json={**body, "stream": True},
                          timeout=120) as s:  # fmt: skip
            assert s.status_code == 200
            same_audio(b"".join(s.iter_bytes()), pcm16(want.audio))
    finally:
        served.stop()


def test_chat_through_one_deployment(qwen3_engine: Path, tmp_path: Path) -> None:
    prompts = ["Hello there", "What is the capital of France?"]
    requests, _ = parse_request_file({"temperature": 0, "max_generate_length": 6, "requests": [
        {"messages": [{"role": "user", "content": p}]} for p in prompts]})  # fmt: skip
    want = Pipeline(qwen3_engine).run(requests, batch_size=2)
    served = Served(qwen3_engine, tmp_path)
    try:
        for p, w in zip(prompts, want, strict=True):
            r = httpx.post(served.url + "/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": p}], "max_tokens": 6,
                "temperature": 0})  # fmt: skip
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == w.entry["output_text"]
    finally:
        served.stop()
