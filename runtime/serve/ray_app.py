"""edge-serve --ray: the graph's stage groups as Ray Serve deployments behind edge-serve's own
OpenAI-compatible front (needs the ``ray`` extra; the embedded runtime never imports this).

Each group of the placement (serve/placement.py) is a deployment whose replicas each run a
``GroupLoop`` (serve/relay.py) over the group's stages. A request's way: the front calls the
last group the request visits with a streamed call; that replica submits the request to its
loop and, for the stages before its own, calls the group before it the same way, and so on
back to the first. Each group's stream carries its own client events, the events its last
stage hands the next group (for that group's inbox), and at the end the request as it left.
So every call of a request goes to one replica of each group, chosen once (Ray Serve's
router), and a request's items only ever travel on its own calls: nothing is keyed by a
batch position. A client that goes away cancels the front's call; Ray Serve cancels the
replica's generator, which cancels the request in its loop and its call upstream. A replica
that dies fails the requests whose calls it held; the others go on, and Ray Serve starts a
new replica for later requests. ``max_ongoing_requests`` / ``max_queued_requests`` bound each
group; a full queue is answered 429 at the front.
"""

from __future__ import annotations

import asyncio
import contextlib
import copyreg
import functools
import logging
import os
import re
import signal
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgeomni import graph_schema
from edgeomni.runtime.events import Failed
from edgeomni.runtime.pipeline import PREPARE, Pipeline
from edgeomni.runtime.requests import Request
from edgeomni.runtime.scheduler import CANCELLED, failure
from edgeomni.runtime.serve.placement import Placement, check_fits
from edgeomni.runtime.serve.relay import (
    CLIENT_EVENTS,
    Envelope,
    GroupLoop,
    Item,
    Summary,
    Upstream,
    chain_of,
    media_files,
    urgent,
)
from edgeomni.runtime.serve.server import BUSY, Pending, Server
from edgeomni.runtime.stage import RequestState

log = logging.getLogger("edge-serve")
APP = "edgeomni"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# a request's fields are read-only mappings (types.MappingProxyType), which pickle cannot take:
# they cross to the replicas as dicts and are read-only mappings again there
copyreg.pickle(types.MappingProxyType, lambda m: (types.MappingProxyType, (dict(m),)))


class StartError(RuntimeError):
    """The groups did not start: which, and what Ray says of each."""


@dataclass(frozen=True)
class Accepted:
    """A replica's first item for a request: which replica of which group holds it."""

    group: str
    replica: str


_initializing = False  # within init_keeping_sigterm's ray.init (read by the forked child)


def init_keeping_sigterm(**options: Any) -> None:
    """``ray.init``, SIGTERM and SIGINT left to the handlers that were there. ray.init sets
    SIGTERM to sys.exit(15), and its core worker installs absl's failure handler under it (a
    C++ stack dump, then exit 15, or 134 as Ray shuts down half started), so edge-serve's 143
    and its cleanup would be Ray's. Both signals wait while it runs, its threads start with
    them blocked, and the handlers come back after it (absl's is gone); one that came is
    raised then, as the handler would have (interrupts.deferred). The processes it starts
    (a local cluster's) unblock them as they fork."""
    global _initializing
    import ray

    from edgeomni.builder import interrupts

    if threading.current_thread() is not threading.main_thread():  # no handlers to keep
        ray.init(**options)
        return
    _unblocking_children()
    _initializing = True
    try:
        with interrupts.deferred():
            ray.init(**options)
    finally:
        _initializing = False


@functools.cache
def _unblocking_children() -> None:
    """Once: a child forked within ray.init (Ray starts its processes with a preexec_fn, so
    Python's at-fork hooks run in them) does not keep SIGINT and SIGTERM blocked."""

    def unblock() -> None:
        if _initializing:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))

    os.register_at_fork(after_in_child=unblock)


def said(message: str) -> str:
    """What Ray says of a deployment, on one line: a replica's failure is its first sentence
    and the exception's last line (the traceback between is in Ray's logs)."""
    lines = [ANSI.sub("", line).strip() for line in message.strip().splitlines()]
    lines = [line for line in lines if line]
    if len(lines) > 1 and "Traceback" in message:
        return f"{lines[0].split(' Error:', 1)[0]} {lines[-1]}"
    return " ".join(lines)


