"""Stateful streaming vocoding: each request's code2wav state carried from one call to the next,
so every frame is decoded once (the windows decode each window again with its left context).

The step engine (its folder's config.json: ``state``, ``delay_samples``, ``max_chunk_frames``;
the export's code2wav_stream module makes it) takes a chunk of new codes [B, Q, n] with each
row's valid frames (``chunk_lens``) and one input per declared state tensor (graph_schema.state,
kind opaque); it returns the chunk's samples [B, 1, n*S] and the new state. A request's state is
a row of the row state allocator (runtime/row_state.py: a RowPool in the engine's buffers),
zeroed when the stream takes it; rows stepping together are one call, reading their rows where
they are when they are one run, and the new state is copied over the rows after the call (on
a GPU the call's buffers are kept per batch size and length, so no call allocates device
memory). A stream drops its first ``delay_samples`` (not
audio: Qwen3-Omni's decoder blocks trim them off the front of the whole decode); after them its
samples are the whole-utterance decode's.

Chunks: the first has ``first_chunk_frames`` (1 or 2: the first audio one or two frames after
the talker's first), the next ones double up to ``chunk_frames`` (so a player that started on
the first chunk does not wait for a long second one when frames come at least twice as fast as
real time), and the last holds what is left when the talker is done. Codes put in front of a
request's (Qwen3-TTS's reference codes) go first, in chunks of up to ``max_chunk_frames``.

On a thread of its own (``StreamBatch(beside=True)``, edge-infer --vocoder-threads), the calls
run on one worker thread, in the order they were made, while the loop's thread goes on with the
decoders: chunks are cut and their audio taken in on the loop's thread (``collect``), so a
request's stream is only ever touched there; a call holds the engine's lock, so the state pool
never grows under it and a released row is never a call's.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime import memory
from edgeomni.runtime.artifacts import Artifact, ArtifactError
from edgeomni.runtime.engine import Engines
from edgeomni.runtime.row_state import RowPool, check_engine, declared

CODES, LENS, OUTPUT = "codes", "chunk_lens", "waveform"
# later chunks of a vocoder on a thread of its own: what is left when the talker ends is vocoded
# after it, on that thread's cores; its first chunk is one frame: a call on its own threads takes
# longer, and its audio is taken in after the decoders' next step (with the build's 2 and 25,
# the beside run gained nothing and its first audio came later: docs/benchmarks.md, "the
# pipeline with the vocoder on a thread of its own")
BESIDE_CHUNK_FRAMES = 8
STREAM_ARTIFACT = Artifact(
    keys=("num_quantizers", "codebook_size", "samples_per_frame", "sample_rate", "state",
          "delay_samples", "max_chunk_frames", "first_chunk_frames", "chunk_frames"),
)  # fmt: skip


@dataclass(frozen=True)
class Chunks:
    """Frames per call: the first chunk, the size later chunks double up to, the engine's most."""

    first: int
    size: int
    most: int

    @classmethod
    def read(cls, stage: Any, cfg: Mapping[str, Any]) -> Chunks:
        """The step engine's defaults, overridden by the stage config; a ValueError naming the
        stage and key for sizes the engine cannot take."""
        opts, most = stage.config, int(cfg["max_chunk_frames"])
        first = int(opts.get("first_chunk_frames", cfg["first_chunk_frames"]))
        size = int(opts.get("chunk_frames", cfg["chunk_frames"]))
        if opts.get("own_thread"):  # unless the stage config says: see BESIDE_CHUNK_FRAMES
            if "chunk_frames" not in opts:
                size = min(size, BESIDE_CHUNK_FRAMES, most)
            if "first_chunk_frames" not in opts:
                first = 1
        for key, value in (("first_chunk_frames", first), ("chunk_frames", size)):
            if not 1 <= value <= most:
                raise ValueError(
                    f"{stage.id}: {key} {value} must be 1..{most} (the step engine's "
                    "max_chunk_frames)"
                )
        return cls(first, max(size, first), most)

    def of(self, index: int) -> int:
        """Frames of chunk ``index`` (0: the first)."""
        return self.first if index == 0 else min(self.size, self.first << min(index, 30))

    def sizes(self) -> list[int]:
        """Every chunk size but a last partial one, smallest first."""
        out, index = [], 0
        while not out or out[-1] < self.size:
            out.append(self.of(index))
            index += 1
        return out


