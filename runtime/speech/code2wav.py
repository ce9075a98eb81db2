"""The vocoder stage (Qwen3-Omni's and Qwen3-TTS's code2wav): codec frames in, 24 kHz audio out.

Three modes (the stage config's ``streaming`` and ``whole_utterance``, or the runner options
of the same names, which win):

- ``stateful`` (what a build with the step engine writes in its graph): each request's frames
  are vocoded once, in chunks, with the state the step engine carries from one call to the next
  (runtime/speech/code2wav_stream.py); the chunks of the requests stepping together that are
  ready on one step share calls. Only the step engine is loaded.
- ``windows`` (a graph without ``streaming``): gap-free windows with left context
  (runtime.vocoder), the windows of the requests stepping together that complete on the same
  frame in one call.
- whole utterances (``whole_utterance``): once a request's codes are complete, when the
  utterance fits the engine's ``max_frames``: the requests whose codes are complete together (a
  cohort's, or those the talker finished on one step) then share calls, each padded to the
  longest of its call.

The stage config's ``own_thread`` (edge-infer --vocoder-threads) runs the calls, stateful or
windows, on a worker thread beside the loop (StreamBatch's and WindowBatch's ``beside``), and a
GPU engine on a CUDA stream of its own (the pipeline opens it on lane ``memory.BESIDE``): the
decoders make the next frames while the vocoder makes audio of the last ones, their kernels
side by side. The stage then ``polls``: a step sends the ready chunks (windows) and takes in the
audio of calls that ended, and a request leaves once its last call has ended.

On a GPU, windows run at a few fixed lengths (the first window's, and a full window with its
left context), with CUDA graphs each captured once per batch size and replayed. Each convolution
of the CUDA provider sets itself up again (~1 ms of host time) whenever its input shape differs
from its last call's: on the H200, code2wav calls that alternated lengths took ~50 ms against
~13 ms at one length (9 ms of kernels). A shorter window is padded on the right with code 0; the
vocoder is causal, so its first n*S - trim samples do not depend on the padding.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime.artifacts import Artifact, ArtifactError, Checked, check_folder
from edgeomni.runtime.context_cache import CachePart, ContextCache, build_identity, digest
from edgeomni.runtime.engine import CAPTURE_RUNS, DEFAULT_ENGINES, Engines
from edgeomni.runtime.events import AudioChunk, CodecFrames, Event, Finished
from edgeomni.runtime.speech.code2wav_stream import (
    STREAM_ARTIFACT,
    Chunks,
    ChunkStream,
    StepEngine,
    StreamBatch,
    padded_length,
)
from edgeomni.runtime.speech.code2wav_windows import AudioStream, WindowBatch
from edgeomni.runtime.stage import RequestError, RequestState, StageRunner, stage_source
from edgeomni.runtime.vocoder import WindowedVocoder, playback_stall_s

CODES_INPUT = "codes"
PROMPT_INPUT = "prompt_codes"
AUDIO_PORT = "audio"
STREAMING = ("stateful", "windows")  # the stage config's ``streaming`` (absent: windows)


ARTIFACT = Artifact(
    keys=("num_quantizers", "codebook_size", "samples_per_frame", "trim", "sample_rate",
          "max_frames", "window_frames", "left_context_frames"),
)  # fmt: skip


@dataclass(frozen=True)
class Windows:
    """How the stage vocodes: its window, left context and first window (frames), windows per
    call (0: a cohort's all; activations grow with it), and whether whole utterances at once."""

    window: int
    left_context: int
    first_window: int
    batch_windows: int
    whole: bool

    @classmethod
    def read(cls, stage: Any, cfg: dict[str, Any]) -> Windows:
        """The build's defaults, overridden by the graph's stage config; a ValueError naming
        the stage for settings the engine cannot run."""
        opts = stage.config
        window = int(opts.get("window_frames", cfg["window_frames"]))
        first = int(opts.get("first_window_frames", window))  # shorter: first audio sooner
        out = cls(
            window=window,
            left_context=int(opts.get("left_context_frames", cfg["left_context_frames"])),
            first_window=first,
            batch_windows=int(opts.get("max_windows_per_call", 0)),
            whole=bool(opts.get("whole_utterance", False)),
        )
        if out.batch_windows < 0:
            raise ValueError(f"{stage.id}: max_windows_per_call must be >= 0 (0: no cap)")
        if max(window, first) + out.left_context > int(cfg["max_frames"]):
            raise ValueError(
                f"{stage.id}: window {max(window, first)} + left context {out.left_context} "
                f"frames exceed the engine's max_frames {cfg['max_frames']}"
            )
        try:  # the vocoder's own checks (window sizes, context against the trim)
            out.vocoder(lambda codes: codes, cfg)
        except ValueError as e:
            raise ValueError(f"{stage.id}: {e}") from None
        return out

    def vocoder(
        self, decode: Callable[[np.ndarray], np.ndarray], cfg: Mapping[str, Any]
    ) -> WindowedVocoder:
        """A fresh windowed vocoder over ``decode`` (one call: codes [1, Q, n] -> samples)."""
        return WindowedVocoder(
            decode, window=self.window, left_context=self.left_context,
            samples_per_frame=int(cfg["samples_per_frame"]), trim=int(cfg["trim"]),
            first_window=self.first_window,
        )  # fmt: skip


def streaming_of(stage: Any, override: str | None = None) -> str:
    """The streaming mode: ``override`` (a runner option) or the stage config's ``streaming``
    (absent: windows, what a graph without the step engine streams with)."""
    value = override if override is not None else stage.config.get("streaming", "windows")
    if value not in STREAMING:
        raise ValueError(f"{stage.id}: streaming {value!r}: choose {' or '.join(STREAMING)}")
    return str(value)


def stream_folder(stage: Any, folder: Path) -> Path:
    """The step engine's folder: the stage config's ``stream``, relative to the stage's."""
    where = stage.config.get("stream")
    if not where:
        raise ValueError(
            f"{stage.id}: streaming stateful needs the stateful step engine, which this graph "
            "does not name (its config's stream): build it with edge-build "
            "--code2wav-streaming stateful, or stream in windows"
        )
    return (folder / str(where)).resolve()


def check_stream(stage: Any, where: Path, cfg: Mapping[str, Any]) -> Checked:
    """The step engine's folder, and that it vocodes what this stage's engine does."""
    checked = check_folder(where, STREAM_ARTIFACT)
    for key in ("num_quantizers", "codebook_size", "samples_per_frame", "sample_rate"):
        if checked.config[key] != cfg[key]:
            raise ArtifactError(
                where / "config.json",
                f"{key} {checked.config[key]} is not the {stage.id} engine's {cfg[key]}",
            )
    return checked


def _checked(stage: Any, folder: Path, stateful: bool) -> tuple[Checked, Checked | None]:
    """The stage's folder (its codes input, windows that fit its engine) and, when it streams
    stateful, the step engine's folder (chunks that fit it)."""
    stage_source(stage, CODES_INPUT)
    checked = check_folder(folder, ARTIFACT)
    Windows.read(stage, checked.config)
    if stage.config.get("own_thread") and stage.config.get("whole_utterance", False):
        raise ValueError(
            f"{stage.id}: vocoding on a thread of its own (--vocoder-threads) needs streaming "
            "(stateful or windows), not whole utterances"
        )
    if not stateful:
        return checked, None
    stream = check_stream(stage, stream_folder(stage, folder), checked.config)
    Chunks.read(stage, stream.config)
    return checked, stream


class Code2Wav(StageRunner):
    """Vocode each request's codes [frames, Q] (int64) into float32 samples."""

    kind = "iterative"

    def __init__(
        self,
        stage: Any,
        folder: Path,
        *,
        engines: Engines = DEFAULT_ENGINES,
        whole_utterance: bool | None = None,
        streaming: str | None = None,
    ) -> None:
        """``engines``: how its engine opens (its ``spin`` False when other stages' engines run
        between this one's calls). ``whole_utterance``, ``streaming``: the mode, over the stage
        config's. Only the engine the mode runs is loaded (the step engine when stateful, the
        codes -> waveform one otherwise)."""
        self.stage = stage
        self.streaming = streaming_of(stage, streaming)
        # an explicit runner option wins over the stage config
        whole = bool(stage.config.get("whole_utterance", False))
        self.whole = whole if whole_utterance is None else bool(whole_utterance)
        checked, stream = _checked(stage, folder, self.streaming == "stateful" and not self.whole)
        self.config = cfg = checked.config
        self.folder, self._engines, self._engine = folder, engines, None
        self.num_quantizers = int(cfg["num_quantizers"])
        self.codebook_size = int(cfg["codebook_size"])
        self.samples_per_frame = int(cfg["samples_per_frame"])
        self.trim = int(cfg["trim"])
        self.sample_rate = int(cfg["sample_rate"])
        self.max_frames = int(cfg["max_frames"])
        self.windows = Windows.read(stage, cfg)
        self.step: StepEngine | None = None
        self.chunks: Chunks | None = None
        if stream is not None:
            self.chunks = Chunks.read(stage, stream.config)
            self.step = StepEngine(stream.folder, stream.config, engines)
        self._fixed_lengths: tuple[int, ...] | None = None
        self._fixed: dict[tuple[int, int], _Fixed] = {}
        # a call's fixed buffers are the engine's, one call at a time: the loop's thread and a
        # worker's (WindowBatch's beside) may both call
        self._lock = threading.Lock()
        self.beside = bool(stage.config.get("own_thread", False))  # calls on a worker thread
        self.source = stage_source(stage, CODES_INPUT)
        # codes vocoded in front of the request's and cut off again (Qwen3-TTS's in-context
        # clone: upstream decodes the reference codes with the new ones); None: no such input
        self.prompt_source = next((i.source for i in stage.inputs if i.name == PROMPT_INPUT), None)
        self.cache: CachePart | None = None  # use_context_cache's: primed states by prompt

    def use_context_cache(self, cache: ContextCache) -> None:
        """Keep the stateful stream's state after a request's prompt codes (a clone's
        reference, vocoded in front and cut off), so a prompt seen before is not vocoded again."""
        if self.prompt_source is not None:
            self.cache = cache.part(self.stage.id, build_identity(self.folder, self.config))

    @property
    def mode(self) -> str:
        """How it vocodes: whole, stateful or windows."""
        return "whole" if self.whole else self.streaming

    @property
    def engine(self) -> Any:
        """The codes -> waveform engine (windows, whole utterances), opened on first use."""
        if self._engine is None:
            self._engine = self._engines.open(self.folder, self.config)
        return self._engine

    @property
    def fixed_lengths(self) -> tuple[int, ...]:
        """The lengths windows run at where the engine prefers fixed shapes (a GPU; none: each
        at its own), replayed from CUDA graphs where the engine has them: the first window's,
        the growing ones', a full window with its left context."""
        if self._fixed_lengths is None:
            fixed = self.engine.prefers_fixed_shapes
            self._fixed_lengths = tuple(sorted(self.vocoder().lengths())) if fixed else ()
        return self._fixed_lengths

    @fixed_lengths.setter
    def fixed_lengths(self, lengths: tuple[int, ...]) -> None:
        self._fixed_lengths = tuple(lengths)

    @classmethod
    def check(cls, stage: Any, folder: Path) -> Checked:
        """What opening this stage reads, without loading its engine: the config, the stage's
        codes input, windows that fit the engine, and for the stateful mode the step engine's
        folder and chunks that fit it."""
        opts = stage.config
        stateful = streaming_of(stage) == "stateful" and not opts.get("whole_utterance", False)
        return _checked(stage, folder, stateful)[0]

    # -- engine ------------------------------------------------------------------------------
    def decode(self, codes: np.ndarray) -> np.ndarray:
        """One engine call: codes int64 [1, Q, n] -> samples float32 [n*S - trim]."""
        return self.decode_batch(codes)[0]

    def decode_batch(self, codes: np.ndarray) -> np.ndarray:
        """One engine call for windows of equal length: codes int64 [B, Q, n] -> samples
        float32 [B, n*S - trim]."""
        b, _, n = codes.shape
        length = padded_length(n, self.fixed_lengths)
        if length is not None:
            with self._lock:
                return self._decode_fixed(codes, length)
        out = np.empty((b, 1, n * self.samples_per_frame - self.trim), np.float32)
        binding = self.engine.binding()
        binding.bind_output("waveform", out)
        # every row attends to the window's n frames (what the attention lowering takes, if its
        # graph has such inputs)
        feeds = {"codes": np.ascontiguousarray(codes, np.int64), "past_lens": np.zeros(b, np.int32),
                 "query_lens": np.full(b, n, np.int32)}  # fmt: skip
        binding.run(feeds)
        return out.reshape(b, -1)

    def _decode_fixed(self, codes: np.ndarray, length: int) -> np.ndarray:
        """``codes`` [B, Q, n] padded to ``length`` frames, through the buffers (and CUDA graph)
        kept for that batch size and length."""
        b, q, n = codes.shape
        slot = self._fixed.get((b, length))
        if slot is None:
            slot = self._fixed[(b, length)] = self._new_fixed(b, length)
        padded = np.zeros((b, q, length), np.int64)
        padded[:, :, :n] = codes
        keep = n * self.samples_per_frame - self.trim
        buffers = self.engine.buffers
        buffers.upload(slot.codes, padded)
        # on a thread of its own, a shape's first call runs until its graph is captured (ONNX
        # Runtime captures on a graph id's third run; a window's call gives the same samples
        # each time), so that only that call is waited for (may_capture); in the loop's thread
        # the runs before the capture are simply its first calls
        runs = CAPTURE_RUNS if self.beside and slot.graph is not None and not slot.runs else 1
        for _ in range(runs):
            slot.binding.run({}, graph=slot.graph)
        slot.runs += runs
        return buffers.download(slot.out)[:, 0, :keep]  # waits for the call

    def may_capture(self, shape: tuple[int, ...]) -> bool:
        """Whether a call of codes ``shape`` [B, Q, n] may capture a CUDA graph: the first
        call of its fixed length and batch size on an engine that captures."""
        b, _, n = shape
        length = padded_length(n, self.fixed_lengths)
        if length is None or not self._engines.captures(self.config):
            return False
        slot = self._fixed.get((b, length))
        return slot is None or slot.runs < CAPTURE_RUNS

    def _new_fixed(self, b: int, length: int) -> _Fixed:
        shapes = (
            (b, self.num_quantizers, length),
            (b, 1, length * self.samples_per_frame - self.trim),
        )
        buffers = self.engine.buffers
        codes, out = buffers.zeros(shapes[0], np.int64), buffers.zeros(shapes[1], np.float32)
        binding = self.engine.binding()
        binding.bind_input(CODES_INPUT, codes)
        binding.bind_output("waveform", out)
        # replayed from a captured graph where the engine captures
        return _Fixed(binding, codes, out, self.engine.new_graph_id())

    def vocoder(self) -> WindowedVocoder:
        """A fresh windowed vocoder over this engine (also what a streaming caller pushes into)."""
        return self.windows.vocoder(self.decode, self.config)

    # -- per request -------------------------------------------------------------------------
    def codes_of(self, state: RequestState) -> tuple[np.ndarray, int]:
        """The request's codes with its prompt codes (if any) in front, and the prompt's
        frames (vocoded with them, then cut off)."""
        codes, prompt = self._checked(state, self.source), self.prompt_of(state)
        if prompt is None:
            return codes, 0
        return np.concatenate([prompt, codes]), len(prompt)

    def prompt_of(self, state: RequestState) -> np.ndarray | None:
        """The codes vocoded in front of the request's (then cut off), if it has any."""
        if self.prompt_source is None or self.prompt_source not in state.outputs:
            return None
        return self._checked(state, self.prompt_source)

    def _checked(self, state: RequestState, source: str) -> np.ndarray:
        if source not in state.outputs:
            raise RequestError(f"{self.stage.id}: no codes from {source}")
        codes = np.asarray(state.outputs[source])
        if codes.ndim != 2 or codes.shape[1] != self.num_quantizers:
            raise RequestError(
                f"{self.stage.id}: codes must be [frames, {self.num_quantizers}], "
                f"got shape {codes.shape}"
            )
        if not np.issubdtype(codes.dtype, np.integer):
            raise RequestError(f"{self.stage.id}: codes must be integers, got {codes.dtype}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise RequestError(
                f"{self.stage.id}: codes must lie in [0, {self.codebook_size}), "
                f"got [{codes.min()}, {codes.max()}]"
            )
        return codes.astype(np.int64, copy=False)

    def stream_batch(self) -> WindowBatch | StreamBatch:
        """Where the streams of the requests in this stage are vocoded together: their chunks
        with their state (stateful), or their windows."""
        beside = self.beside
        if self.step is None or self.chunks is None:
            return WindowBatch(self, beside=beside)
        fixed = self.chunks.sizes() if self.step.engine.prefers_fixed_shapes else ()
        return StreamBatch(self.step, max_rows=self.windows.batch_windows, fixed=fixed,
                           beside=beside)  # fmt: skip

    def stream_for(
        self, state: RequestState, batch: WindowBatch | StreamBatch
    ) -> AudioStream | ChunkStream:
        """A request's stream (of chunks with its state, or of windows), its prompt codes (if
        any) already in front."""
        if isinstance(batch, StreamBatch):
            assert self.step is not None and self.chunks is not None
            stream: AudioStream | ChunkStream = ChunkStream(self.step, self.chunks, batch)
        else:
            stream = AudioStream(self.vocoder(), batch)
        prompt = self.prompt_of(state)
        if prompt is None:
            return stream
        part = self.cache
        if part is not None and isinstance(stream, ChunkStream):
            key = digest(np.ascontiguousarray(prompt).tobytes(), repr(prompt.shape))
            saved = part.find("primed", key)
            if saved is not None:
                stream.resume(saved)
                return stream

            def publish(state: dict[str, Any]) -> None:
                part.put(state, sum(int(a.nbytes) for a in state.values()), "primed", key)

            stream.publish = publish
        stream.prime(prompt, len(prompt) * self.samples_per_frame)
        return stream

    def vocode(self, codes: np.ndarray) -> tuple[np.ndarray, int, str]:
        """(samples, engine calls, mode): whole utterance when asked for and it fits the engine's
        max_frames, else in chunks with state (stateful) or in windows."""
        if self.step is not None and self.chunks is not None:
            stream = ChunkStream(self.step, self.chunks, StreamBatch(self.step))
            stream(codes)
            audio = stream.finish()
            stream.release()
            return audio, stream.calls, "stateful"
        voc = self.vocoder()
        if self.whole and len(codes) <= self.max_frames:
            return voc.decode_whole(codes), voc.windows, "whole"
        audio = np.concatenate([voc.push(codes), voc.flush()])
        return audio, voc.windows, "windowed" if not self.whole else "windowed (over max_frames)"

    def settings(self) -> dict[str, Any]:
        """What a request's report says of how this stage vocodes."""
        if self.chunks is not None:
            return {"first_chunk_frames": self.chunks.first, "chunk_frames": self.chunks.size}
        return {"window_frames": self.windows.window,
                "first_window_frames": self.windows.first_window,
                "left_context_frames": self.windows.left_context,
                "fixed_lengths": list(self.fixed_lengths)}  # fmt: skip

    def slot_stage(self, *, stream_upstream: bool = False) -> VocoderSlots:
        """This stage for the scheduler loop (windows vocoded as the talker's frames come,
        unless it vocodes whole utterances)."""
        return VocoderSlots(self)

    def vocode_together(self, states: Sequence[RequestState]) -> dict[int, Whole]:
        """Whole utterances of requests whose codes are complete, vocoded in as few engine
        calls as the rows allow (this stage vocodes whole utterances): sorted by length, a
        call takes the requests up to twice the shortest one's frames, each padded on the right
        with code 0 to the longest (the vocoder is causal, so a request's own samples do not
        depend on the padding), at most ``max_windows_per_call`` rows (0: no cap). Requests
        with codes it cannot vocode, or longer than ``max_frames``, are left out
        (``finish_request`` reports or windows them). By request index."""
        if not self.whole:
            return {}
        items: list[tuple[int, np.ndarray, int]] = []  # (index, codes with prompt, prompt len)
        for state in states:
            try:
                full, skip = self.codes_of(state)
            except RequestError:
                continue
            if 0 < len(full) <= self.max_frames:
                items.append((state.index, full, skip))
        items.sort(key=lambda item: len(item[1]))
        out: dict[int, Whole] = {}
        cap = self.windows.batch_windows or len(items)
        while items:
            shortest = len(items[0][1])
            group = [i for i in items[:cap] if len(i[1]) <= 2 * shortest]
            items = items[len(group) :]
            length = len(group[-1][1])
            start = time.perf_counter()
            codes = np.zeros((len(group), self.num_quantizers, length), np.int64)
            for row, (_, full, _) in enumerate(group):
                codes[row, :, : len(full)] = full.T
            samples = self.decode_batch(codes)
            share = (time.perf_counter() - start) / len(group)
            for row, (index, full, prompt) in enumerate(group):
                audio = samples[row, : len(full) * self.samples_per_frame - self.trim]
                audio = audio[prompt * self.samples_per_frame :]  # the prompt's cut off
                out[index] = Whole(np.ascontiguousarray(audio), share, len(group))
        return out

    def finish_request(
        self,
        state: RequestState,
        stream: AudioStream | ChunkStream | None,
        whole: Whole | None = None,
    ) -> np.ndarray:
        """A request's audio once its codes are complete: what ``stream`` vocoded as they came
        and the rest, ``whole`` (its utterance vocoded with others', ``vocode_together``), or
        the whole utterance when nothing streamed; writes its output and report (a
        RequestError for codes this engine cannot vocode)."""
        full, skip = self.codes_of(state)
        codes = full[skip:]
        start = time.perf_counter()
        stall = 0.0  # audio made in one go arrives at once
        rows = 1
        if whole is not None:
            audio, calls, mode, seconds, rows = whole.audio, 1, "whole", whole.seconds, whole.rows
        elif stream is not None and stream.frames == len(codes):
            audio, calls = stream.finish(), stream.calls
            mode = "stateful" if isinstance(stream, ChunkStream) else "streamed"
            seconds = stream.seconds + time.perf_counter() - start
            stall = playback_stall_s(stream.arrivals, self.sample_rate)
        else:  # a prompt's samples cut off the whole decode's front
            audio, calls, mode = self.vocode(full)
            audio = audio[skip * self.samples_per_frame :]
            seconds = time.perf_counter() - start
        state.outputs[f"{self.stage.id}:{AUDIO_PORT}"] = audio
        first = getattr(stream, "first_audio", None) or time.perf_counter()
        state.details[self.stage.id] = {
            "first_audio_ms": round((first - state.started) * 1e3, 3),
            # a player starting at the first audio would then wait this long in all
            "stall_ms": round(stall * 1e3, 3),
            "frames": len(codes),
            "prompt_frames": skip,
            # its prompt's state came from the context cache: those frames were not vocoded
            "prompt_cached": bool(getattr(stream, "resumed", False)),
            "samples": int(audio.size),
            "sample_rate": self.sample_rate,
            "duration_ms": round(audio.size / self.sample_rate * 1e3, 3),
            "vocode_ms": round(seconds * 1e3, 3),
            "windows": calls,
            "mode": mode,
            "call_rows": rows,  # whole: the requests vocoded in its call
            **self.settings(),
        }
        return audio


@dataclass(frozen=True)
class Whole:
    """A request's whole utterance from ``vocode_together``: its samples, its share of the
    call's time, and how many requests the call vocoded."""

    audio: np.ndarray
    seconds: float
    rows: int


@dataclass
class _Fixed:
    """A fixed-length call's bound buffers ([B, Q, L] codes, [B, 1, L*S - trim] samples) and
    its CUDA graph (None: not captured)."""

    binding: Any
    codes: Any
    out: Any
    graph: int | None
    runs: int = 0


# -- the stage ------------------------------------------------------------------------------
# A request joins the moment the talker admits it; its frames arrive as ``CodecFrames`` events
# and each step vocodes the windows that became complete, every request's in one call per shape
# (``WindowBatch``). Once the talker's ``Finished`` comes (or, admitted after its upstream was
# done with it, at once), the rest is flushed and it leaves. Vocoding whole utterances, a
# request joins once its codes are complete, and those that join on one turn share calls.


@dataclass
class VocoderSlot:
    state: RequestState
    row: int
    stream: AudioStream | ChunkStream | None  # None: vocoded whole once its codes are complete
    finish: str | None = None
    audio: np.ndarray | None = None
    whole: Whole | None = None  # its utterance, vocoded with the others admitted with it
    sent: int = 0  # the stream's pieces its events gave
    offset: int = 0  # samples its events gave
    # its codes are all made: at once where no stage is before it, else once its upstream's
    # Finished comes (upstream done with it before it came here: among the events admit takes)
    complete: bool = False


class VocoderSlots:
    consumes = True  # the talker's CodecFrames

    def __init__(self, runner: Any) -> None:
        self.r = runner
        self.stage_id: str = runner.stage.id
        self.batch = runner.stream_batch()
        # calls on a thread of its own: a step that took nothing in lets the loop wait for one
        # to end (it sets every event in ``wakes``: run_graph's idle)
        beside = self.batch.beside
        self.polls = beside is not None
        self.wakes: list[threading.Event] = beside.wakes if beside is not None else []

    def ready(self, state: RequestState, upstream_done: bool, events: Sequence[Event]) -> bool:
        return upstream_done or not self.r.whole

    def admit(
        self, entries: Sequence[tuple[RequestState, int, Sequence[Event]]]
    ) -> list[VocoderSlot]:
        slots = []
        for state, row, _ in entries:
            stream = None if self.r.whole else self.r.stream_for(state, self.batch)
            first = state.plan.stages[0] == self.stage_id
            slots.append(VocoderSlot(state, row, stream, complete=first))
        # vocoding whole utterances, the requests admitted together (a cohort's, which the
        # talker finished on the same step) share engine calls
        together = self.r.vocode_together([s.state for s in slots if s.stream is None])
        for slot, (_, _, events) in zip(slots, entries, strict=True):
            slot.whole = together.get(slot.state.index)
            for event in events:  # what the talker made before it came here
                self.consume(slot, event)
        return slots

    def consume(self, slot: VocoderSlot, event: Event) -> None:
        if isinstance(event, CodecFrames) and slot.stream is not None:
            slot.stream(event.codes)
        elif isinstance(event, Finished):
            slot.complete = True
            if slot.stream is not None:  # its tail goes with the step's other chunks
                slot.stream.close()

    def step(self, slots: Mapping[int, VocoderSlot]) -> bool:
        """The windows completed since the last step, all requests' together; whether it
        vocoded (on its own thread: sent or took in) any."""
        return bool(self.batch.decode_ready())

    def update(self, slot: VocoderSlot, events: bool) -> list[Event]:
        """Once the talker has written the request's codes: the rest of its audio, and it is
        done. When ``events``: the audio made since the last update."""
        state = slot.state
        # on its own thread: calls to wait for (in the loop's, ``finish`` makes the rest now)
        busy = self.polls and slot.stream is not None and slot.stream.busy
        if slot.audio is None and slot.complete and not busy:
            slot.audio = self.r.finish_request(state, slot.stream, slot.whole)
            slot.finish = "complete"
        if not events:
            return []
        pieces: list[np.ndarray] = []
        if slot.finish is not None:
            pieces = [slot.audio[slot.offset :]]
        elif slot.stream is not None:
            pieces = slot.stream.pieces[slot.sent :]
            slot.sent = len(slot.stream.pieces)
        out: list[Event] = []
        for piece in pieces:
            # an utterance of no audio still gives one (empty) chunk: its sample rate
            if piece.size or (slot.finish is not None and not slot.offset):
                out.append(AudioChunk(state.index, self.stage_id, piece, slot.offset,
                                      self.r.sample_rate))  # fmt: skip
                slot.offset += int(piece.size)
        if slot.finish is not None:
            out.append(Finished(state.index, self.stage_id, slot.finish))
        return out

    def move(self, slot: VocoderSlot, row: int) -> None:
        slot.row = row  # it holds no cache

    def retire(self, slot: VocoderSlot) -> None:
        self.discard(slot)

    def discard(self, slot: VocoderSlot) -> None:
        if slot.stream is not None and slot.stream in self.batch.streams:
            self.batch.streams.remove(slot.stream)
        if isinstance(slot.stream, ChunkStream):
            slot.stream.release()  # its state's row, for the next request