def deployment_name(group: str) -> str:
    return f"edgeomni-{group}"


class GroupReplica:
    """One replica of a group's deployment: its Pipeline over the engine dir, its loop, and
    handles to the groups before it."""

    COALESCE_S = 0.03  # how long a request's text deltas and edge events may wait for company

    def __init__(self, group: str, engine_dir: str, stages: Sequence[str], batch_size: int,
                 engines: Mapping[str, Any], upstream: Mapping[str, Any]) -> None:  # fmt: skip
        from ray import serve

        from edgeomni.runtime.engine import Engines

        options = dict(engines)
        budget = options.pop("context_cache_mb", None)  # each group's own cache, this budget
        pipe = Pipeline(engine_dir, engines=Engines(**options), context_cache_mb=budget)
        self.loop = GroupLoop(pipe, stages, batch_size=batch_size)
        self.loop.start()
        self.upstream = dict(upstream)
        self.group = group
        self.replica = serve.get_replica_context().replica_id.unique_id

    def status(self) -> dict[str, Any]:
        """What this replica holds: its group, its id, the requests in its loop."""
        return {"group": self.group, "replica": self.replica, "in_flight": self.loop.in_flight,
                "running": self.loop.running}  # fmt: skip

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose loop stopped is replaced."""
        if not self.loop.running:
            raise RuntimeError(f"the loop over {self.loop.stages} stopped: {self.loop.error}")

    async def run(self, chain: list[tuple[str, Envelope]]):  # noqa: ANN201 (an async generator)
        """A request's items from this group (``chain[-1]`` its envelope here; the groups
        before it, the rest), its upstream groups' client events passed on: lists of items,
        each what was ready when the last was sent."""
        _, env = chain[-1]
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Item] = asyncio.Queue()
        hurry, seen = asyncio.Event(), {}

        def put(item: Item) -> None:  # on this event loop's thread
            items.put_nowait(item)
            if urgent(item, seen):
                hurry.set()

        self.loop.submit(env, lambda item: loop.call_soon_threadsafe(put, item))
        pull = asyncio.create_task(self._pull(chain, put)) if len(chain) > 1 else None
        left, sent = False, loop.time()
        try:
            yield [Accepted(self.group, self.replica)]  # which replica holds it, for the front
            while not left:
                # what is ready goes as one streamed item; unless something urgent is among it,
                # it waits until COALESCE_S after the last one for more (relay.urgent says why)
                got = [await items.get()]
                if not hurry.is_set() and (wait := sent + self.COALESCE_S - loop.time()) > 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(hurry.wait(), wait)
                hurry.clear()
                while not items.empty():
                    got.append(items.get_nowait())
                left = isinstance(got[-1], Summary)
                sent = loop.time()
                yield got
        finally:
            if not left:  # the caller went away (or this replica is going): drop it here too
                self.loop.cancel(env.index)
            if pull is not None:
                pull.cancel()

    async def _pull(self, chain: list[tuple[str, Envelope]], put: Callable[[Item], None]) -> None:
        _, env = chain[-1]
        name = chain[-2][0]
        upstream = Upstream(self.loop, env.index, str(env.upstream))
        stream = self.upstream[name].options(stream=True).run.remote(chain[:-1])
        try:
            async for got in stream:
                for item in got:
                    passed = upstream.take(item)
                    if passed is not None:
                        put(passed)
        except asyncio.CancelledError:
            stream.cancel()
            raise
        except Exception as e:  # noqa: BLE001 (its replica died, say: the request fails here)
            upstream.fail(f"{name}: {failure(e)}")
        else:  # (a no-op once the upstream's edge ended: the usual way)
            upstream.fail(f"{name}: its stream ended before the request's stage there did")


def application(engine_dir: str, placement: Placement, batch_size: int,
                engines: Mapping[str, Any], admitted: int | None = None) -> Any:  # fmt: skip
    """The placement as a Ray Serve application: one deployment a group, each bound to the
    groups before it (the last group is the application's ingress). A group's replica holds
    at most ``max_ongoing_requests`` requests, unsaid every one the front admits
    (``admitted``: its batch size + queue; default the batch size): its own loop queues what
    its rows cannot hold yet and takes each in as a row frees, where Ray Serve's router would
    hand it over later (it retries with backoff)."""
    from ray import serve

    bound: dict[str, Any] = {}
    for group in placement.groups:
        options: dict[str, Any] = {
            "name": deployment_name(group.name),
            "num_replicas": group.replicas,
            "max_ongoing_requests": group.max_ongoing_requests or admitted or batch_size,
            "ray_actor_options": {"num_gpus": group.num_gpus, "num_cpus": group.num_cpus,
                                  "resources": dict(group.resources)},
        }  # fmt: skip
        if group.max_queued_requests >= 0:
            options["max_queued_requests"] = group.max_queued_requests
        deployment = serve.deployment(GroupReplica).options(**options)
        bound[group.name] = deployment.bind(group.name, engine_dir, list(group.stages),
                                            batch_size, dict(engines), dict(bound))  # fmt: skip
    return bound[placement.groups[-1].name]


class RayServer(Server):
    """edge-serve's ``Server`` with the graph's groups on Ray Serve: the same requests, events
    and results for the HTTP side (serve/app.py), no scheduler loop of its own."""

    def __init__(self, pipe: Pipeline, placement: Placement, *, batch_size: int, max_queue: int,
                 address: str | None = None, engines: Mapping[str, Any] | None = None,
                 num_cpus: int | None = None, app: str = APP) -> None:  # fmt: skip
        super().__init__(pipe, batch_size=batch_size, max_queue=max_queue)
        self.app = app
        self.placement = placement
        self.address = address
        self.engines = dict(engines or {})
        self.num_cpus = num_cpus
        self.handles: dict[str, Any] = {}
        self._up = False
        self._deployed = False  # the application is on Ray Serve (stop removes it)
        self._tasks: set[asyncio.Future] = set()

    def start(self, timeout: float | None = None) -> None:
        """Connect to Ray (``address``, or a local cluster), check the placement against its
        resources (a PlacementError), deploy the groups, and wait for their replicas (every
        engine loads before the port opens): a StartError if a group fails or is not running
        within ``timeout`` seconds (None: no limit). What was deployed is removed again if it
        does not start, an interrupt included."""
        import ray
        from ray import serve

        if not ray.is_initialized():
            init_keeping_sigterm(address=self.address, num_cpus=self.num_cpus,
                                 namespace="edgeomni", log_to_driver=False)  # fmt: skip
        check_fits(self.placement, [n["Resources"] for n in ray.nodes() if n["Alive"]])
        serve.start(proxy_location="Disabled")
        app = application(str(self.pipe.engine_dir), self.placement, self.batch_size,
                          self.engines, self.capacity)  # fmt: skip
        self._deployed = True
        log.info("deploying %s on Ray Serve; waiting %s for their replicas",
                 ", ".join(repr(g.name) for g in self.placement.groups),
                 "without a limit" if timeout is None else f"up to {timeout:g} s")  # fmt: skip
        try:
            serve.run_many([serve.RunTarget(app, name=self.app, route_prefix=None)],
                           wait_for_applications_running=False)  # fmt: skip
            self._wait(timeout)
        except BaseException:
            self._remove(blocking=False)  # a cluster of others' must not keep placing them
            raise
        self.handles = {g.name: serve.get_deployment_handle(deployment_name(g.name), self.app)
                        for g in self.placement.groups}  # fmt: skip
        self._up = True

    def _wait(self, timeout: float | None) -> None:
        """Until every deployment runs: what Ray says of one still starting is logged as it
        changes; a StartError if the application fails, or at ``timeout``."""
        from ray import serve

        deadline = None if timeout is None else time.monotonic() + timeout
        told: dict[str, str] = {}
        while True:
            status = serve.status().applications.get(self.app)
            if status is not None and status.status == "RUNNING":
                return
            if status is not None and status.status == "DEPLOY_FAILED":
                raise StartError(self._not_started(status, "failed") or status.message)
            for name, d in (status.deployments if status is not None else {}).items():
                if d.message and told.get(name) != d.message:
                    told[name] = d.message
                    log.warning("%s: %s", name, said(d.message))
            if deadline is not None and time.monotonic() >= deadline:
                raise StartError(self._not_started(status, f"did not start within {timeout:g} s")
                                 or f"the application did not start within {timeout:g} s")
            time.sleep(0.5)

    def _not_started(self, status: Any, what: str) -> str:
        """The groups whose deployment is not healthy: each one's replicas running, and what
        Ray says of it."""
        out = []
        for group in self.placement.groups:
            d = None if status is None else status.deployments.get(deployment_name(group.name))
            if d is not None and d.status == "HEALTHY":
                continue
            running = 0 if d is None else d.replica_states.get("RUNNING", 0)
            why = f"; Ray says: {said(d.message)}" if d is not None and d.message else ""
            out.append(f"group {group.name!r} {what} (deployment {deployment_name(group.name)}, "
                       f"{running} of {group.replicas} replicas running{why})")
        return "; ".join(out)

    def stop(self, timeout: float | None = None) -> None:
        """Take no more requests, and remove the application (its replicas stop)."""
        self._up = False
        self._remove(blocking=True)

    def _remove(self, blocking: bool) -> None:
        if not self._deployed:
            return
        self._deployed = False
        from ray import serve

        with contextlib.suppress(Exception):  # a cluster already gone has nothing to remove
            serve.delete(self.app, _blocking=blocking)

    @property
    def running(self) -> bool:
        return self._up

    def enter(self, p: Pending, request: Request, wanted: set[str] | None) -> None:
        """Drive the request's call through the groups on the HTTP side's event loop."""
        try:  # read now: the media may be on this machine only, and go once the request leaves
            files = media_files(request)
        except OSError as e:
            files = e
        task = asyncio.run_coroutine_threadsafe(self._drive(p, request, wanted, files), p.loop)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drive(self, p: Pending, request: Request, wanted: set[str] | None,
                     files: dict[str, bytes] | OSError) -> None:  # fmt: skip
        """The request's call to the last group it visits, its items into the front's events;
        its media files go with it to the groups that read them."""
        plan = graph_schema.plan(self.pipe.graph, request.fields, wanted)
        state = RequestState(index=request.index, request=request, plan=plan)
        if not plan.ok:
            return self._leave(state, PREPARE, plan.error or "the graph cannot serve this request")
        if isinstance(files, OSError):
            return self._leave(state, PREPARE, f"a media file could not be read: {files}")
        try:
            chain = chain_of(self.placement, plan, request.index, request,
                             sorted(wanted) if wanted is not None else None,
                             self.pipe.graph, files)  # fmt: skip
        except ValueError as e:
            return self._leave(state, PREPARE, str(e))
        stream = self.handles[chain[-1][0]].options(stream=True).run.remote(chain)
        watcher = asyncio.ensure_future(self._watch(p, stream))
        try:
            async for got in stream:
                for item in got:
                    if isinstance(item, Accepted):
                        p.route[item.group] = item.replica
                    elif isinstance(item, Summary):
                        state.outputs.update(item.outputs)
                        state.details.update(item.details)
                        state.entry.update(item.entry)
                        state.error = item.error
                        self.on_done(state)
                        return
                    elif isinstance(item, Failed):
                        if not state.error:  # the first: the groups after it report it again
                            state.error = item.error
                            self.on_event(item)
                    elif isinstance(item, CLIENT_EVENTS):
                        self.on_event(item)
            raise RuntimeError("the group's stream ended before the request left it")
        except asyncio.CancelledError:
            stream.cancel()
            self._leave(state, "server", CANCELLED)
        except Exception as e:  # noqa: BLE001 (a full queue, a replica that died: this one fails)
            from ray.serve.exceptions import BackPressureError, RequestCancelledError

            if isinstance(e, RequestCancelledError) or p.cancelled:
                self._leave(state, "server", CANCELLED)
            elif isinstance(e, BackPressureError):
                self._leave(state, "server", BUSY)
            else:
                log.warning("request %d failed in Ray Serve: %s", request.index, failure(e))
                self._leave(state, "server", failure(e))
        finally:
            watcher.cancel()

    async def _watch(self, p: Pending, stream: Any) -> None:
        """Cancel the request's call once its client has gone (the HTTP side marks it)."""
        while not p.cancelled:
            await asyncio.sleep(0.05)
        stream.cancel()

    def _leave(self, state: RequestState, stage: str, error: str) -> None:
        if not state.error:  # no Failed passed on yet
            self.on_event(Failed(state.index, stage, error))
        state.error = error
        self.on_done(state)