class StepEngine:
    """The step engine and the rows of its declared state (row_state.RowPool): a row for a new
    request, one call for a batch of rows."""

    def __init__(self, folder: Path, cfg: Mapping[str, Any], engines: Engines) -> None:
        path = folder / "config.json"
        tensors = declared(cfg, path)
        if any(t.kind != "opaque" for t in tensors):
            raise ArtifactError(path, "a vocoder's state is opaque: every row read and returned "
                                "whole")  # fmt: skip
        self.engine = engines.open(folder, cfg)
        missing = [n for n in (CODES, LENS) if n not in self.engine.input_names]
        if missing:
            raise ArtifactError(path, f"the step engine has no inputs {missing}")
        check_engine(tensors, self.engine, path)
        self.tensors = tensors
        self.pool = RowPool(tensors, self.engine.buffers)
        self.samples_per_frame = int(cfg["samples_per_frame"])
        self.delay = int(cfg["delay_samples"])
        self.max_chunk = int(cfg["max_chunk_frames"])
        # rows a call (0: no cap): its attention has past context and more than one token
        self.max_rows = int(getattr(self.engine, "rows_with_past", 0))
        self.quantizers = int(cfg["num_quantizers"])
        self.calls = 0
        self._slots: dict[tuple[int, int], _StepSlot] = {}  # a GPU's, per batch size and length
        # held by a call: a call on a worker thread (StreamBatch's beside) never sees the pool
        # grow (which moves every row) or another call on the same buffers
        self.lock = threading.Lock()

    def fresh(self) -> int:
        """A new request's row: zeros (a free row is no call's: taking one needs no lock
        unless the pool must grow)."""
        if self.pool.free:
            return self.pool.take()
        with self.lock:
            return self.pool.take()

    def release(self, row: int) -> None:
        self.pool.release(row)

    def snapshot(self, row: int) -> dict[str, Any]:
        """A copy of a row's state (under the lock: no call writes it and the pool does not
        grow meanwhile)."""
        with self.lock:
            return self.pool.state.snapshot(row)

    def restore(self, row: int, saved: Mapping[str, Any]) -> None:
        """A snapshot into a row (one no call holds yet)."""
        with self.lock:
            self.pool.state.restore(row, saved)

    def run(self, codes: np.ndarray, lens: np.ndarray, rows: Sequence[int]) -> np.ndarray:
        """One call: codes int64 [B, Q, n] (rows right-padded), each row's valid frames, each
        row's state row -> samples float32 [B, n*S]; each row's state advanced in place. The
        engine reads the rows where they are when they are one run (else gathered) and writes
        the new state beside them, copied over the rows after the call (an opaque state's
        outputs are not written over its inputs: the graph may read an input after writing
        another's output)."""
        b, _, n = codes.shape
        if n > self.max_chunk:
            raise ValueError(
                f"a chunk of {n} frames is more than the step engine's max_chunk_frames "
                f"{self.max_chunk} (its build limit)"
            )
        with self.lock:
            self.calls += 1
            if not self.engine.buffers.on_host:
                return self._run_fixed(codes, lens, rows)
            return self._run_host(codes, lens, rows)

    def _run_host(self, codes: np.ndarray, lens: np.ndarray, rows: Sequence[int]) -> np.ndarray:
        b, _, n = codes.shape
        memory, state = self.engine.buffers, self.pool.state
        binding = self.engine.binding()
        outs = []
        for t in self.tensors:
            binding.bind_input(t.input, state.gather(t.name, rows))
            out = memory.zeros((b, *t.row_shape()), np.dtype(t.dtype))
            binding.bind_output(t.output, out)
            outs.append(out)
        wave = memory.zeros((b, 1, n * self.samples_per_frame), np.float32)
        binding.bind_output(OUTPUT, wave)
        feeds = {CODES: np.ascontiguousarray(codes, np.int64), LENS: lens.astype(np.int64)}
        binding.run(feeds)
        for t, out in zip(self.tensors, outs, strict=True):
            state.scatter(t.name, rows, out)
        return memory.download(wave)[:, 0]

    def _run_fixed(self, codes: np.ndarray, lens: np.ndarray, rows: Sequence[int]) -> np.ndarray:
        """``run`` on a GPU: the call's buffers kept per batch size and chunk length (no
        allocation a call: cudaFree waits for the device) and the call replayed from a CUDA
        graph where the engine captures one; the rows' states copied in on the device, and
        their new states copied back over the rows."""
        b, _, n = codes.shape
        memory, state = self.engine.buffers, self.pool.state
        slot = self._slots.get((b, n))
        if slot is None:
            slot = self._slots[(b, n)] = _StepSlot.new(self, b, n)
        for t, state_in in zip(self.tensors, slot.states_in, strict=True):
            memory.copy_into(state_in, state.gather(t.name, rows))
        memory.upload(slot.codes, np.ascontiguousarray(codes, np.int64))
        memory.upload(slot.lens, lens.astype(np.int64))
        slot.binding.run({}, graph=slot.graph)
        for t, state_out in zip(self.tensors, slot.states_out, strict=True):
            state.scatter(t.name, rows, state_out)
        return memory.download(slot.wave)[:, 0]  # waits for the call and the copies


