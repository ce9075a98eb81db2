"""A group of a graph's stages in a process of its own (edge-serve --ray: one Ray Serve
deployment a group), and the items its requests send to the next group and to the front.

``GroupLoop`` runs the scheduler loop (runtime/scheduler.run_graph) over the group's stages and
over proxies standing in for the stages of other groups next to them: an ``Inbox`` in place of
each stage before the group (its rows are the requests whose upstream runs elsewhere; it hands
the next stage the events that upstream emitted, as the stage itself would, and its outputs
when it is done) and an ``Outbox`` in place of each stage after it (it consumes the events the
group's last stage emits, as that next stage would, and sends them on). So a stage runs the
same in one process or split across several: it sees the same events, in the same order.

Everything here is plain Python and picklable: the transport (Ray Serve's streamed calls, or
in a test a queue) moves ``Envelope``s and items (``Item``) between loops. Items a request's
group sends:

- a TextDelta, AudioChunk, Finished or Failed of one of the group's own
  stages, for the client (the front); also the Failed of a request whose upstream failed it
  (where the upstream's replica died, nobody else tells the client; the front passes on a
  request's first Failed only).
- ``Edge(event)``: an event of the group's last stage for the next group's first stage; once
  that stage has finished, ``Edge(Summary)``: the request's outputs so far (or, if it failed
  in this group, its error).
- ``Summary``: the request left the group (for the last group's: its result).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import shutil
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgeomni import graph_schema
from edgeomni.runtime.events import AudioChunk, Event, Failed, Finished, HiddenRows, TextDelta
from edgeomni.runtime.memory import to_host
from edgeomni.runtime.pipeline import PREPARE, Pipeline
from edgeomni.runtime.requests import Request
from edgeomni.runtime.scheduler import Arrivals, failure, run_graph
from edgeomni.runtime.serve.server import LoopThread
from edgeomni.runtime.stage import Output, RequestState

log = logging.getLogger("edge-serve")
# a group's request media folders, named by the process that made them (then a random tail):
# one killed (SIGKILL, the OOM killer) removes nothing, so a loop starting on the machine
# removes those of processes that are gone
MEDIA_PREFIX = "edgeomni-group-media-"


@dataclass(frozen=True)
class Envelope:
    """A request for one group: its index (unique across the deployment: the front draws it),
    the request, the terminals asked for, the group's run of the request's stages, and the
    stages before and after that run (in other groups), if any."""

    index: int
    request: Request
    requested: tuple[str, ...] | None
    path: tuple[str, ...]
    upstream: str | None = None
    downstream: str | None = None
    # the request's media files by the path its messages name them (for a group whose stages
    # read them: the group may run on another machine than the front that wrote them)
    files: Mapping[str, bytes] = field(default_factory=dict)


def media_files(request: Request) -> dict[str, bytes]:
    """Every media file the request's messages name, read (the front, as it takes it in)."""
    from pathlib import Path

    from edgeomni.runtime.prompt import media_parts

    return {f: Path(f).read_bytes() for part in media_parts(request.messages)
            for f in part.files()}  # fmt: skip


def with_files(request: Request, files: Mapping[str, bytes], folder: str) -> Request:
    """The request with its media files written under ``folder`` and its messages naming those
    copies (each kept under its own name's suffix, which the readers go by)."""
    from pathlib import Path

    from edgeomni.runtime.prompt import MEDIA_KINDS

    local = {}
    for i, (path, data) in enumerate(files.items()):
        copy = Path(folder) / f"{i}{Path(path).suffix}"
        copy.write_bytes(data)
        local[path] = str(copy)

    def moved(value: Any) -> Any:
        if isinstance(value, str):
            return local.get(value, value)
        if isinstance(value, (list, tuple)):
            return type(value)(moved(v) for v in value)
        return value

    messages = []
    for message in request.messages:
        content = message.get("content")
        if not isinstance(content, (list, tuple)):
            messages.append(message)
            continue
        parts = [{**part, **{k: moved(part[k]) for k in MEDIA_KINDS if k in part}}
                 for part in content]  # fmt: skip
        messages.append({**message, "content": type(content)(parts)})
    return dataclasses.replace(request, messages=tuple(messages))


