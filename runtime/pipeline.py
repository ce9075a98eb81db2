"""Walk requests through the graph: plan and prepare each, then run them all through one
scheduler loop (runtime/scheduler.run_graph) over the stages, in flight or in cohorts.

Scheduling is pure Python; stages own their engine calls and sampling.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import resource
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from edgeomni import graph_schema
from edgeomni.runtime import memory
from edgeomni.runtime.context_cache import ContextCache, auto_budget_mb
from edgeomni.runtime.engine import Engines
from edgeomni.runtime.events import Failed, Listener
from edgeomni.runtime.families import TEXT_FALLBACKS, control_labels
from edgeomni.runtime.requests import BadRequest, Request
from edgeomni.runtime.runners import RUNNER_KINDS, RUNNERS, check_emits
from edgeomni.runtime.scheduler import PATIENCE, Arrivals, Cohorts, SlotStage, failure, run_graph
from edgeomni.runtime.stage import RequestError, RequestState

GRAPH_FILE = "multistage_config.json"
BATCHING = ("inflight", "cohort")
PREPARE = "prepare"  # the stage a served request fails in when it cannot be planned or prepared
IDLE_WAIT_S = 0.01  # the longest a turn of empty polls waits for a vocoder call to end (woken)


@dataclass(frozen=True)
class Submission:
    """A request for ``Pipeline.serve``: its index (unique in the server's run), the validated
    request, and the terminals asked for (None: all the plan reaches)."""

    index: int
    request: Request
    requested: Collection[str] | None = None


class _Preparing:
    """``Pipeline.serve``'s feed to the scheduler: submissions taken from the server's
    arrivals, planned and prepared on the loop's thread as they come."""

    def __init__(
        self, pipe: Pipeline, feed: Arrivals, listener: Listener,
        done: Callable[[RequestState], None],
    ) -> None:  # fmt: skip
        self.pipe, self.feed, self.listener, self.done = pipe, feed, listener, done

    @property
    def closed(self) -> bool:
        return self.feed.closed

    def take(self, wait: bool) -> list[RequestState]:
        """The submissions that arrived, planned, then prepared together (their media encoded
        in shared calls); those that fail go to the listener and ``done``."""
        planned, errors = [], {}
        subs = self.feed.take(wait)
        for sub in subs:
            state = self.pipe.admit(sub.index, sub.request, sub.requested)
            if isinstance(state, str):
                errors[sub.index] = state
            else:
                planned.append(state)
        errors.update(self.pipe.prepare(planned))
        for sub in subs:
            if sub.index in errors:
                error = errors[sub.index]
                failed = RequestState(sub.index, sub.request, graph_schema.Plan((), (), error=error),
                                      error=error)  # fmt: skip
                self.listener(Failed(sub.index, PREPARE, error))
                self.done(failed)
        return [s for s in planned if s.index not in errors]


@contextlib.contextmanager
def woken(stages: Iterable[Any]) -> Iterator[Callable[[], None] | None]:
    """run_graph's ``idle`` for stages that poll work on a thread of their own (a vocoder's
    calls: their ``wakes``, events set as each call ends): a turn in which they took nothing in
    waits until one ends, at most IDLE_WAIT_S (a served request arriving then waits that
    long). None: no stage polls so."""
    lists = [s.wakes for s in stages if getattr(s, "polls", False) and hasattr(s, "wakes")]
    if not lists:
        yield None
        return
    wake = threading.Event()
    for wakes in lists:
        wakes.append(wake)

    def idle() -> None:
        wake.wait(IDLE_WAIT_S)
        wake.clear()

    try:
        yield idle
    finally:
        for wakes in lists:
            wakes.remove(wake)


def resolve_config(path: str | Path) -> Path:
    """--config takes the engine dir or the graph file inside it."""
    path = Path(path)
    return path / GRAPH_FILE if path.is_dir() else path


def load_graph(path: str | Path) -> tuple[Path, graph_schema.Graph]:
    """Load and validate the graph against the runners this runtime has (no engine is loaded)."""
    file = resolve_config(path)
    graph = graph_schema.validate_file(file, runners=RUNNER_KINDS)
    check_emits(graph)
    return file.parent, graph


@dataclass
class StageProfile:
    calls: int = 0
    seconds: float = 0.0
    requests: int = 0


@dataclass
class Profile:
    stages: dict[str, StageProfile] = field(default_factory=dict)
    load_seconds: float = 0.0
    wall_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {
            "wall_ms": round(self.wall_seconds * 1e3, 3),
            "load_ms": round(self.load_seconds * 1e3, 3),
            "peak_rss_mb": round(peak_kb / 1024, 1),
            "stages": {
                sid: {
                    "cohorts": p.calls,
                    "requests": p.requests,
                    "total_ms": round(p.seconds * 1e3, 3),
                }
                for sid, p in self.stages.items()
            },
        }


@dataclass
class Outcome:
    """One request's result: its predictions entry, and the arrays the CLI writes to files."""

    entry: dict[str, Any]
    audio: Any = None  # float32 samples of the audio terminal, if one was produced
    sample_rate: int | None = None
    codes: Any = None  # int64 [frames, groups] from the codec port, if one was produced


INTERRUPTED = "interrupted before it finished"
log = logging.getLogger("edge-infer")


class StageError(RuntimeError):
    """A stage of the graph cannot be opened (a broken engine dir): no request runs."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during ``Pipeline.run``: ``signal`` is the interrupt that came, and
    ``outcomes`` what the run had, every request not finished failed as interrupted."""

    def __init__(self, signal: KeyboardInterrupt, outcomes: list[Outcome]) -> None:
        super().__init__()
        self.signal = signal
        self.outcomes = outcomes


class Pipeline:
    def __init__(
        self,
        config: str | Path,
        *,
        engines: Engines | None = None,
        whole_utterance: bool = False,
        code2wav_streaming: str | None = None,
        stream_stages: bool = False,
        batching: str = "inflight",
        patience: int = PATIENCE,
        vocoder_threads: int | None = None,
        context_cache_mb: float | None = None,
    ) -> None:
        """``engines``: how the stages open their engines (CPU threads, CUDA graphs; by default
        Engines()'s).
        ``whole_utterance``, ``code2wav_streaming``: how the stages that make audio vocode (set
        in their stage config: whole utterances; streaming stateful or in windows).
        ``vocoder_threads``: the stages that make audio vocode on a thread of their own beside
        the other stages (stage config ``own_thread``), their engines on that many CPU threads
        (the others keep ``engines``' threads: the decoders read memory at their best on all
        the cores, and the vocoder takes the time they leave), a GPU engine on a stream of its
        own (runtime/memory.py's lanes).
        ``context_cache_mb``: the context cache's budget in MiB (runtime/context_cache.py:
        prompt blocks and encoded clips reused by later requests); 0 off; None the default
        (``auto_budget_mb``: on where the machine has the memory).
        ``stream_stages``: a stage that reads the next one's output as it is made (the talker
        the thinker's) starts before that stage finishes; otherwise stages run one after another.
        ``batching``: ``inflight`` (requests join and leave each stage's running batch) or
        ``cohort`` (requests enter in fixed cohorts, each stage admitting a cohort together:
        the spec's batching); the same scheduler loop steps every stage either way."""
        if batching not in BATCHING:
            raise ValueError(f"batching must be one of {', '.join(BATCHING)}, got {batching!r}")
        self.batching = batching
        if patience < 0:
            raise ValueError(f"patience must be >= 0 turns, got {patience}")
        self.patience = patience
        self.engine_dir, self.graph = load_graph(config)
        vocoding: dict[str, Any] = {}
        if whole_utterance:  # the stages that make audio vocode after the talker, in one pass
            vocoding["whole_utterance"] = True
        if code2wav_streaming is not None:  # how they stream: stateful or windows
            vocoding["streaming"] = code2wav_streaming
        if vocoder_threads is not None:
            if vocoder_threads < 1:
                raise ValueError(f"vocoder_threads must be >= 1, got {vocoder_threads}")
            vocoding["own_thread"] = True
        self.vocoder_threads = vocoder_threads
        if vocoding:
            self.graph = dataclasses.replace(
                self.graph,
                stages=tuple(
                    dataclasses.replace(s, config={**s.config, **vocoding})
                    if any(e.kind == "audio" for e in s.emits)
                    else s
                    for s in self.graph.stages
                ),
            )
        self.engines = engines or Engines()
        # the default keeps GPU decoders out: their blocks' copies cost more than the prefill
        # they save at the sizes measured (docs/benchmarks.md); a budget given is used as given
        self._cache_given = context_cache_mb is not None
        if context_cache_mb is None:
            context_cache_mb = auto_budget_mb()
        if context_cache_mb < 0:
            raise ValueError(f"context_cache_mb must be >= 0, got {context_cache_mb}")
        self.context_cache = ContextCache(int(context_cache_mb * 2**20)) if context_cache_mb else None
        self.stream_stages = stream_stages
        self._runners: dict[str, Any] = {}
        self._alone = True  # the stages being opened run alone (see open)
        self._slot_stages: dict[str, SlotStage] = {}
        self.profile = Profile()
        self._kinds = {s.port(e.id): e.kind for s in self.graph.stages for e in s.emits}
        # the request fields some stage reads (request:<field> inputs)
        self._request_fields = {
            inp.request_field for s in self.graph.stages for inp in s.inputs if inp.request_field
        }

    def runner(self, stage_id: str) -> Any:
        """Stage runners load on first use, so a text-only run never loads speech engines."""
        if stage_id not in self._runners:
            start = time.perf_counter()
            stage = self.graph.stage(stage_id)
            factory = RUNNERS[stage.runner].load()
            folder = self.engine_dir / stage.artifact
            engines = self.engines.alone(self._alone)
            if self.vocoder_threads is not None and stage.config.get("own_thread"):
                # its calls on a thread of their own, a GPU engine's on a stream of its own
                engines = dataclasses.replace(engines, threads=self.vocoder_threads,
                                              lane=memory.BESIDE)  # fmt: skip
            self._runners[stage_id] = factory(stage, folder, engines=engines)
            self._use_cache(self._runners[stage_id])
            self.profile.load_seconds += time.perf_counter() - start
        return self._runners[stage_id]

    def _use_cache(self, part: Any) -> None:
        """Attach the context cache to a runner or slot stage that takes one; the default
        budget skips a decoder whose rows are on a GPU."""
        hook = getattr(part, "use_context_cache", None)
        on_gpu = not getattr(part, "on_host", True)
        if hook is not None and self.context_cache is not None and (self._cache_given or not on_gpu):
            hook(self.context_cache)

    def devices(self) -> frozenset[str]:
        """Where the engines of the stages loaded so far run (their configs' ``device``, the
        folders under a stage's included: its encoders, its code predictor)."""
        import json

        out = set()
        for sid in self._runners:
            for config in (self.engine_dir / self.graph.stage(sid).artifact).rglob("config.json"):
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    device = json.loads(config.read_text(encoding="utf-8")).get("device", "cpu")
                    out.add(str(device).partition(":")[0])  # "cuda:1" is a cuda engine
        return frozenset(out)

    def widest(self, batch_size: int) -> int | None:
        """The most rows any stage loaded so far takes in one call at ``batch_size`` (None when
        none is loaded)."""
        return max((self.width(sid, batch_size) for sid in self._runners), default=None)

    def reads(self) -> frozenset[str]:
        """The request keys the stages loaded so far read (their runners' ``reads``)."""
        return frozenset(k for runner in self._runners.values() for k in runner.reads)

    def terminals_of_kind(self, kind: str) -> tuple[str, ...]:
        return tuple(
            stage.port(e.id)
            for stage in self.graph.stages
            for e in stage.emits
            if e.terminal and e.kind == kind
        )

    def text_terminals(self) -> tuple[str, ...]:
        return self.terminals_of_kind("text")

    def audio_terminals(self) -> tuple[str, ...]:
        return self.terminals_of_kind("audio")

    def stages_emitting(self, kind: str) -> frozenset[str]:
        """The stages with an output of this kind (terminal or not): whose events carry it."""
        return frozenset(port.split(":")[0] for port, k in self._kinds.items() if k == kind)

    def check(self) -> None:
        """What opening each stage reads (configs, tables, tokenizers, engine files), checked
        without loading an engine; a StageError names the first fault."""
        for stage in self.graph.stages:
            with self._opening(stage):
                RUNNERS[stage.runner].load().check(stage, self.engine_dir / stage.artifact)

    def open(self, stage_ids: Collection[str]) -> None:
        """Load these stages' runners now, so a broken engine dir stops the run before any
        request does work; a StageError names the stage. A stage opened for a run of several
        stages gets engines whose CPU threads do not spin between calls (the stages take
        turns); one opened alone keeps them spinning (its calls come back to back)."""
        self._alone = len(set(stage_ids)) <= 1
        for stage in self.graph.stages:
            if stage.id in stage_ids:
                with self._opening(stage):
                    self.runner(stage.id)

    @contextlib.contextmanager
    def _opening(self, stage: graph_schema.Stage) -> Iterator[None]:
        try:
            yield
        except Exception as e:
            log.debug("opening stage %s failed", stage.id, exc_info=True)
            raise StageError(f"stage {stage.id!r} ({stage.artifact}): {e}") from e

    def run(
        self,
        requests: Sequence[Request | BadRequest],
        *,
        batch_size: int,
        requested: Collection[str] | None = None,
        listener: Listener | None = None,
    ) -> list[Outcome]:
        """Run every request; returns one outcome per request, in input order. ``listener``
        gets each request's events (text deltas, finished, failed) in order as they happen.

        A request that fails (when it is prepared, or in a stage's call on its cohort) fails
        alone, with its error. A stage that cannot be opened is a StageError before any request
        runs. Ctrl-C or SIGTERM raises ``Interrupted`` with the outcomes so far: the requests
        that finished, and the others failed as interrupted.
        """
        start = time.perf_counter()
        states: list[RequestState] = []
        failed: dict[int, str] = {}
        ready: list[RequestState] = []
        for pos, item in enumerate(requests):
            state = item.error if isinstance(item, BadRequest) else self.admit(pos, item, requested)
            if isinstance(state, str):
                failed[pos] = state
            else:
                ready.append(state)
        done: set[int] = set(failed)
        try:
            self.open({sid for state in ready for sid in state.plan.stages})
            errors = self.prepare(ready)
            failed.update(errors)
            done.update(errors)
            states.extend(s for s in ready if s.index not in errors)
            if states:
                self._run_graph(states, batch_size, listener, done)
        except KeyboardInterrupt as e:
            for pos in range(len(requests)):
                if pos not in done:
                    failed[pos] = INTERRUPTED
            raise Interrupted(e, self._entries(requests, states, failed)) from None
        finally:
            self.profile.wall_seconds += time.perf_counter() - start
        return self._entries(requests, states, failed)

    def admit(
        self, index: int, request: Request, requested: Collection[str] | None = None
    ) -> RequestState | str:
        """The request planned through the graph (for ``requested`` terminals; None: all the
        plan reaches), as its stages read it: its state, for ``prepare``; or the error that
        fails it. Nothing is loaded or run."""
        unread = sorted(set(request.speech) - self._request_fields)
        if unread:
            return (
                f"{', '.join(unread)}: no stage of this graph reads "
                f"{'it' if len(unread) == 1 else 'them'} (a {control_labels(unread)} control; this graph "
                f"runs {', '.join(self.graph.stage_ids)})"
            )
        plan = graph_schema.plan(self.graph, request.fields, requested)
        if not plan.ok:
            return plan.error or "the graph cannot serve this request"
        reads = {inp.source for sid in plan.stages for inp in self.graph.stage(sid).inputs}
        return RequestState(index=index, request=self._as_read(request), plan=plan,
                            wanted=frozenset(reads | set(plan.terminals)))  # fmt: skip

    def _as_read(self, item: Request) -> Request:
        """The request as this graph reads it: on a graph with no text model a given text
        model's key a family declares a fallback for (families' ``text_fallbacks``: Qwen3-TTS's
        ``repetition_penalty``, as qwen3_tts_inference reads it) is that stage key's, unless
        the stage key is given too."""
        moved = {to: getattr(item.sampling, key) for key, to in TEXT_FALLBACKS.items()
                 if key in item.given and to not in item.stage_settings}  # fmt: skip
        if self.text_terminals() or not moved:
            return item
        extra = {**item.stage_settings, **moved}
        return dataclasses.replace(item, stage_settings=MappingProxyType(extra))

    def serve(
        self,
        feed: Arrivals,
        *,
        batch_size: int,
        listener: Listener,
        done: Callable[[RequestState], None],
        cancelled: Callable[[RequestState], bool],
    ) -> None:
        """Run requests as they arrive, until ``feed`` is closed and the last has left (the
        server's loop). The feed carries ``Submission``s; each is planned and prepared on this
        thread as it is taken (so every engine call stays on it), then joins the running
        batches. One that cannot be planned or prepared gets a ``Failed`` event from stage
        ``PREPARE`` (its own fault: a client error) and ``done``; ``done(state)`` is called as
        each request leaves, with ``state.error`` set if it failed. Requests are batched in
        flight, whatever ``batching`` says."""
        self.open(set(self.graph.stage_ids))
        stages = {sid: self.slot_stage(sid) for sid in self.graph.stage_ids}
        prepared = _Preparing(self, feed, listener, done)
        with woken(stages.values()) as idle:
            run_graph(
                stages, [], {sid: self.width(sid, batch_size) for sid in stages},
                listener=listener, done=done, patience=self.patience, feed=prepared,
                cancelled=cancelled, idle=idle,
            )  # fmt: skip

    def slot_stage(self, stage_id: str) -> SlotStage:
        """The stage as the scheduler loop steps it (one for the pipeline's life)."""
        if stage_id not in self._slot_stages:
            runner = self.runner(stage_id)
            stage = runner.slot_stage(stream_upstream=self.stream_stages)
            self._use_cache(stage)
            self._slot_stages[stage_id] = stage
        return self._slot_stages[stage_id]

    def _run_graph(
        self, states: list[RequestState], batch_size: int, listener: Listener | None,
        done: set[int],
    ) -> None:  # fmt: skip
        """Every request through one scheduler loop over the stages they plan: in flight, or
        in cohorts (requests with equal stages, request fields, voice and batch-wide settings,
        the spec's batching), each admitted together."""
        used = {sid for state in states for sid in state.plan.stages}
        stages = {s.id: self.slot_stage(s.id) for s in self.graph.stages if s.id in used}
        cohorts = None
        if self.batching == "cohort":
            cohorts = Cohorts(
                lambda s: (s.plan.stages, s.request.fields, s.request.voice,
                           s.request.batch_settings),
                max(1, batch_size),
            )  # fmt: skip
        seconds: dict[str, float] = {}

        def leave(state: RequestState) -> None:
            done.add(state.index)
            for report in state.details.values():  # how the stages batched it
                report["batching"] = self.batching

        try:
            with woken(stages.values()) as idle:
                run_graph(
                    stages, states, {sid: self.width(sid, batch_size) for sid in stages},
                    listener=listener, done=leave, seconds=seconds, patience=self.patience,
                    cohorts=cohorts, idle=idle,
                )  # fmt: skip
        finally:
            for sid, spent in seconds.items():
                prof = self.profile.stages.setdefault(sid, StageProfile())
                prof.calls += 1
                prof.requests += sum(sid in s.plan.stages for s in states)
                prof.seconds += spent

    def prepare(self, states: Sequence[RequestState]) -> dict[int, str]:
        """Each planned stage's own per-request work (tokenizing, encoding media, checking
        limits and voices), before any cohort runs, for requests that arrived together (a
        stage batches its encoders across them); the error that fails each request that
        fails, by its index."""
        errors: dict[int, str] = {}
        for stage_id in self.graph.stage_ids:
            batch = [s for s in states if stage_id in s.plan.stages and s.index not in errors]
            if not batch:
                continue
            for state, prepared in zip(
                batch, self.runner(stage_id).prepare_many(batch), strict=True
            ):
                if isinstance(prepared, RequestError):
                    errors[state.index] = str(prepared)
                elif isinstance(prepared, Exception):
                    log.debug("request %d failed in %s", state.index, stage_id,
                              exc_info=prepared)  # fmt: skip
                    errors[state.index] = f"{stage_id}: {failure(prepared)}"
                elif prepared is not None:
                    state.prepared[stage_id] = prepared
        return errors

    def width(self, stage_id: str, batch_size: int) -> int:
        """Rows one call of this stage takes: the batch size, capped by the engine's build
        and by the graph's ``max_batch`` for the stage when it sets one."""
        width = min(batch_size, self.runner(stage_id).max_batch or batch_size)
        cap = self.graph.stage(stage_id).max_batch
        return max(1, min(width, cap) if cap else width)

    def _entries(
        self, requests: Sequence[Request | BadRequest], states: list[RequestState],
        failed: dict[int, str],
    ) -> list[Outcome]:  # fmt: skip
        by_pos = {s.index: s for s in states}
        text_ports = self.text_terminals()
        kinds = self._kinds
        outcomes = []
        for pos, item in enumerate(requests):
            state = by_pos.get(pos)
            error = failed.get(pos) or (state.error if state is not None else None)
            text = None
            if state is not None and error is None:
                text = next((state.outputs[p] for p in text_ports if p in state.outputs), None)
            entry = prediction_entry(pos, item, state, text, error)
            outcome = Outcome(entry)
            outcomes.append(outcome)
            if state is None or pos in failed:
                continue
            for port, value in state.outputs.items():
                if kinds.get(port) == "audio":
                    outcome.audio = value
                    outcome.sample_rate = state.details[port.split(":")[0]].get("sample_rate")
                elif kinds.get(port) == "codec":
                    outcome.codes = value
        return outcomes


# edgeomni's stage finish reasons in llm_inference's words
FINISH_REASONS = {"eos": "end-of-sequence", "stop": "stop-words", "length": "max-length"}


def prediction_entry(
    pos: int,
    item: Request | BadRequest,
    state: RequestState | None,
    text: str | None,
    error: str | None,
) -> dict[str, Any]:
    """One predictions.json entry in llm_inference's fields (a failed request's error is its
    ``output_text`` with finish_reason ``error``, ``cancelled`` when interrupted), with
    edgeomni's ``ok``, ``error`` and per-stage ``stages`` beside them."""
    if error is not None:
        finish = "cancelled" if error == INTERRUPTED else "error"
    else:
        reasons = [state.details.get(sid, {}).get("finish_reason") for sid in state.plan.stages]
        finish = next((FINISH_REASONS.get(r, r) for r in reasons if r), "end-of-sequence")
    entry: dict[str, Any] = {
        "request_idx": pos,
        "batch_idx": state.batch_idx if state is not None else None,
        "output_text": error if error is not None else (text if text is not None else ""),
        "finish_reason": finish,
        "messages": echo_messages(item.messages),
        "formatted_system_prompt": "",
        "formatted_complete_request": "",
    }
    if state is not None:
        entry.update(state.entry if error is None else {
            k: v for k, v in state.entry.items() if k.startswith("formatted_")
        })  # fmt: skip
    entry.update(item.carry)
    entry.update(ok=error is None, error=error, stages=state.details if state else {})
    return entry


def echo_messages(messages: Any) -> list[Any]:
    """The request's messages as llm_inference echoes them: every content a list of parts."""
    if not isinstance(messages, (list, tuple)):
        return []
    out = []
    for m in messages:
        if isinstance(m, dict) or hasattr(m, "items"):
            m = dict(m)
            if isinstance(m.get("content"), str):
                m["content"] = [{"type": "text", "text": m["content"]}]
            elif isinstance(m.get("content"), (list, tuple)):
                m["content"] = [dict(p) if hasattr(p, "items") else p for p in m["content"]]
        out.append(m)
    return out
