"""An edge-serve process started by a test (tests/test_serve.py, tests/test_serve_faults.py,
tests/test_ray_serve_http.py): a free port, waiting for /health, and a SIGTERM stop."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, seconds: float, output: Callable[[], str],
                 poll: float = 0.1) -> None:  # fmt: skip
    """Until ``url``/health answers 200; fails with ``output()`` if the process ends first or
    ``seconds`` pass."""
    deadline = time.time() + seconds
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.time() < deadline, output()
        time.sleep(poll)


def sigterm(proc: subprocess.Popen, seconds: float, output: Callable[[], str]) -> str:
    """SIGTERM, and exit 0 within ``seconds`` (killed otherwise): the process's output."""
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(seconds) == 0, output()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return output()