@dataclass(frozen=True)
class Summary:
    """A request as it left a group (its last item): its outputs (every port a stage wrote for
    it, as ``Pipeline.run``'s outcome has them: the codes besides the text and audio), the
    stages' reports, its predictions fields, and its error (None: it succeeded)."""

    outputs: Mapping[str, Output] = field(default_factory=dict)
    details: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    entry: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class Edge:
    """For the next group's first stage (its inbox): an event of the group's last stage, or
    (a Summary) the request as that stage left it: its outputs so far, or its error."""

    event: Event | Summary


CLIENT_EVENTS = (TextDelta, AudioChunk, Finished, Failed)
Item = TextDelta | AudioChunk | Finished | Failed | Edge | Summary
Sink = Callable[[Item], None]


FIRST_AT_ONCE = 8  # a request's first items of each kind that never wait (urgent)


def urgent(item: Item, seen: dict[str, int]) -> bool:
    """Whether ``item`` leaves at once rather than waiting a little to travel with the items
    after it (each streamed item costs the transport about a millisecond of the sending
    process, whose loop shares the interpreter with it: at GPU speed, one item a token or a
    frame per request starves the loop). Urgent: the first FIRST_AT_ONCE items of each kind for
    the request (its first words, hidden rows, the codes of the vocoder's first window), audio,
    and whatever ends something (a Finished, a Failed, a Summary).
    ``seen``: how many of each kind were sent for the request."""
    if isinstance(item, TextDelta):
        key = "text"
    elif isinstance(item, Edge) and not isinstance(item.event, (Finished, Failed, Summary)):
        key = f"edge:{type(item.event).__name__}"
    else:
        return True  # audio, and whatever ends something
    seen[key] = seen.get(key, 0) + 1
    return seen[key] <= FIRST_AT_ONCE


def portable(event: Event) -> Event:
    """The event as it can leave the process: a stage's rows on the host."""
    if isinstance(event, HiddenRows):
        return dataclasses.replace(event, rows=to_host(event.rows))
    return event


# ---------------------------------------------------------------------------------------------
# proxies
# ---------------------------------------------------------------------------------------------
@dataclass
class _ProxySlot:
    state: RequestState
    row: int
    finish: str | None = None
    got: list[Edge] = field(default_factory=list)
    last: Finished | None = None  # an inbox's upstream Finished, until its outputs come


class _Proxy:
    """What the stand-ins for another group's stages share as stages of the loop."""

    relay = True  # never waits for a fuller batch (run_graph's patience)

    def ready(self, state: Any, upstream_done: bool, events: Sequence[Any]) -> bool:
        return True

    def move(self, slot: _ProxySlot, row: int) -> None:
        slot.row = row


class Inbox(_Proxy):
    """Stands in for an upstream stage of another group: ``put`` hands it that stage's items
    for a request (any thread); each step takes them in, and its update gives the events to the
    next stage and, at its Summary, the request's outputs so far."""

    consumes = False
    polls = True  # the loop waits a while after a turn of empty polls (run_graph's idle)

    def __init__(self, stage_id: str, wake: threading.Event) -> None:
        self.stage_id = stage_id
        self._wake = wake
        self._items: dict[int, deque[Edge]] = {}
        self._lock = threading.Lock()

    def put(self, index: int, item: Edge) -> None:
        with self._lock:
            self._items.setdefault(index, deque()).append(item)
        self._wake.set()

    def drop(self, index: int) -> None:
        with self._lock:
            self._items.pop(index, None)

    def admit(self, entries: Sequence[tuple[Any, int, Sequence[Any]]]) -> list[_ProxySlot]:
        return [_ProxySlot(state, row) for state, row, _ in entries]

    def step(self, slots: Mapping[int, _ProxySlot]) -> bool:
        took = False
        with self._lock:
            for slot in slots.values():
                queue = self._items.get(slot.state.index)
                while queue:
                    slot.got.append(queue.popleft())
                    took = True
        return took

    def update(self, slot: _ProxySlot, events: bool) -> list[Event]:
        out: list[Event] = []
        got, slot.got = slot.got, []
        for item in got:
            event = item.event
            if isinstance(event, Finished):
                # held until the outputs are in (its Summary, which may come in a later batch):
                # in one process the next stage sees the upstream finish only once it has
                # written its outputs, which that stage then reads
                slot.last = event
            elif not isinstance(event, Summary):
                out.append(event)
            elif event.error is not None:
                slot.state.error = slot.state.error or event.error  # kept as the upstream's
                raise RuntimeError(event.error)
            else:
                state = slot.state
                state.outputs.update(event.outputs)
                for sid, report in event.details.items():
                    state.details.setdefault(sid, {}).update(report)
                state.entry.update(event.entry)
                if slot.last is not None:
                    out.append(slot.last)
                slot.finish = "complete"
        return out if events else []

    def consume(self, slot: _ProxySlot, event: Any) -> None:
        raise RuntimeError(f"{self.stage_id}: an inbox consumes nothing")

    def retire(self, slot: _ProxySlot) -> None:
        self.drop(slot.state.index)

    def discard(self, slot: _ProxySlot) -> None:
        self.drop(slot.state.index)


