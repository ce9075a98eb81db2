"""Stage groups in loops of their own (runtime/serve/relay.py, what edge-serve --ray deploys):
a request split across groups, its upstream's events handed through proxies, gives what one
process gives (text, codes, audio), under concurrency, each request its own; a failure or a
cancel in one group ends the request in every group. In one process, without Ray: the relay's
semantics, which the Ray deployments carry over streamed calls."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeomni import graph_schema
from edgeomni.runtime.events import AudioChunk, Failed, TextDelta
from edgeomni.runtime.pipeline import Pipeline
from edgeomni.runtime.requests import parse_request_file
from edgeomni.runtime.serve import placement as pl
from edgeomni.runtime.serve.relay import CLIENT_EVENTS, GroupLoop, Summary, chain_of, stream

sys.path.insert(0, str(Path(__file__).parent))
import omni_reference as ref  # noqa: E402

PROMPTS = ["Hello! How are you today?", "The quick brown fox.", "What is the capital of France?",
           "Hi", "Count to ten, slowly please."]  # fmt: skip
LENGTHS = [9, 5, 7, 3, 6]
BODY = {"top_k": 1, "talker_top_k": 1, "talker_max_new_tokens": 12,
        "requests": [{"messages": ref.messages_for(p), "max_generate_length": n}
                     for p, n in zip(PROMPTS, LENGTHS, strict=True)]}  # fmt: skip
SPLITS = {
    "two": [{"name": "text", "stages": ["thinker"]},
            {"name": "speech", "stages": ["talker", "code2wav"]}],
    "three": [{"name": "text", "stages": ["thinker"]}, {"name": "talker", "stages": ["talker"]},
              {"name": "vocoder", "stages": ["code2wav"]}],
}  # fmt: skip


@pytest.fixture(scope="module")
def reference(omni_engine: Path) -> list:
    requests, _ = parse_request_file(BODY)
    return Pipeline(omni_engine).run(requests, batch_size=2)


class Split:
    """The engine dir's graph in groups, each group's loop over a Pipeline of its own."""

    def __init__(self, engine: Path, groups: list[dict], batch_size: int = 2) -> None:
        self.pipe = Pipeline(engine)
        self.placement = pl.parse({"groups": groups}, self.pipe.graph)
        self.loops = {g.name: GroupLoop(Pipeline(engine), g.stages, batch_size=batch_size)
                      for g in self.placement.groups}  # fmt: skip
        for loop in self.loops.values():
            loop.start()

    def chain(self, index: int, request: Any, requested=None) -> list:
        plan = graph_schema.plan(self.pipe.graph, request.fields, requested)
        return chain_of(self.placement, plan, index, request, requested)

    def run(self, index: int, request: Any) -> list:
        return list(stream(self.loops, self.chain(index, request)))

    def close(self) -> None:
        for loop in self.loops.values():
            loop.stop(10)


def check(items: list, want: Any) -> None:
    """A request's items against its one-process outcome: its text (in the deltas and the
    output), its codes and audio (in the chunks and the output)."""
    summary, events = items[-1], items[:-1]
    assert isinstance(summary, Summary) and summary.error is None, summary
    assert [i for i in events if not isinstance(i, CLIENT_EVENTS)] == []  # edges stay between
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == summary.outputs["thinker:text"] == want.entry["output_text"]
    np.testing.assert_array_equal(summary.outputs["talker:codes"], want.codes)
    audio = np.concatenate([e.samples for e in events if isinstance(e, AudioChunk)])
    # the vocoder chunks as the frames come, which a split changes: the stateful tolerance
    np.testing.assert_allclose(audio, want.audio, atol=1e-4)
    np.testing.assert_allclose(summary.outputs["code2wav:audio"], want.audio, atol=1e-4)
    assert {"thinker", "talker", "code2wav"} <= set(summary.details)


@pytest.mark.parametrize("split", list(SPLITS))
def test_a_split_graph_gives_what_one_process_gives(omni_engine, reference, split) -> None:
    """Five requests at once through two or three groups (threads, as concurrent clients)."""
    requests, _ = parse_request_file(BODY)
    split_ = Split(omni_engine, SPLITS[split])
    got: dict[int, list] = {}
    try:
        threads = [threading.Thread(target=lambda i=i, r=r: got.__setitem__(i, split_.run(
            1000 + i, r))) for i, r in enumerate(requests)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        split_.close()
    assert sorted(got) == list(range(len(requests)))
    for i, want in enumerate(reference):
        check(got[i], want)


def test_a_failure_upstream_fails_the_request_downstream_alone(omni_engine, reference) -> None:
    """A request whose thinker fails (a prompt past its engine's input) fails in the speech
    group too, with the thinker's error; the others are unaffected."""
    requests, _ = parse_request_file({**BODY, "requests": [
        BODY["requests"][0], {"messages": ref.messages_for("word " * 400)}]})  # fmt: skip
    split = Split(omni_engine, SPLITS["two"])
    try:
        ok, bad = split.run(1, requests[0]), split.run(2, requests[1])
        check(ok, reference[0])
        summary = bad[-1]
        assert isinstance(summary, Summary) and summary.error is not None
        failed = [e for e in bad if isinstance(e, Failed)]
        assert failed and failed[0].error == summary.error
        # no slot is left behind in either group: a new request runs
        check(split.run(3, requests[0]), reference[0])
    finally:
        split.close()


def test_a_request_cancelled_midway_frees_its_rows_in_every_group(omni_engine, reference) -> None:
    """Closing a request's stream after its first audio cancels it in both groups; the next
    requests still run (their rows were freed)."""
    requests, _ = parse_request_file(BODY)
    split = Split(omni_engine, SPLITS["two"], batch_size=1)
    try:
        items = stream(split.loops, split.chain(7, requests[0]))
        for item in items:
            if isinstance(item, AudioChunk):
                break
        items.close()
        for i in (1, 2):
            check(split.run(10 + i, requests[i]), reference[i])
    finally:
        split.close()


def test_placement_errors_name_their_path(omni_engine) -> None:
    """Each fault of a placement file, at its JSON path; and the graph's order kept."""
    graph = Pipeline(omni_engine).graph
    cases = [
        ({"groups": [{"name": "a", "stages": ["thinker", "talker"]}]}, "$.groups",
         "code2wav"),
        ({"groups": [{"name": "a", "stages": ["thinker", "code2wav"]},
                     {"name": "b", "stages": ["talker"]}]}, "$.groups[0].stages", "talker"),
        ({"groups": [{"name": "b", "stages": ["talker", "code2wav"]},
                     {"name": "a", "stages": ["thinker"]}]}, "$.groups[1].stages", "order"),
        ({"groups": [{"name": "a", "stages": ["thinker", "talker", "code2wav"],
                      "num_gpus": -1}]}, "$.groups[0].num_gpus", ">= 0"),
        ({"groups": [{"name": "a", "stages": ["thinker", "tolker", "code2wav"]}]},
         "$.groups[0].stages[1]", "no stage"),
        ({"groups": [{"name": "a", "stages": ["thinker", "talker", "code2wav"], "gpus": 1}]},
         "$.groups[0].gpus", "unknown key"),
        ({"groups": []}, "$.groups", "non-empty"),
        ({"groups": [{"name": "a", "stages": ["thinker", "talker", "code2wav"],
                      "max_ongoing_requests": 0}]}, "$.groups[0].max_ongoing_requests", ">= 1"),
    ]  # fmt: skip
    for data, path, words in cases:
        with pytest.raises(pl.PlacementError) as e:
            pl.parse(data, graph)
        assert e.value.path == path and words in e.value.message, e.value
    # unsaid, a replica holds every request the front admits (ray_app.application)
    every = {"name": "a", "stages": ["thinker", "talker", "code2wav"]}
    assert pl.parse({"groups": [every]}, graph).groups[0].max_ongoing_requests is None
    said = pl.parse({"groups": [{**every, "max_ongoing_requests": 4}]}, graph)
    assert said.groups[0].max_ongoing_requests == 4


def test_a_placement_the_cluster_cannot_hold_names_its_path() -> None:
    """What Ray would wait for forever, refused at the group's JSON path with what the cluster
    has: a replica larger than every node, a group's replicas or all the groups together more
    than its nodes have in all, a custom resource no node has; resources not known yet (a
    local cluster's GPUs before it starts) are not held against it."""

    def placement(*groups: dict) -> pl.Placement:
        return pl.Placement(tuple(pl.Group(**{"stages": (g["name"],), **g}) for g in groups))

    one = [{"CPU": 2.0}]
    two = [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 4.0, "jetson": 1.0}]
    cases = [
        (placement({"name": "all", "num_cpus": 64}), one, "$.groups[0].num_cpus",
         "group 'all' needs 64 CPU a replica; the cluster has 2 CPU"),
        (placement({"name": "a"}, {"name": "b", "replicas": 3}), one, "$.groups[1].replicas",
         "group 'b' needs 3 CPU (3 replicas x 1); the cluster has 2 CPU"),
        (placement({"name": "a", "num_cpus": 1.5}, {"name": "b", "num_cpus": 0.75}), one,
         "$.groups", "the groups need 2.25 CPU together (a 1.5 + b 0.75); the cluster has 2 CPU"),
        (placement({"name": "a", "num_gpus": 0.5}), one, "$.groups[0].num_gpus",
         "needs 0.5 GPU a replica; the cluster has 0 GPU"),
        (placement({"name": "a", "resources": {"jetson": 1}}), one,
         "$.groups[0].resources.jetson", "needs 1 of resource 'jetson' a replica"),
        (placement({"name": "a", "num_cpus": 5}), two, "$.groups[0].num_cpus",
         "no node with more than 4 CPU"),
        (placement({"name": "a", "num_gpus": 1, "resources": {"jetson": 1}}), two, "$.groups[0]",
         "needs 1 CPU, 1 GPU, 1 of resource 'jetson' a replica; no node of the cluster (2 nodes) "
         "has all of it"),
        (placement({"name": "a", "num_gpus": 0.5, "replicas": 3}), two, "$.groups[0].replicas",
         "needs 1.5 GPU (3 replicas x 0.5); the cluster (2 nodes) has 1 GPU"),
    ]  # fmt: skip
    for where, nodes, path, words in cases:
        with pytest.raises(pl.PlacementError) as e:
            pl.check_fits(where, nodes)
        assert e.value.path == path and words in e.value.message, e.value
    # what fits: fractions summed within the nodes, zero asks nothing, GPUs not known yet
    pl.check_fits(placement({"name": "a", "num_cpus": 0.5, "replicas": 2},
                            {"name": "b", "num_cpus": 1, "resources": {"jetson": 0}}), one)
    pl.check_fits(placement({"name": "a", "num_gpus": 1, "resources": {"jetson": 1}},
                            {"name": "b", "num_cpus": 3}), [{**two[0], "jetson": 1}, two[1]])
    pl.check_fits(placement({"name": "a", "num_gpus": 1}), one, unknown={"GPU"})


