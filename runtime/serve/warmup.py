"""edge-serve's warm-up: every batch size runs once through the server's own loop before the
port opens.

A GPU build replays a captured CUDA graph for each decode call's shape: one per number of rows
a call spans (1 up to the batch size) for each engine call of a step, the code predictor's
fifteen too, and code2wav's windows per rows and length. Each is captured the first time that
shape runs (milliseconds, up to a tenth of a second each at Qwen3-Omni's real dimensions), and
that shape first comes whenever traffic first reaches that many rows: without a warm-up, the
requests of a server's first minutes wait behind hundreds of captures (on the H200, time to
first audio 5.8 s at 2 requests a second against 0.13 s warmed; docs/benchmarks.md). So the
warm-up sends k requests at once for k = 1 .. batch size, each made of the same body an HTTP
client would send (chat, spoken when the graph speaks, or speech from a given text) with the
graph's own sampling settings, exactly ``tokens`` tokens and ``frames`` codec frames long, and
waits for each cohort to leave. Its requests are not counted in /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from edgeomni.runtime.families import LENGTH_KEYS
from edgeomni.runtime.serve.openai_api import ApiError, Media, chat_request, speech_request
from edgeomni.runtime.serve.server import DONE, Server, speakers, stage_configs

log = logging.getLogger("edge-serve")
TEXT = "Hello! Please say a few words about the weather today."


def needed(server: Server) -> bool:
    """Whether a warm-up pays here: some stage's engine captures each call shape the first
    time it runs (a CUDA graph; elsewhere a call's first run costs about what the next does)."""
    return any(map(server.pipe.engines.captures, stage_configs(server.pipe).values()))


def bodies(server: Server, tokens: int, frames: int) -> tuple[str, dict[str, Any]]:
    """The route ("chat" or "speech") and the body a warm-up request sends."""
    _, voice = speakers(server.pipe)
    # the graph's own sampling settings (as a client's default request takes them), so the
    # calls that run are those traffic runs; only the lengths are fixed
    speech = dict.fromkeys(LENGTH_KEYS, frames)  # as the families declare them
    if not server.texts:  # a graph that speaks a given text
        return "speech", {"input": TEXT, "voice": voice, **speech}
    body: dict[str, Any] = {"messages": [{"role": "user", "content": TEXT}],
                            "max_tokens": tokens, "min_tokens": tokens}  # fmt: skip
    if server.audio and voice is not None:
        body.update(modalities=["text", "audio"], audio={"voice": voice, "format": "pcm16"},
                    **speech)  # fmt: skip
    return "chat", body


def warm_up(server: Server, *, batch_size: int, tokens: int = 8, frames: int = 64) -> dict:
    """Run cohorts of 1 .. ``batch_size`` requests through the started ``server``; returns what
    ran (cohorts, requests, seconds). A request that fails is a RuntimeError: the graph cannot
    serve what a client would send, and the server should not open its port."""
    route, body = bodies(server, tokens, frames)
    start = time.perf_counter()
    asyncio.run(_cohorts(server, route, body, batch_size))
    seconds = time.perf_counter() - start
    server.forget()
    done = {"cohorts": batch_size, "requests": batch_size * (batch_size + 1) // 2,
            "seconds": round(seconds, 2), "route": route}  # fmt: skip
    log.info("warmed up: %d cohorts of 1 to %d requests (%s) in %.1f s", batch_size,
             batch_size, route, seconds)  # fmt: skip
    return done


async def _cohorts(server: Server, route: str, body: dict[str, Any], batch_size: int) -> None:
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="edge-serve-warmup-") as folder:
        media = Media(Path(folder), 0.0, 0)  # no media in a warm-up body
        for k in range(1, batch_size + 1):
            pending = []
            for _ in range(k):
                index = server.next_index()
                try:
                    if route == "speech":
                        request, _ = speech_request(body, index)
                        terminals = server.audio
                    else:
                        request = chat_request(body, index, body["max_tokens"], media)
                        terminals = server.texts | (server.audio if "audio" in body else set())
                except ApiError as e:
                    raise RuntimeError(f"its request is refused: {e.message} ({e.param})") from e
                pending.append(server.submit(request, loop, terminals))
            for p in pending:
                failed = None
                while (event := await p.events.get()) is not DONE:
                    failed = failed or getattr(event, "error", None)
                if p.state is None or p.state.error is not None:
                    raise RuntimeError(f"a warm-up request of {k} failed: "
                                       f"{failed or (p.state and p.state.error)}")  # fmt: skip