class Outbox(_Proxy):
    """Stands in for a downstream stage of another group: it consumes the events the group's
    last stage emits for a request and sends them (``send(index, item)``), then, once that
    stage has finished, the request's outputs; a request that fails here sends its error."""

    consumes = True

    def __init__(self, stage_id: str, send: Callable[[int, Item], None]) -> None:
        self.stage_id = stage_id
        self._send = send
        self.ended: set[int] = set()  # requests whose Summary went out

    def admit(self, entries: Sequence[tuple[Any, int, Sequence[Any]]]) -> list[_ProxySlot]:
        slots = []
        for state, row, held in entries:
            slot = _ProxySlot(state, row)
            for event in held:
                self.consume(slot, event)
            slots.append(slot)
        return slots

    def consume(self, slot: _ProxySlot, event: Any) -> None:
        self._send(slot.state.index, Edge(portable(event)))
        if isinstance(event, Finished):
            slot.finish = "upstream"  # settled in update, once the stage's outputs are in

    def step(self, slots: Mapping[int, _ProxySlot]) -> None:
        return None

    def update(self, slot: _ProxySlot, events: bool) -> list[Any]:
        if slot.finish is not None and slot.state.index not in self.ended:
            state = slot.state
            outputs = {port: to_host(v) for port, v in state.outputs.items()}
            self._send(state.index, Edge(Summary(outputs, state.details, dict(state.entry))))
            self.ended.add(state.index)
        return []

    def retire(self, slot: _ProxySlot) -> None:
        return None

    def discard(self, slot: _ProxySlot) -> None:
        self.fail(slot.state.index, slot.state.error or "failed")

    def fail(self, index: int, error: str) -> None:
        if index not in self.ended:
            self.ended.add(index)
            self._send(index, Edge(Summary(error=error)))


# ---------------------------------------------------------------------------------------------
# a group's loop
# ---------------------------------------------------------------------------------------------
class _Arrivals(Arrivals):
    """Arrivals that wake the loop's idle wait too."""

    def __init__(self, wake: threading.Event) -> None:
        super().__init__()
        self._wake = wake

    def put(self, state: Any) -> None:
        super().put(state)
        self._wake.set()

    def close(self) -> None:
        super().close()
        self._wake.set()


