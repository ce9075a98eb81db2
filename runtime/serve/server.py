"""edge-serve's core: one scheduler loop on a thread of its own, HTTP requests fed into it.

Every HTTP request becomes one request of ``Pipeline.serve``'s in-flight loop, which plans,
prepares and runs it beside the others; its events (text deltas, finished, failed) come back
to the request's own asyncio queue, so one request's output can only reach its own response. A
client that goes away marks its request cancelled, and the loop drops it at its next turn. At
most ``batch_size + max_queue`` requests are in the server at once; past that, ``Busy``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgeomni.runtime.artifacts import CONFIG
from edgeomni.runtime.events import AudioChunk, Event, Failed, Finished, TextDelta
from edgeomni.runtime.pipeline import PREPARE, Pipeline, Submission
from edgeomni.runtime.requests import Request
from edgeomni.runtime.scheduler import CANCELLED, Arrivals
from edgeomni.runtime.serve.metrics import Metrics
from edgeomni.runtime.stage import RequestState

log = logging.getLogger("edge-serve")


class Busy(Exception):
    """The server holds as many requests as it takes; the client should retry later."""


@dataclass
class Pending:
    """A request in the server: its events as they come, and whether its client left."""

    index: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    state: RequestState | None = None  # set once it has left the graph
    submitted: float = field(default_factory=time.perf_counter)
    first: set[str] = field(default_factory=set)  # "token", "audio": seen already
    audio_s: float = 0.0
    invalid: bool = False  # it failed being planned or prepared: its own fault
    cleanup: Callable[[], None] = lambda: None  # run once nothing reads its inline media
    # server-side paths in its errors -> what the client knows them by (its media parts)
    labels: dict[str, str] = field(default_factory=dict)
    route: dict[str, str] = field(default_factory=dict)  # --ray: group -> the replica holding it

    def post(self, item: Any) -> None:
        """Hand an event to the request's response; dropped once the HTTP side has shut down
        (its event loop closed: nobody is left to read it)."""
        with contextlib.suppress(RuntimeError):  # RuntimeError: the event loop is closed
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)


DONE = object()  # the last item of a request's queue
# the error of a request a group's queue had no room for (edge-serve --ray: Ray Serve's
# max_queued_requests), answered 429 as a full server is
BUSY = "busy: a deployment's queue is full"


def scrub(text: str, labels: dict[str, str]) -> str:
    """``text`` with the server's paths in ``labels`` replaced by the client's names for them
    (the longest first: a file's path before its folder's)."""
    for path in sorted(labels, key=len, reverse=True):
        text = text.replace(path, labels[path])
    return text


class LoopThread:
    """A scheduler loop on a thread of its own, fed through ``_arrivals``: what the server
    and a Ray group (relay.GroupLoop) share of starting and stopping one."""

    _arrivals: Arrivals
    _thread: threading.Thread | None = None

    def _start_thread(self, name: str) -> None:
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float | None = None) -> None:
        """Take no more requests; return once those in the loop have left (or ``timeout``)."""
        self._arrivals.close()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


class Server(LoopThread):
    def __init__(self, pipe: Pipeline, *, batch_size: int, max_queue: int) -> None:
        if batch_size < 1 or max_queue < 0:
            raise ValueError(f"batch size {batch_size} must be >= 1, max queue {max_queue} >= 0")
        self.pipe = pipe
        self.batch_size = batch_size
        self.capacity = batch_size + max_queue
        self.texts = set(pipe.text_terminals())  # "stage:port"
        self.text_stages = {port.split(":")[0] for port in self.texts}
        self.audio = set(pipe.audio_terminals())
        self._arrivals = Arrivals()
        self._pending: dict[int, Pending] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self.error: BaseException | None = None  # what stopped the loop, if it failed
        self.finished = 0  # requests that left, failed ones too
        self.cancelled = 0  # of them, those whose client went away first
        self.metrics = Metrics()

    # -- the loop -----------------------------------------------------------------------------
    def start(self) -> None:
        self._start_thread("edge-serve-loop")

    def _run(self) -> None:
        try:
            self.pipe.serve(self._arrivals, batch_size=self.batch_size, listener=self.on_event,
                            done=self.on_done, cancelled=self._cancelled)  # fmt: skip
        except BaseException as e:  # the loop itself failed: every request still here fails
            log.exception("the scheduler loop stopped")
            self.error = e
            with self._lock:
                pending = list(self._pending.values())
            for p in pending:
                p.post(Failed(p.index, "server", str(e)))
                p.post(DONE)

    @property
    def in_flight(self) -> int:
        # no lock: len() of a dict is atomic, and a signal handler reads it (one that waited
        # on a lock the interrupted main thread holds would never return)
        return len(self._pending)

    def on_event(self, event: Event) -> None:
        """An event of a request's (the loop's listener): to its response, counted."""
        with self._lock:
            p = self._pending.get(event.index)
        if p is None:
            return
        kind = None
        if isinstance(event, TextDelta) and event.text:
            kind = "token"
        elif isinstance(event, AudioChunk) and event.samples.size:
            kind = "audio"
            p.audio_s += event.samples.size / event.sample_rate
        if kind is not None and kind not in p.first:
            p.first.add(kind)
            self.metrics.first(kind, time.perf_counter() - p.submitted)
        if isinstance(event, Failed) and event.stage == PREPARE:
            p.invalid = True
        if isinstance(event, TextDelta) and not event.text:
            return  # a token that completes no character yet: nothing to answer, no wake-up
        if isinstance(event, (TextDelta, AudioChunk, Finished, Failed)):
            p.post(event)

    def on_done(self, state: RequestState) -> None:
        """The request has left the graph (``state.error`` set if it failed): counted, and its
        response told."""
        with self._lock:
            p = self._pending.pop(state.index, None)
            self.finished += 1
            self.cancelled += int(state.error == CANCELLED)
        outcome = (
            "ok" if state.error is None
            else "cancelled" if state.error == CANCELLED
            else "invalid" if p is not None and p.invalid
            else "error"
        )  # fmt: skip
        tokens = usage_of(state, self.texts)["completion_tokens"]
        self.metrics.left(outcome, tokens, p.audio_s if p is not None else 0.0)
        self.metrics.prompt(*prompt_positions(state))
        if p is not None:
            p.cleanup()  # it has left the graph: nothing reads its inline media any more
            p.state = state
            p.post(DONE)

    def _cancelled(self, state: RequestState) -> bool:
        with self._lock:
            p = self._pending.get(state.index)
        return p is not None and p.cancelled

    def forget(self) -> None:
        """Count from zero again (what the warm-up ran is not the clients')."""
        with self._lock:
            self.finished = self.cancelled = 0
            self.metrics = Metrics()

    # -- requests -----------------------------------------------------------------------------
    def next_index(self) -> int:
        return next(self._ids)

    def submit(
        self,
        request: Request,
        loop: asyncio.AbstractEventLoop,
        terminals: set[str] | None = None,
        cleanup: Callable[[], None] | None = None,
    ) -> Pending:
        """Put a request into the loop (its index from ``next_index``), for ``terminals``
        (default: the graph's text); Busy when full. ``cleanup`` runs once it has left."""
        if not self.running:
            raise RuntimeError("the server's scheduler loop is not running")
        with self._lock:
            if len(self._pending) >= self.capacity:
                self.metrics.count("rejected")
                raise Busy(f"the server holds {self.capacity} requests")
            p = self._pending[request.index] = Pending(request.index, loop)
            if cleanup is not None:
                p.cleanup = cleanup
        # the text the graph makes unless told (a speech graph's audio is not asked for)
        wanted = self.texts if terminals is None else terminals
        self.enter(p, request, wanted or None)
        return p

    def enter(self, p: Pending, request: Request, wanted: set[str] | None) -> None:
        """Hand a request the server has taken in to the graph: to the loop's arrivals."""
        self._arrivals.put(Submission(request.index, request, wanted))

    def cancel_all(self) -> int:
        """Cancel every request in the server (a second Ctrl-C: the loop drops them at its
        next turn); returns how many there were. Without the lock, as ``in_flight``: copying
        a dict's values is atomic."""
        pending = list(self._pending.values())
        for p in pending:
            p.cancelled = True
        return len(pending)


def stage_configs(pipe: Pipeline) -> dict[str, dict[str, Any]]:
    """Each stage's config.json (the file its engine loads from), by stage id; a stage whose
    file cannot be read is left out (opening the pipeline has already checked them)."""
    out = {}
    for stage in pipe.graph.stages:
        try:
            cfg = json.loads((pipe.engine_dir / stage.artifact / CONFIG).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(cfg, dict):
            out[stage.id] = cfg
    return out


def speakers(pipe: Pipeline) -> tuple[list[str], str | None]:
    """The voices the graph has (a talker's ``speakers``: Qwen3-Omni's, Qwen3-TTS's), sorted,
    and its default (the config's ``default_speaker``, else the first; None without voices)."""
    names: set[str] = set()
    default = None
    for cfg in stage_configs(pipe).values():
        if isinstance(cfg.get("speakers"), dict):
            names |= {str(k) for k in cfg["speakers"]}
            if isinstance(cfg.get("default_speaker"), str):
                default = default or cfg["default_speaker"]
    ordered = sorted(names)
    return ordered, default if default in names else (ordered[0] if ordered else None)


def usage_of(state: RequestState | None, texts: set[str]) -> dict[str, Any]:
    """OpenAI's usage counts from the text stage's report, with the prompt tokens the context
    cache gave (``prompt_tokens_details.cached_tokens``)."""
    prompt = completion = cached = 0
    if state is not None:
        for port in texts:
            report = state.details.get(port.split(":")[0], {})
            prompt = int(report.get("prompt_tokens", prompt) or 0)
            completion = int(report.get("generated_tokens", completion) or 0)
            cached = int(report.get("cached_tokens", cached) or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip


def prompt_positions(state: RequestState) -> tuple[int, int]:
    """Every decoder stage's prompt positions for a request (a text model's, a talker's):
    those the context cache gave and those prefilled."""
    cached = computed = 0
    for report in state.details.values():
        if isinstance(report, dict) and "cached_tokens" in report:
            n = int(report.get("cached_tokens") or 0)
            cached += n
            computed += max(0, int(report.get("prompt_tokens") or 0) - n)
    return cached, computed


def is_busy(event: Failed) -> bool:
    """A request the server had no room for after it was taken in (``BUSY``)."""
    return event.stage == "server" and event.error == BUSY


def is_client_error(event: Failed) -> bool:
    """A request that failed for what it asked (planning or preparing it), not the server."""
    return event.stage == PREPARE or event.error == CANCELLED