def test_an_upstream_finish_waits_for_its_outputs() -> None:
    """The upstream's Finished and its outputs may come in different batches: the inbox hands
    the next stage the Finished only with the outputs (in one process a stage sees its
    upstream finish only once the outputs are written, and may read them then)."""
    import threading as th
    from types import SimpleNamespace

    from edgeomni.runtime.events import CodecFrames, Finished
    from edgeomni.runtime.serve.relay import Edge, Inbox
    from edgeomni.runtime.stage import RequestState

    inbox = Inbox("talker", th.Event())
    state = RequestState(index=5, request=None, plan=SimpleNamespace(stages=("talker",)))
    (slot,) = inbox.admit([(state, 0, ())])
    frames = CodecFrames(5, "talker", np.zeros((2, 16), np.int64))
    inbox.put(5, Edge(frames))
    inbox.put(5, Edge(Finished(5, "talker", "eos")))
    assert inbox.step({0: slot}) is True
    assert inbox.update(slot, True) == [frames] and slot.finish is None
    inbox.put(5, Edge(Summary({"talker:codes": np.ones((2, 16))}, {"talker": {"n": 1}}, {})))
    inbox.step({0: slot})
    out = inbox.update(slot, True)
    assert [type(e) for e in out] == [Finished] and slot.finish == "complete"
    assert state.outputs["talker:codes"].shape == (2, 16) and state.details["talker"] == {"n": 1}
    assert inbox.step({0: slot}) is False


