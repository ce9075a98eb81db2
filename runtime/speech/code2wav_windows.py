"""The vocoder stage's windows as the talker's frames arrive (runtime/speech/code2wav.py's
``windows`` streaming, the GPU's): each request's ``AudioStream`` over a ``WindowedVocoder``
(runtime/vocoder.py), and the ``WindowBatch`` that vocodes the windows of the requests in the
stage together, in the loop's thread or, with the stage config's ``own_thread``, on a worker
thread of their own (``Beside``, runtime/speech/code2wav_stream.py)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from edgeomni.runtime.speech.code2wav_stream import Beside, BesideBatch, padded_length
from edgeomni.runtime.vocoder import Window, WindowedVocoder

__all__ = ["AudioStream", "WindowBatch"]


class WindowBatch(BesideBatch):
    """A cohort's streams: their complete windows vocoded together, one call per shape, and the
    last, partial windows of the streams that closed (requests the talker finished on one step)
    with them (each alone, a tail is a call of its own length, not captured: at 32 requests on
    the H100 those calls were most of a run's vocoder launches; docs/benchmarks.md).

    ``beside``: the calls run on a worker thread of their own, in the order they were made,
    while the loop's thread goes on with the decoders (the module's docstring). A window is
    taken from its stream's vocoder when its call is sent and its audio cut when the call is
    taken in (``collect``). The CUDA provider captures a call shape's graph on the thread that
    replays it, in global mode (no other thread may make a CUDA call that could synchronise
    meanwhile): a call that may capture is waited for, and every call holds
    ``memory.GRAPH_LOCK`` (``Beside``), which a capture on the loop's thread holds too."""

    def __init__(self, runner: Any, *, beside: bool = False) -> None:
        """``runner``: the Code2Wav stage runner whose engine the calls run on."""
        self.runner = runner
        self.streams: list[AudioStream] = []
        # frames came since the last look: every stream's end_step calls decode_ready, and a
        # scan of all streams per call was O(rows^2) a frame (1024 checks at 32 rows)
        self.fresh = False
        self.beside = Beside() if beside else None

    def decode_ready(self) -> bool:
        """The complete windows vocoded (beside: sent, with the closed streams' last ones, and
        the audio of calls that ended taken in); whether anything was."""
        took = self.collect(wait=False)
        if not self.fresh:
            return took
        self.fresh = False
        fixed = self.runner.fixed_lengths
        while True:
            # windows that run at one length share calls: on a GPU a fixed length holds windows
            # of several (a shorter one padded on the right with code 0: the vocoder is causal),
            # as the tails of requests finishing together mostly are
            groups: dict[tuple[str, int], list[tuple[AudioStream, Window]]] = {}
            for stream in self.streams:
                window = stream.vocoder.pending()
                if window is None and stream.closing:  # its last, partial window
                    window = stream.vocoder.tail()
                if window is not None:
                    n = len(window.codes)
                    length = padded_length(n, fixed)
                    key = ("fixed", length) if length is not None else ("own", n)
                    groups.setdefault(key, []).append((stream, window))
            if not groups:
                return took
            for group in groups.values():  # a cohort stepping together: one group
                size = self.runner.windows.batch_windows or len(group)
                for lo in range(0, len(group), size):
                    self._call(group[lo : lo + size])
            took = True

    def _call(self, part: list[tuple[AudioStream, Window]]) -> None:
        longest = max(len(w.codes) for _, w in part)
        codes = np.zeros((len(part), part[0][1].codes.shape[1], longest), np.int64)  # [B, Q, n]
        for row, (_, window) in enumerate(part):
            codes[row, :, : len(window.codes)] = window.codes.T
        if self.beside is None:
            start = time.perf_counter()
            samples = self.runner.decode_batch(codes)
            share = (time.perf_counter() - start) / len(part)
            for (stream, window), row in zip(part, samples, strict=True):
                stream.take(stream.vocoder.accept(window, self._own(window, row)), share)
            return
        for stream, window in part:
            stream.vocoder.take(window)
        capture = self.runner.may_capture(codes.shape)
        self.beside.submit(part, self._run, codes)
        if capture:  # the loop's thread makes no CUDA call while the worker captures
            self.collect()

    def _run(self, codes: np.ndarray) -> tuple[np.ndarray, float]:
        """A call on the worker thread: its samples and seconds."""
        start = time.perf_counter()
        samples = self.runner.decode_batch(codes)
        return samples, time.perf_counter() - start

    def _took(self, part: list[tuple[AudioStream, Window]], result: tuple[np.ndarray, float]
              ) -> None:  # fmt: skip
        samples, seconds = result
        share = seconds / len(part)
        for (stream, window), row in zip(part, samples, strict=True):
            stream.take(stream.vocoder.cut(window, self._own(window, row)), share)

    def _own(self, window: Window, row: np.ndarray) -> np.ndarray:
        """A window's samples of a call's row (a window shorter than the call's: its first
        n*S - trim, which the padding after it does not touch)."""
        return row[: len(window.codes) * self.runner.samples_per_frame - self.runner.trim]


class AudioStream:
    """One request's vocoding while its frames arrive: pieces, timing, first-audio time."""

    def __init__(self, vocoder: WindowedVocoder, batch: WindowBatch) -> None:
        self.vocoder = vocoder
        self.batch = batch
        batch.streams.append(self)  # its windows are vocoded with the batch's
        self.pieces: list[np.ndarray] = []
        self.frames = 0
        self.seconds = 0.0
        self.first_audio: float | None = None
        self.arrivals: list[tuple[float, int]] = []  # (perf_counter, samples) per audio piece
        self.skip = 0  # samples still to cut from the front (a primed prompt's)
        self.closing = False  # no more frames will come
        self.in_flight = 0  # its windows in calls on the batch's worker thread, not yet taken in

    def prime(self, codes: np.ndarray, samples: int) -> None:
        """Put prompt codes in front of the request's (not counted in ``frames``) and cut
        their ``samples`` off the audio."""
        self.vocoder.add(np.asarray(codes, np.int64))
        self.skip = samples
        self.batch.fresh = True

    def __call__(self, frames: np.ndarray) -> None:
        self.frames += len(frames)
        self.vocoder.add(np.asarray(frames, np.int64))
        self.batch.fresh = True

    @property
    def calls(self) -> int:
        """Engine calls its windows took part in."""
        return self.vocoder.windows

    @property
    def busy(self) -> bool:
        """Audio still to come that the stage must wait for (beside): windows in calls on the
        worker thread, or, once no more frames come, frames not yet sent to one."""
        return self.in_flight > 0 or (self.closing and self.vocoder.left > 0)

    def close(self) -> None:
        """No more frames will come: its last window goes with the batch's next calls."""
        self.closing = True
        self.batch.fresh = True

    def take(self, piece: np.ndarray, seconds: float) -> None:
        self.seconds += seconds
        if self.skip:
            cut = min(self.skip, piece.size)
            piece, self.skip = piece[cut:], self.skip - cut
        if piece.size:
            self.pieces.append(piece)
            now = time.perf_counter()
            self.arrivals.append((now, int(piece.size)))
            if self.first_audio is None:
                self.first_audio = now

    def finish(self) -> np.ndarray:
        self.close()  # the last window, with the windows still queued (no end_step came)
        self.batch.decode_ready()
        if self.in_flight:
            self.batch.collect(until=self)
        if self.first_audio is None:
            self.first_audio = time.perf_counter()
        if not self.pieces:  # no frames: the talker ended speech at its first code
            return np.zeros(0, np.float32)
        return np.concatenate(self.pieces).astype(np.float32, copy=False)
