"""edge-serve --ray as users start it: the command line, a placement file, a local Ray cluster it
starts itself, the HTTP API. The tiny Qwen3-TTS's talker and code2wav in two deployments speak
edge-infer's audio; the tiny Qwen3's chat completion is edge-infer's text; SIGTERM drains and
exits 0. Skipped where Ray Serve is not installed (the ray extra)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'edgeomni[ray]')")

from serve_process import free_port, sigterm, wait_healthy  # noqa: E402

from edgeomni.runtime.audio import pcm16  # noqa: E402
from edgeomni.runtime.pipeline import Pipeline  # noqa: E402
from edgeomni.runtime.requests import parse_request_file  # noqa: E402

GREEDY_SPEECH = {"talker_do_sample": 0, "subtalker_dosample": 0, "talker_max_new_tokens": 9}


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
        wait_healthy(self.proc, self.url, 180, self.output, poll=0.25)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        out = sigterm(self.proc, 60, self.output)
        assert "Traceback" not in out, out


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


HOLD = """import sys, ray
ray.init(address=sys.argv[1], namespace="hold")
@ray.remote(num_cpus=float(sys.argv[2]))
class Hold:
    def ready(self):
        return True
ray.get(Hold.options(name="hold", lifetime="detached").remote().ready.remote(), timeout=120)
"""


@pytest.fixture(scope="module")
def full_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Ray cluster of the tests' own (2 CPUs, no GPU), its CPUs all held by a detached actor:
    a placement it can hold by its size, whose replicas wait for a CPU forever. Its address."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    log = tmp_path_factory.mktemp("full-cluster") / "ray-start.txt"
    address = f"127.0.0.1:{free_port()}"
    # its own temp dir (short: Ray's socket paths): ray start records the cluster in the temp
    # dir's ray_current_cluster, which a plain ray.init() elsewhere on the machine would join
    temp = tempfile.mkdtemp(prefix="eo-ray-")
    head = subprocess.Popen(
        [sys.executable, "-c", "from ray.scripts.scripts import main; main()", "start", "--head",
         "--block", f"--port={address.rsplit(':', 1)[1]}", "--num-cpus=2", "--num-gpus=0",
         "--include-dashboard=false", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
         f"--temp-dir={temp}"],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        hold = subprocess.run([sys.executable, "-c", HOLD, address, "2"], env=env, timeout=180,
                              capture_output=True, text=True)  # fmt: skip
        assert hold.returncode == 0, hold.stderr + log.read_text(errors="replace")
        yield address
    finally:
        head.send_signal(signal.SIGTERM)  # --block: its processes stop with it
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def joining(address: str, engine: Path, root: Path, *flags: str) -> tuple[subprocess.Popen,
                                                                           Path]:  # fmt: skip
    """edge-serve joining ``address`` (its process, its log), once it has connected."""
    log = root / "edge-serve.txt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgeomni.runtime.serve.cli", "--config", str(engine),
         "--port", str(free_port()), "--ray", "--ray-address", address, "--threads", "1",
         *flags],
        stdout=log.open("w"), stderr=subprocess.STDOUT,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )  # fmt: skip
    deadline = time.time() + 120
    while "Connected to Ray cluster" not in log.read_text(errors="replace"):
        assert proc.poll() is None and time.time() < deadline, log.read_text(errors="replace")
        time.sleep(0.1)
    return proc, log


def no_app_left(address: str) -> None:
    """The cluster holds no edgeomni application (edge-serve removed what it deployed)."""
    script = ("import sys, ray; from ray import serve; ray.init(address=sys.argv[1]); "
              "print(sorted(serve.status().applications))")  # fmt: skip
    for _ in range(30):
        got = subprocess.run([sys.executable, "-c", script, address], capture_output=True,
                             text=True, timeout=120,
                             env={**os.environ, "RAY_AUTH_MODE": "disabled"})  # fmt: skip
        if got.returncode == 0 and "edgeomni" not in got.stdout:
            return
        time.sleep(1)
    raise AssertionError(got.stdout + got.stderr)


def test_groups_the_cluster_cannot_place_are_given_up_on(full_cluster, qwen3_engine,
                                                          tmp_path) -> None:  # fmt: skip
    """A replica that waits for a CPU: --ray-start-timeout ends the wait with one line naming
    the group, exit 1, nothing left deployed on the cluster, the port never opened."""
    proc, log = joining(full_cluster, qwen3_engine, tmp_path, "--ray-start-timeout", "3")
    assert proc.wait(120) == 1, log.read_text()
    out = log.read_text()
    errors = [line for line in out.splitlines() if line.startswith("edge-serve: error:")]
    assert len(errors) == 1, out
    assert ("group 'all' did not start within 3 s (deployment edgeomni-all, 0 of 1 replicas "
            "running") in errors[0], out
    assert "Traceback" not in out and "listening on" not in out, out
    no_app_left(full_cluster)


def test_sigterm_while_the_groups_deploy_exits_143(full_cluster, qwen3_engine, tmp_path) -> None:
    """SIGTERM while edge-serve waits for its replicas: 'interrupted' and 143 as documented,
    no C++ stack dump of Ray's, and what it deployed removed from the cluster."""
    proc, log = joining(full_cluster, qwen3_engine, tmp_path)
    deadline = time.time() + 30  # its replica waits for a CPU forever: till it says it waits
    while "on Ray Serve; waiting" not in log.read_text() and time.time() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 143, log.read_text()
    out = log.read_text()
    assert "edge-serve: interrupted" in out, out
    assert "SIGTERM received" not in out and "Traceback" not in out, out
    no_app_left(full_cluster)


def test_a_placement_the_joined_cluster_cannot_hold_is_refused(full_cluster, qwen3_engine,
                                                               tmp_path) -> None:  # fmt: skip
    """--ray-address: the placement against the resources of the cluster it joined (here, no
    GPU): one line at the group's JSON path, exit 2, nothing deployed (without the check, Ray
    Serve waited for the GPU forever; hence the time limit)."""
    placement = tmp_path / "p.json"
    placement.write_text(json.dumps({"groups": [{"name": "all", "stages": ["llm"],
                                                 "num_gpus": 1}]}))  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "edgeomni.runtime.serve.cli", "--config", str(qwen3_engine),
         "--port", str(free_port()), "--ray", "--ray-address", full_cluster, "--placement",
         str(placement)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last == (f"edge-serve: error: {placement}: $.groups[0].num_gpus: group 'all' needs 1 "
                    "GPU a replica; the cluster has 0 GPU"), run.stderr  # fmt: skip
    assert "deploying" not in run.stderr and "Traceback" not in run.stderr, run.stderr