def test_an_upstream_group_that_is_gone_fails_the_request_here(omni_engine) -> None:
    """The text group's loop has stopped (its replica died): the speech group fails the request
    with that group's error, and tells the client (a Failed event before its result)."""
    requests, _ = parse_request_file(BODY)
    split = Split(omni_engine, SPLITS["two"])
    try:
        split.loops["text"].stop(10)
        items = split.run(1, requests[0])
        summary = items[-1]
        assert isinstance(summary, Summary) and summary.error is not None
        assert summary.error.startswith("text: RuntimeError: the group's loop is not running")
        failed = [e for e in items if isinstance(e, Failed)]
        assert [e.error for e in failed] == [summary.error]
    finally:
        split.close()


def test_media_files_are_written_here_and_named_in_the_messages(tmp_path) -> None:
    """What a group does with the bytes that came with a request: each file under its folder,
    the messages naming the copies (video frames too), every other part as it was."""
    from edgeomni.runtime.prompt import media_parts
    from edgeomni.runtime.serve.relay import media_files, with_files

    front = tmp_path / "front"
    front.mkdir()
    for name in ("a.wav", "b.png", "f0.png", "f1.png"):
        (front / name).write_bytes(name.encode())
    body = {"requests": [{"messages": [{"role": "user", "content": [
        {"type": "audio", "audio": str(front / "a.wav")},
        {"type": "image", "image": str(front / "b.png")},
        {"type": "video", "video": [str(front / "f0.png"), str(front / "f1.png")], "fps": 2.0},
        {"type": "text", "text": "What is this?"}]}]}]}  # fmt: skip
    (request,), _ = parse_request_file(body)
    files = media_files(request)
    assert sorted(Path(f).name for f in files) == ["a.wav", "b.png", "f0.png", "f1.png"]
    here = tmp_path / "group"
    here.mkdir()
    moved = with_files(request, files, str(here))
    parts = media_parts(moved.messages)
    assert [p.kind for p in parts] == ["audio", "image", "video"]
    for part, name in zip(parts, ("a.wav", "b.png", "f0.png"), strict=True):
        assert Path(part.path).parent == here and Path(part.path).suffix == Path(name).suffix
        assert Path(part.path).read_bytes() == name.encode()
    assert [Path(f).read_bytes() for f in parts[2].frames] == [b"f0.png", b"f1.png"]
    assert parts[2].fps == 2.0 and moved.messages[0]["content"][3]["text"] == "What is this?"
    assert moved.messages[0]["role"] == "user" and moved.fields == request.fields