class GroupLoop(LoopThread):
    """One group's scheduler loop on a thread of its own. ``submit(envelope, sink)`` puts a
    request in (its items go to ``sink``, called on the loop's thread); ``feed(index,
    upstream, item)`` hands it an item the stage ``upstream`` of another group sent;
    ``cancel(index)`` drops it at the next turn."""

    IDLE_WAIT_S = 0.05  # how long a turn with only empty polls waits for an item

    def __init__(self, pipe: Pipeline, stages: Sequence[str], *, batch_size: int,
                 proxy_rows: int = 256) -> None:  # fmt: skip
        order = graph_schema.topological_order(pipe.graph)
        unknown = sorted(set(stages) - set(order))
        if unknown or not stages:
            raise ValueError(f"stages {unknown or list(stages)}: not stages of this graph")
        mine = [s for s in order if s in set(stages)]
        lo, hi = order.index(mine[0]), order.index(mine[-1])
        if list(order[lo : hi + 1]) != mine:
            raise ValueError(f"stages {mine} are not consecutive in the graph's order {order}")
        self.pipe, self.stages, self.batch_size = pipe, tuple(mine), batch_size
        self.wake = threading.Event()
        self.inboxes = {sid: Inbox(sid, self.wake) for sid in order[:lo]}
        self.outboxes = {sid: Outbox(sid, self._send) for sid in order[hi + 1 :]}
        self.proxy_rows = proxy_rows
        self._arrivals = _Arrivals(self.wake)
        self._sinks: dict[int, Sink] = {}
        self._downstream: dict[int, str] = {}
        self._cancelled: set[int] = set()
        self._folders: dict[int, str] = {}  # a request's media files here, by its index
        self._lock = threading.Lock()
        self.error: BaseException | None = None

    # -- the loop -----------------------------------------------------------------------------
    def start(self) -> None:
        self.pipe.open(set(self.stages))  # every engine loads before the first request
        _remove_orphaned_media()
        self._start_thread("edge-serve-group")

    @property
    def in_flight(self) -> int:
        """Requests in the group (submitted, not yet left)."""
        return len(self._sinks)

    def _run(self) -> None:
        pipe = self.pipe
        stages: dict[str, Any] = dict(self.inboxes)
        stages.update({sid: pipe.slot_stage(sid) for sid in self.stages})
        stages.update(self.outboxes)
        widths = {sid: self.proxy_rows for sid in stages}
        widths.update({sid: pipe.width(sid, self.batch_size) for sid in self.stages})
        for stage in stages.values():  # a vocoder's calls on a thread of its own wake it too
            if getattr(stage, "polls", False) and hasattr(stage, "wakes"):
                stage.wakes.append(self.wake)
        try:
            run_graph(stages, [], widths, listener=self._event, done=self._done,
                      patience=pipe.patience, feed=_GroupFeed(self),
                      cancelled=lambda s: s.index in self._cancelled, idle=self._idle)  # fmt: skip
        except BaseException as e:  # the loop itself failed: every request here fails
            log.exception("the group loop over %s stopped", ", ".join(self.stages))
            self.error = e
            with self._lock:
                sinks = dict(self._sinks)
            for index, sink in sinks.items():
                self._end(index, sink, Summary(error=f"server: {failure(e)}"))

    def _idle(self) -> None:
        self.wake.wait(self.IDLE_WAIT_S)
        self.wake.clear()

    # -- requests -----------------------------------------------------------------------------
    def submit(self, envelope: Envelope, sink: Sink) -> None:
        if not self.running:
            raise RuntimeError("the group's loop is not running")
        with self._lock:
            if envelope.index in self._sinks:
                raise ValueError(f"request {envelope.index} is in this group already")
            self._sinks[envelope.index] = sink
        self._arrivals.put(envelope)

    def feed(self, index: int, upstream: str, item: Edge) -> None:
        """An item the stage ``upstream`` (of another group) sent for request ``index``."""
        inbox = self.inboxes.get(upstream)
        if inbox is None:
            raise ValueError(f"{upstream!r} is no stage before this group's {self.stages}")
        if self._sink(index) is not None:  # late items of a request that left are dropped
            inbox.put(index, item)

    def cancel(self, index: int) -> None:
        if self._sink(index) is not None:
            self._cancelled.add(index)
            self.wake.set()

    def _sink(self, index: int) -> Sink | None:
        with self._lock:
            return self._sinks.get(index)

    def _send(self, index: int, item: Item) -> None:
        sink = self._sink(index)
        if sink is not None:
            sink(item)

    def _event(self, event: Event) -> None:
        if event.stage in self.inboxes and not isinstance(event, Failed):
            return  # an upstream's events as this group's inbox replays them: sent already
        # (its failure is sent: where the upstream's replica died, no one else tells it; the
        # front passes on a request's first Failed only)
        if isinstance(event, CLIENT_EVENTS):
            self._send(event.index, event)

    def _done(self, state: RequestState) -> None:
        with self._lock:
            sink = self._sinks.get(state.index)
            down = self._downstream.pop(state.index, None)
        self._cancelled.discard(state.index)
        if sink is None:
            return
        if down is not None:  # the next group hears of a request that ended here early
            self.outboxes[down].fail(state.index, state.error or "ended before its next stage")
            self.outboxes[down].ended.discard(state.index)
        outputs = {port: to_host(value) for port, value in state.outputs.items()}
        self._end(state.index, sink, Summary(outputs, state.details, dict(state.entry),
                                             state.error))  # fmt: skip

    def _local(self, env: Envelope) -> Envelope:
        """The envelope with its media files here (a folder of the request's, removed as it
        leaves the group)."""
        if not env.files:
            return env
        folder = tempfile.mkdtemp(prefix=f"{MEDIA_PREFIX}{os.getpid()}-")
        with self._lock:
            self._folders[env.index] = folder
        return dataclasses.replace(env, request=with_files(env.request, env.files, folder),
                                   files={})  # fmt: skip

    def _end(self, index: int, sink: Sink, summary: Summary) -> None:
        with self._lock:
            self._sinks.pop(index, None)
            folder = self._folders.pop(index, None)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        for inbox in self.inboxes.values():
            inbox.drop(index)
        sink(summary)