@dataclass
class _StepSlot:
    """A step call's buffers at fixed addresses (what a captured graph replays against)."""

    binding: Any
    codes: Any
    lens: Any
    wave: Any
    states_in: list[Any]
    states_out: list[Any]
    graph: int | None

    @classmethod
    def new(cls, step: StepEngine, b: int, n: int) -> _StepSlot:
        memory, engine = step.engine.buffers, step.engine
        binding = engine.binding()
        codes = memory.zeros((b, step.quantizers, n), np.int64)
        lens = memory.zeros((b,), np.int64)
        wave = memory.zeros((b, 1, n * step.samples_per_frame), np.float32)
        binding.bind_input(CODES, codes)
        binding.bind_input(LENS, lens)
        binding.bind_output(OUTPUT, wave)
        states_in, states_out = [], []
        for t in step.tensors:
            for names, made in ((t.input, states_in), (t.output, states_out)):
                made.append(memory.zeros((b, *t.row_shape()), np.dtype(t.dtype)))
                (binding.bind_input if made is states_in else binding.bind_output)(names, made[-1])
        return cls(binding, codes, lens, wave, states_in, states_out, engine.new_graph_id())


def padded_length(n: int, lengths: Sequence[int]) -> int | None:
    """The fixed length a window (a chunk) of n frames runs at: the shortest of ``lengths`` that holds it,
    if that is at most twice the work; None: run it at its own length."""
    return next((length for length in sorted(lengths) if n <= length <= 2 * n), None)