def test_text_and_edge_events_after_the_first_of_their_kind_may_wait_for_company() -> None:
    from edgeomni.runtime.events import Finished, HiddenRows
    from edgeomni.runtime.serve.relay import FIRST_AT_ONCE, Edge, urgent

    seen: dict[str, int] = {}
    text = TextDelta(0, "thinker", "a", (1,))
    rows = Edge(HiddenRows(0, "thinker", np.zeros((1, 4), np.float32)))
    # a request's first words and first rows go at once, the rest may wait
    assert [urgent(text, seen) for _ in range(FIRST_AT_ONCE + 2)] == [True] * FIRST_AT_ONCE + [False] * 2
    assert [urgent(rows, seen) for _ in range(FIRST_AT_ONCE + 1)] == [True] * FIRST_AT_ONCE + [False]
    audio = AudioChunk(0, "code2wav", np.zeros(8, np.float32), 0, 24000)
    assert all(urgent(audio, seen) for _ in range(FIRST_AT_ONCE + 1))  # audio never waits
    for item in [Finished(0, "talker", "stop"), Edge(Finished(0, "thinker", "stop")),
                 Failed(0, "talker", "x"), Edge(Summary()), Edge(Summary(error="x")), Summary()]:  # fmt: skip
        assert urgent(item, seen), item
    assert not urgent(text, seen) and not urgent(rows, seen)  # ends did not reset the counts