def _remove_orphaned_media() -> None:
    """Remove the media folders (``MEDIA_PREFIX`` PID-...) of processes no longer running."""
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        pid = name[len(MEDIA_PREFIX) :].split("-", 1)[0]
        if not name.startswith(MEDIA_PREFIX) or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # gone; a pid in use by anyone (PermissionError) is kept
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            log.info("removed %s, the media folder of a process that is gone", name)
        except OSError:
            pass


class _GroupFeed:
    """The group loop's feed: envelopes taken from its arrivals, planned against the whole
    graph (their stages must be the group's run of the plan), prepared for the group's own
    stages, then given the plan the loop runs: [inbox] + the run + [outbox]."""

    def __init__(self, group: GroupLoop) -> None:
        self.group = group

    @property
    def closed(self) -> bool:
        return self.group._arrivals.closed

    def take(self, wait: bool) -> list[RequestState]:
        group, pipe = self.group, self.group.pipe
        ready, errors = [], {}
        envelopes = []
        for env in group._arrivals.take(wait):
            try:
                envelopes.append(group._local(env))
            except OSError as e:  # this machine's disk: the request fails, not the loop
                envelopes.append(env)
                errors[env.index] = f"its media files could not be written here: {e}"
        for env in envelopes:
            if env.index in errors:
                continue
            state = pipe.admit(env.index, env.request, env.requested)
            if isinstance(state, str):
                errors[env.index] = state
            elif error := _check_path(env, state.plan, group):
                errors[env.index] = error
            else:  # prepared here: the group's stages
                state.plan = dataclasses.replace(state.plan, stages=env.path)
                ready.append((env, state))
        errors.update(pipe.prepare([s for _, s in ready]))
        out = []
        for env, state in ready:
            if env.index in errors:
                continue
            local = ((env.upstream,) if env.upstream else ()) + env.path
            if env.downstream:
                local += (env.downstream,)
                with group._lock:
                    group._downstream[env.index] = env.downstream
            state.plan = dataclasses.replace(state.plan, stages=local)
            out.append(state)
        for env in envelopes:
            if env.index in errors:
                sink = group._sink(env.index)
                if sink is not None:
                    sink(Failed(env.index, PREPARE, errors[env.index]))
                    group._end(env.index, sink, Summary(error=errors[env.index]))
        return out