class ChunkStream:
    """One request's stateful stream while its frames arrive: its state, the frames not yet
    vocoded, the audio made (pieces, timing, first-audio time)."""

    def __init__(self, step: StepEngine, chunks: Chunks, batch: StreamBatch) -> None:
        self.step = step
        self.chunks = chunks
        self.batch = batch
        batch.streams.append(self)
        self.row: int | None = step.fresh()  # its state's row (None once released)
        self._views: tuple[int, list[Any]] | None = None  # the pool's generation, the views
        self._codes: list[np.ndarray] = []  # frames not yet vocoded, in order
        self.waiting = 0  # their count
        self.primed = 0  # frames put in front still to vocode (prompt codes)
        self.index = 0  # the request's own chunks vocoded
        self.closing = False  # no more frames will come: the rest is one last chunk
        self.skip = step.delay  # samples still to cut from the front
        self.frames = 0  # the request's own frames received
        self.calls = 0  # engine calls its chunks took part in
        self.in_flight = 0  # its chunks in calls on the batch's worker thread, not yet taken in
        self.pieces: list[np.ndarray] = []
        self.seconds = 0.0
        self.first_audio: float | None = None
        self.arrivals: list[tuple[float, int]] = []  # (perf_counter, samples) per audio piece
        # given the state once the primed codes are vocoded (the context cache's publish)
        self.publish: Callable[[dict[str, Any]], None] | None = None
        self.resumed = False  # its primed codes' state came from the context cache

    def resume(self, saved: Mapping[str, Any]) -> None:
        """Start from the state a stream had once its primed codes were vocoded (the context
        cache's): as ``prime`` then their chunks, their samples cut, without the calls."""
        assert self.row is not None
        self.step.restore(self.row, saved)
        self.resumed = True

    def prime(self, codes: np.ndarray, samples: int) -> None:
        """Codes vocoded in front of the request's (not counted in ``frames``), their
        ``samples`` cut off the audio."""
        codes = np.asarray(codes, np.int64)
        if len(codes):
            self._codes.append(codes)
            self.waiting += len(codes)
            self.primed += len(codes)
            self.skip += samples
            self.batch.fresh = True

    def __call__(self, frames: np.ndarray) -> None:
        frames = np.asarray(frames, np.int64)
        if frames.ndim == 1:
            frames = frames[None, :]
        self.frames += len(frames)
        if len(frames):
            self._codes.append(frames)
            self.waiting += len(frames)
            self.batch.fresh = True

    def ready(self) -> int:
        """Frames of the next chunk if it can be vocoded now, else 0."""
        if self.primed:
            return min(self.primed, self.chunks.most)
        size = self.chunks.of(self.index)
        if self.waiting >= size:
            return size
        return self.waiting if self.closing else 0

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` waiting frames [n, Q]."""
        codes = np.concatenate(self._codes) if len(self._codes) > 1 else self._codes[0]
        out, rest = codes[:n], codes[n:]
        self._codes = [rest] if len(rest) else []
        self.waiting -= n
        if self.primed:
            self.primed -= n
        else:
            self.index += 1
        return out

    @property
    def state(self) -> list[Any]:
        """Its state: its row of every declared tensor (views of the pool's buffers)."""
        if self.row is None:
            raise ValueError("the stream's state was released")
        pool = self.step.pool
        if self._views is None or self._views[0] != pool.generation:
            self._views = (pool.generation, pool.views(self.row))
        return self._views[1]

    @property
    def busy(self) -> bool:
        """Audio still to come that the stage must wait for: chunks in calls on the worker
        thread, or, once no more frames come, frames not yet sent to one."""
        return self.in_flight > 0 or (self.closing and self.waiting > 0)

    def release(self) -> None:
        """Its row back to the pool (once the stream is done or given up; a call on the worker
        thread still writing the row is waited for first)."""
        while self.in_flight:  # each turn takes one call in; one that failed fails elsewhere
            with contextlib.suppress(Exception):
                self.batch.collect(until=self)
        if self.row is not None:
            self.step.release(self.row)
            self.row, self._views = None, None

    def accept(self, samples: np.ndarray, seconds: float) -> None:
        """A chunk's samples (its state advanced in its row)."""
        self.calls += 1
        self.seconds += seconds
        if self.skip:
            cut = min(self.skip, samples.size)
            samples, self.skip = samples[cut:], self.skip - cut
        if samples.size:
            self.pieces.append(np.ascontiguousarray(samples, np.float32))
            now = time.perf_counter()
            self.arrivals.append((now, int(samples.size)))
            if self.first_audio is None:
                self.first_audio = now

    def close(self) -> None:
        """No more frames will come: what is left is its last chunk, which the batch's next
        ``decode_ready`` vocodes with the other requests' ready chunks (requests the talker
        finishes on one step share that call)."""
        self.closing = True
        self.batch.fresh = True

    def finish(self) -> np.ndarray:
        """Once the request's frames are all in: the rest vocoded, all its audio."""
        self.close()
        self.batch.decode_ready()
        if self.in_flight:
            self.batch.collect(until=self)
        if self.first_audio is None:
            self.first_audio = time.perf_counter()
        if not self.pieces:  # no frames: the talker ended speech at its first code
            return np.zeros(0, np.float32)
        return np.concatenate(self.pieces)


class Beside:
    """A stage's calls on a worker thread of their own (the stage config's ``own_thread``), in
    the order they were made: each call's part (its streams, which count their calls in
    flight, each with what the call does for it) and its future; ``collect`` hands each ended
    call's result to ``take`` in that order. A call holds ``memory.GRAPH_LOCK`` (never beside a
    CUDA graph capture on the loop's thread), and ``wakes`` are set each time one ends (what a
    loop with nothing else to do waits on)."""

    def __init__(self) -> None:
        self.worker = ThreadPoolExecutor(1, "edgeomni-vocoder")
        self.wakes: list[threading.Event] = []
        self._calls: deque[tuple[list[tuple[Any, Any]], Future]] = deque()

    @property
    def pending(self) -> int:
        """Calls sent and not yet taken in."""
        return len(self._calls)

    def submit(self, part: list[tuple[Any, Any]], call: Callable[..., Any], *args: Any) -> None:
        for stream, _ in part:
            stream.in_flight += 1
        self._calls.append((part, self.worker.submit(self._run, call, *args)))

    def _run(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            with memory.GRAPH_LOCK:
                return call(*args)
        finally:
            for wake in tuple(self.wakes):  # the loop's thread may add or take one meanwhile
                wake.set()

    def collect(self, take: Callable[[list[tuple[Any, Any]], Any], None], *, wait: bool = True,
                until: Any = None) -> bool:  # fmt: skip
        """The calls that ended taken in, in the order they were made; ``wait``: wait for
        every call (``until``: for the last one that holds that stream's part). Whether any
        was; a call that failed raises here."""
        took = False
        while self._calls and (until is None or until.in_flight):
            part, future = self._calls[0]
            if not wait and not future.done():
                break
            self._calls.popleft()
            for stream, _ in part:
                stream.in_flight -= 1
            take(part, future.result())
            took = True
        return took


class BesideBatch:
    """A batch of streams whose calls may run beside the loop (``beside``: a Beside, or None:
    in the loop's thread); ``_took`` takes one ended call's result in (StreamBatch,
    code2wav_windows.WindowBatch)."""

    beside: Beside | None

    def _took(self, part: Any, result: Any) -> None:
        raise NotImplementedError

    def collect(self, *, wait: bool = True, until: Any = None) -> bool:
        """The audio of the worker's calls that ended, taken in by their streams in the order
        the calls were made; ``wait``: wait for every call (``until``: for the last one that
        holds that stream's work). Whether any was taken in; a call that failed raises here."""
        if self.beside is None:
            return False
        return self.beside.collect(self._took, wait=wait, until=until)


class StreamBatch(BesideBatch):
    """The streams of the requests in a stage: their ready chunks vocoded together, rows of
    equal chunk length in one call (a call's cost is its rows times its longest chunk on a CPU;
    where the engine prefers fixed shapes, a chunk is padded to the chunk size that holds it).
    ``beside``: the calls run on a worker thread of their own (the module's docstring,
    ``Beside``)."""

    def __init__(
        self, step: StepEngine, *, max_rows: int = 0, fixed: Sequence[int] = (),
        beside: bool = False,
    ) -> None:  # fmt: skip
        self.step = step
        caps = [c for c in (max_rows, step.max_rows) if c]
        self.max_rows = min(caps) if caps else 0  # rows per call (0: no cap)
        self.fixed = tuple(sorted(fixed))
        self.streams: list[ChunkStream] = []
        self.fresh = False  # frames came since the last look
        self.beside = Beside() if beside else None

    def decode_ready(self) -> bool:
        """The ready chunks vocoded (on the worker: sent to it, and the audio of calls that
        ended taken in); whether anything was."""
        took = self.collect(wait=False)
        if not self.fresh:
            return took
        self.fresh = False
        while True:
            groups: dict[int, list[tuple[ChunkStream, int]]] = {}
            for stream in self.streams:
                n = stream.ready()
                if n:
                    length = padded_length(n, self.fixed) or n
                    groups.setdefault(length, []).append((stream, n))
            if not groups:
                return took
            for length, group in sorted(groups.items()):
                size = self.max_rows or len(group)
                for lo in range(0, len(group), size):
                    self._call(length, group[lo : lo + size])
            took = True

    def _took(self, part: list[tuple[ChunkStream, int]], result: tuple) -> None:
        samples, seconds, states = result
        self._published(states)
        self._accept(part, samples, seconds)

    def _call(self, length: int, part: list[tuple[ChunkStream, int]]) -> None:
        start = time.perf_counter()
        priming = [stream.primed > 0 and stream.publish is not None for stream, _ in part]
        chunks = [stream.take(n) for stream, n in part]
        # the streams whose primed codes end with this call: their state is kept after it
        ends = [stream for (stream, _), p in zip(part, priming, strict=True)
                if p and not stream.primed]  # fmt: skip
        codes = np.zeros((len(part), chunks[0].shape[1], length), np.int64)
        for row, chunk in enumerate(chunks):
            codes[row, :, : len(chunk)] = chunk.T
        lens = np.array([n for _, n in part], np.int64)
        rows = []
        for stream, _ in part:
            assert stream.row is not None, "a released stream has no chunk to vocode"
            rows.append(stream.row)
        if self.beside is None:
            samples = self.step.run(codes, lens, rows)
            self._published(self._states(ends))
            self._accept(part, samples, time.perf_counter() - start)
            return
        self.beside.submit(part, self._run, codes, lens, rows, ends)

    def _states(self, ends: list[ChunkStream]) -> list[tuple[ChunkStream, dict[str, Any]]]:
        """The states of streams whose primed codes were just vocoded (taken before any later
        call on their rows: on the calls' own thread, in order)."""
        return [(s, self.step.snapshot(s.row)) for s in ends if s.row is not None]

    @staticmethod
    def _published(states: list[tuple[ChunkStream, dict[str, Any]]]) -> None:
        for stream, saved in states:
            if stream.publish is not None:
                stream.publish(saved)
                stream.publish = None

    def _run(self, codes: np.ndarray, lens: np.ndarray, rows: list[int], ends: list[ChunkStream]
             ) -> tuple[np.ndarray, float, list[tuple[ChunkStream, dict[str, Any]]]]:  # fmt: skip
        """A call on the worker thread: its samples and seconds, the states its primed streams
        reached."""
        start = time.perf_counter()
        samples = self.step.run(codes, lens, rows)
        return samples, time.perf_counter() - start, self._states(ends)

    def _accept(self, part: list[tuple[ChunkStream, int]], samples: np.ndarray,
                seconds: float) -> None:  # fmt: skip
        share, spf = seconds / len(part), self.step.samples_per_frame
        for row, (stream, n) in enumerate(part):
            stream.accept(samples[row, : n * spf], share)