def test_a_replica_streams_text_in_batches_and_audio_at_once() -> None:
    """GroupReplica.run (no Ray needed to drive it): text deltas after the first wait for
    company up to COALESCE_S; audio and the request's end go at once."""
    import asyncio
    import time

    from edgeomni.runtime.serve.ray_app import Accepted, GroupReplica
    from edgeomni.runtime.serve.relay import FIRST_AT_ONCE, Envelope

    class Loop:  # a GroupLoop's surface: the sink a request's items go to
        def submit(self, env: Any, sink: Any) -> None:
            self.sink = sink

        def cancel(self, index: int) -> None:
            raise AssertionError("the request left: nothing to cancel")

    replica = object.__new__(GroupReplica)
    replica.loop, replica.group, replica.replica, replica.upstream = Loop(), "g", "r", {}
    replica.COALESCE_S = 0.5
    audio = AudioChunk(0, "code2wav", np.zeros(8, np.float32), 0, 24000)
    put_audio_at: list[float] = []

    def produce() -> None:
        for i in range(50):
            replica.loop.sink(TextDelta(0, "thinker", str(i), (i,)))
        time.sleep(0.05)
        put_audio_at.append(time.perf_counter())
        replica.loop.sink(audio)
        replica.loop.sink(Summary())

    async def collect() -> list[tuple[float, list]]:
        got = []
        env = Envelope(0, None, None, ("code2wav",))  # type: ignore[arg-type]
        async for items in replica.run([("g", env)]):
            got.append((time.perf_counter(), items))
            if len(got) == 1:
                threading.Thread(target=produce).start()
        return got

    got = asyncio.run(collect())
    flat = [item for _, items in got for item in items]
    assert flat[0] == Accepted("g", "r") and isinstance(flat[-1], Summary)
    texts = [item.text for item in flat if isinstance(item, TextDelta)]
    assert texts == [str(i) for i in range(50)]  # all of them, in order
    # accepted, the first FIRST_AT_ONCE texts (at most one list each), the rest with the
    # audio, left; one a text would be 53
    assert len(got) <= FIRST_AT_ONCE + 3
    sent_audio = next(t for t, items in got if any(i is audio for i in items))
    assert sent_audio - put_audio_at[0] < 0.3  # it did not wait out the half second


def test_a_dead_replicas_media_folders_go_when_a_loop_starts(omni_engine: Path, tmp_path: Path,
                                                             monkeypatch: Any) -> None:  # fmt: skip
    """A group's media folders are named by the process that made them; a loop that starts
    (a replica Ray Serve starts in place of one that was killed, which removed nothing)
    removes those of processes that are gone, and no other process's (bench/soak.py found
    a SIGKILLed replica's folders left in its temp dir)."""
    import subprocess
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"edgeomni-group-media-{gone.pid}-abc"
    alive = tmp_path / f"edgeomni-group-media-{os.getppid()}-def"  # pytest's parent: running
    other = tmp_path / "edgeomni-other-folder"
    for folder in (dead, alive, other):
        folder.mkdir()
        (folder / "part1.wav").write_bytes(b"RIFF")
    loop = GroupLoop(Pipeline(omni_engine), ["thinker"], batch_size=1)
    loop.start()
    try:
        assert not dead.exists()
        assert alive.is_dir() and other.is_dir()
    finally:
        loop.stop(10)