def _check_path(env: Envelope, plan: graph_schema.Plan, group: GroupLoop) -> str | None:
    """The envelope's stages against the plan this group makes of the request."""
    stages = list(plan.stages)
    if not env.path or any(s not in group.stages for s in env.path):
        return f"stages {list(env.path)} are not this group's ({', '.join(group.stages)})"
    at = stages.index(env.path[0]) if env.path[0] in stages else -1
    run = tuple(stages[at : at + len(env.path)])
    before = stages[at - 1] if at > 0 else None
    after = stages[at + len(env.path)] if at + len(env.path) < len(stages) else None
    if at < 0 or run != env.path or before != env.upstream or after != env.downstream:
        return (f"the request's plan {stages} does not run {list(env.path)} between "
                f"{env.upstream} and {env.downstream} here")  # fmt: skip
    if (before and before not in group.inboxes) or (after and after not in group.outboxes):
        return f"the request's plan {stages} leaves this group's stages in the middle"
    return None


# ---------------------------------------------------------------------------------------------
# a request's way through its groups
# ---------------------------------------------------------------------------------------------
class Upstream:
    """What a group makes of the items its upstream group streams for one request: edge items
    go to its inbox, client events are passed on (``take`` returns them), and an upstream that
    let the request go without saying (its Summary with an error, or a broken stream: ``fail``)
    fails it here too."""

    def __init__(self, group: GroupLoop, index: int, stage: str) -> None:
        self.group, self.index, self.stage = group, index, stage
        self.ended = False

    def take(self, item: Item) -> Item | None:
        if isinstance(item, Edge):
            self.ended = self.ended or isinstance(item.event, Summary)
            self.group.feed(self.index, self.stage, item)
            return None
        if isinstance(item, Summary):
            self.fail(item.error or "its upstream group let it go before its stage finished")
            return None
        return item

    def fail(self, error: str) -> None:
        if not self.ended:
            self.ended = True
            self.group.feed(self.index, self.stage, Edge(Summary(error=error)))


def chain_of(placement: Any, plan: graph_schema.Plan, index: int, request: Request,
             requested: Sequence[str] | None, graph: graph_schema.Graph | None = None,
             files: Mapping[str, bytes] | None = None) -> list[tuple[str, Envelope]]:  # fmt: skip
    """A request's envelope for each group it visits, in order (group name, envelope);
    ``files`` (``media_files``) go to the groups with a stage that reads a media field of the
    request (``graph``'s inputs say which)."""
    from edgeomni.runtime.prompt import MEDIA_KINDS

    reads = set()
    if files and graph is not None:
        reads = {s.id for s in graph.stages for i in s.inputs if i.request_field in MEDIA_KINDS}
    segments = placement.segments(plan.stages)
    stages = list(plan.stages)
    chain = []
    for group, path in segments:
        at = stages.index(path[0])
        end = at + len(path)
        chain.append((group.name, Envelope(
            index, request, tuple(requested) if requested is not None else None, path,
            upstream=stages[at - 1] if at else None,
            downstream=stages[end] if end < len(stages) else None,
            files=dict(files or {}) if reads & set(path) else {},
        )))  # fmt: skip
    return chain


def stream(
    groups: Mapping[str, GroupLoop], chain: Sequence[tuple[str, Envelope]]
) -> Iterator[Item]:
    """One request through its groups in this process, as the Ray deployments run it across
    processes: the last group's items, its upstream groups' client events passed on (for tests
    and benchmarks; edge-serve --ray's deployments do the same with streamed calls). Closing
    the iterator early cancels the request in every group."""
    name, env = chain[-1]
    group = groups[name]
    items: queue.Queue[Item] = queue.Queue()
    group.submit(env, items.put)
    pull = None
    if len(chain) > 1:
        upstream = Upstream(group, env.index, str(env.upstream))

        def relay() -> None:
            try:
                for item in stream(groups, chain[:-1]):
                    passed = upstream.take(item)
                    if passed is not None:
                        items.put(passed)
            except Exception as e:  # noqa: BLE001 (a broken upstream fails the request)
                upstream.fail(f"{chain[-2][0]}: {failure(e)}")
            else:  # (a no-op once the upstream's edge ended: the usual way)
                upstream.fail(f"{chain[-2][0]}: its stream ended before the request's stage "
                              "there did")  # fmt: skip

        pull = threading.Thread(target=relay, daemon=True)
        pull.start()
    finished = False
    try:
        while True:
            item = items.get()
            yield item
            if isinstance(item, Summary):
                finished = True
                return
    finally:
        if not finished:
            group.cancel(env.index)
