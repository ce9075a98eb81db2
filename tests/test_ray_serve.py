"""edge-serve --ray on a local Ray cluster (2 CPUs) started by the test: the tiny Qwen3-Omni's
stages in two deployments give edge-infer's text, codes and audio, each of 32 concurrent
requests its own; a client that goes away frees its rows in every group; a replica that dies
fails only the requests it held; a placement file's errors name their path. Skipped where Ray
Serve is not installed (the ray extra)."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'edgeomni[ray]')")

from edgeomni.runtime.events import AudioChunk, Failed, TextDelta  # noqa: E402
from edgeomni.runtime.pipeline import Pipeline  # noqa: E402
from edgeomni.runtime.requests import parse_request_file  # noqa: E402
from edgeomni.runtime.serve import placement as pl  # noqa: E402
from edgeomni.runtime.serve.server import DONE  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import omni_reference as ref  # noqa: E402

PROMPTS = ["Hello! How are you today?", "The quick brown fox.", "What is the capital of France?",
           "Hi", "Count to ten, slowly please.", "Good morning.", "Tell me a story.", "Why?"]  # fmt: skip
CLIENTS = 32
BODY = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 8,
        "requests": [{"messages": ref.messages_for(PROMPTS[i % 8] + " " * (i // 8)),
                      "max_generate_length": 3 + i % 5} for i in range(CLIENTS)]}  # fmt: skip
LONG = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 200,
        "requests": [{"messages": ref.messages_for(p), "max_generate_length": 60}
                     for p in PROMPTS[:3]]}  # fmt: skip
GROUPS = [{"name": "text", "stages": ["thinker"], "num_cpus": 0.5},
          {"name": "speech", "stages": ["talker", "code2wav"], "num_cpus": 0.5}]  # fmt: skip


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="edgeomni")
    yield
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def served(cluster, omni_engine: Path):
    from edgeomni.runtime.serve.ray_app import RayServer

    pipe = Pipeline(omni_engine)
    server = RayServer(pipe, pl.parse({"groups": GROUPS}, pipe.graph), batch_size=3,
                       max_queue=CLIENTS, engines={"threads": 1})  # fmt: skip
    server.start()
    yield server
    server.stop()


def submit(server: Any, request: Any) -> Any:
    request = dataclasses.replace(request, index=server.next_index())
    return server.submit(request, asyncio.get_running_loop(), server.texts | server.audio)


async def drain(pending: Any) -> tuple[list, Any]:
    events = []
    while (event := await pending.events.get()) is not DONE:
        events.append(event)
    return events, pending.state


async def ask(server: Any, requests: list) -> list[tuple[list, Any]]:
    """Each request submitted at once; its events and the state it left with."""
    return await asyncio.gather(*(drain(submit(server, r)) for r in requests))


def same(events: list, state: Any, expected: Any) -> None:
    """A request's events and result against edge-infer's outcome for it."""
    assert state.error is None, state.error
    assert not [e for e in events if isinstance(e, Failed)]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == state.outputs["thinker:text"] == expected.entry["output_text"]
    np.testing.assert_array_equal(state.outputs["talker:codes"], expected.codes)
    audio = np.concatenate([e.samples for e in events if isinstance(e, AudioChunk)])
    # the vocoder chunks as the frames come, which a split changes: the stateful tolerance
    np.testing.assert_allclose(audio, expected.audio, atol=1e-4)
    assert state.details["talker"]["finish_reason"] == expected.entry["stages"]["talker"][
        "finish_reason"]  # fmt: skip
    assert {e.index for e in events} == {state.index}  # nothing of another request


def in_flight(server: Any) -> dict[str, int]:
    """Requests each deployment's loop holds (outside an event loop)."""
    return {name: h.status.remote().result()["in_flight"] for name, h in server.handles.items()}


async def in_flight_now(server: Any) -> dict[str, int]:
    names = list(server.handles)
    got = await asyncio.gather(*(server.handles[n].status.remote() for n in names))
    return {n: g["in_flight"] for n, g in zip(names, got, strict=True)}


def test_two_deployments_give_what_edge_infer_gives(served, omni_engine) -> None:
    """32 clients at once through the two deployments: each its own text, codes and audio."""
    requests, _ = parse_request_file(BODY)
    want = Pipeline(omni_engine).run(requests, batch_size=3)
    got = asyncio.run(ask(served, requests))
    for (events, state), expected in zip(got, want, strict=True):
        same(events, state, expected)
    assert in_flight(served) == {"text": 0, "speech": 0}


def test_a_client_that_goes_away_frees_its_rows(served, omni_engine) -> None:
    """Three long requests fill the rows; their clients leave at their first text: each is
    cancelled in both deployments (their loops hold nothing), and the next requests run."""
    long, _ = parse_request_file(LONG)
    short, _ = parse_request_file({**BODY, "requests": BODY["requests"][:2]})
    want = Pipeline(omni_engine).run(short, batch_size=3)

    async def scenario() -> list:
        pending = [submit(served, r) for r in long]
        for p in pending:  # each client leaves once its reply has started
            while not isinstance(await p.events.get(), TextDelta):
                pass
            p.cancelled = True
        left = [await drain(p) for p in pending]
        assert [s.error for _, s in left] == ["cancelled"] * 3
        for _ in range(100):
            if await in_flight_now(served) == {"text": 0, "speech": 0}:
                break
            await asyncio.sleep(0.1)
        assert await in_flight_now(served) == {"text": 0, "speech": 0}
        return await ask(served, short)

    for (events, state), expected in zip(asyncio.run(scenario()), want, strict=True):
        same(events, state, expected)


def test_a_replica_that_dies_fails_only_its_own_requests(cluster, omni_engine) -> None:
    """The speech deployment with two replicas: one is killed while both hold requests. The
    requests it held fail; every other request is edge-infer's; a request after it runs."""
    import ray

    from edgeomni.runtime.serve.ray_app import RayServer

    pipe = Pipeline(omni_engine)
    groups = [{**GROUPS[0], "num_cpus": 0.25}, {**GROUPS[1], "num_cpus": 0.25, "replicas": 2}]
    server = RayServer(pipe, pl.parse({"groups": groups}, pipe.graph), batch_size=3,
                       max_queue=16, engines={"threads": 1}, app="edgeomni-kill")  # fmt: skip
    server.start()
    requests, _ = parse_request_file({**LONG, "requests": LONG["requests"] * 2})
    want = Pipeline(omni_engine).run(requests, batch_size=3)
    try:

        async def scenario() -> tuple[list, set, str]:
            pending = [submit(server, r) for r in requests]
            tasks = [asyncio.ensure_future(drain(p)) for p in pending]
            # every request taken by a speech replica (so which one is known), both holding some
            # (Ray Serve's router sends each to the less loaded of two)
            for _ in range(1200):
                routes = [p.route.get("speech") for p in pending]
                if all(routes) and len(set(routes)) == 2:
                    break
                await asyncio.sleep(0.05)
            assert all(routes) and len(set(routes)) == 2, routes
            victim = pending[0].route["speech"]
            held = {i for i, p in enumerate(pending) if p.route.get("speech") == victim}
            done_before = {i for i, t in enumerate(tasks) if t.done()}
            name = next(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                        if victim in a["name"])  # fmt: skip
            ray.kill(ray.get_actor(name, namespace="serve"))
            return await asyncio.gather(*tasks), held - done_before, victim

        got, held, victim = asyncio.run(scenario())
        assert held and len(held) < len(requests)
        for i, ((events, state), expected) in enumerate(zip(got, want, strict=True)):
            if i in held:
                assert state.error is not None and "server" in [
                    e.stage for e in events if isinstance(e, Failed)]  # fmt: skip
            else:
                same(events, state, expected)
        ((events, state),) = asyncio.run(ask(server, requests[:1]))
        same(events, state, want[0])
    finally:
        server.stop()


def test_a_full_deployment_queue_is_busy(cluster, omni_engine) -> None:
    """A group that takes one request and queues one more, three at once: what finds the queue
    full (the caller's queue holds requests not yet assigned a replica, so one or two of
    them) is answered busy (429 at the HTTP side, as a full edge-serve); what it took is
    edge-infer's."""
    from edgeomni.runtime.serve.ray_app import RayServer
    from edgeomni.runtime.serve.server import BUSY, is_busy

    pipe = Pipeline(omni_engine)
    groups = [{"name": "all", "stages": ["thinker", "talker", "code2wav"], "num_cpus": 0.25,
               "max_ongoing_requests": 1, "max_queued_requests": 1}]  # fmt: skip
    server = RayServer(pipe, pl.parse({"groups": groups}, pipe.graph), batch_size=3,
                       max_queue=16, engines={"threads": 1}, app="edgeomni-busy")  # fmt: skip
    server.start()
    requests, _ = parse_request_file({**BODY, "requests": BODY["requests"][:3]})
    want = Pipeline(omni_engine).run(requests, batch_size=3)
    try:
        got = asyncio.run(ask(server, requests))
    finally:
        server.stop()
    busy = [i for i, (_, state) in enumerate(got) if state.error == BUSY]
    assert 1 <= len(busy) <= 2
    for i, ((events, state), expected) in enumerate(zip(got, want, strict=True)):
        if i in busy:
            assert [is_busy(e) for e in events if isinstance(e, Failed)] == [True]
        else:
            same(events, state, expected)


def test_media_travel_with_the_request(served, omni_engine, tmp_path) -> None:
    """A request with an audio part: the front reads the file as it takes the request in, and
    the thinker's deployment gets the bytes (it may run on another machine), so the file may be
    gone from the front's disk by then (here: removed at once); the reply is edge-infer's."""
    from edgeomni.runtime.audio import write_wav

    t = np.arange(16000) / 16000
    wav = tmp_path / "q.wav"
    write_wav(wav, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)
    body = {**BODY, "requests": [{"max_generate_length": 5, "messages": [{"role": "user",
            "content": [{"type": "audio", "audio": str(wav)},
                        {"type": "text", "text": "Listen."}]}]}]}  # fmt: skip
    requests, _ = parse_request_file(body)
    (want,) = Pipeline(omni_engine).run(requests, batch_size=1)
    assert want.entry["ok"], want.entry["error"]

    async def scenario() -> tuple[list, Any]:
        pending = submit(served, requests[0])
        wav.unlink()
        return await drain(pending)

    events, state = asyncio.run(scenario())
    same(events, state, want)
