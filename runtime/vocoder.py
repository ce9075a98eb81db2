"""Windowed vocoding of codec frames, gap-free: the pure windowing rule, apart from any engine.

A vocoder like Qwen3-Omni's code2wav turns n frames into n*S - trim samples (S samples per frame;
trim = 555 for code2wav): the last ``trim`` samples of a window need the next frame. It is causal,
so a window's samples equal the whole-utterance decode's once the window starts early enough.

HF's ``chunked_decode`` keeps each window's samples from ``context*S`` on, so the ``trim`` samples
before every join are never produced (2 x 555 missing at 60 frames in chunks of 20). Here a window
of new frames [s, e) decodes frames [s-k, e), k = min(left_context, s), and keeps window samples
[k*S - trim, (e-s+k)*S - trim): exactly the whole decode's samples [s*S - trim, e*S - trim).

- First window (s = 0, no left context): keeps [0, e*S - trim); exact, by causality.
- Later windows emit (e-s)*S samples each; exact once left_context covers the vocoder's receptive
  field (code2wav: layers x (sliding_window-1) frames plus a few of convs), approximate below it.
- Last (partial) window, at ``flush``: the frames left over, e = the utterance end.
Concatenated, the pieces are n*S - trim samples long, the whole decode's length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

# codes int64 [1, Q, n] -> samples (any shape, n*S-trim)
Decode = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Window:
    """Frames [start, end) to vocode, decoded with ``context`` frames before them: ``codes``
    holds all of them, [context + end - start, Q]."""

    codes: np.ndarray
    start: int
    end: int
    context: int


class WindowedVocoder:
    """Feed frames as they are generated; get back the audio that became final.

    A window is decoded once its frames are in, so pushing frame by frame or in chunks gives the
    same windows and the same samples; audio lags generation by at most one window. The first
    window has ``first_window`` frames (a short one brings the first audio earlier); the next
    ones double from it up to ``window`` (``size``): each window then plays at least as long as
    the next takes to generate, as long as frames come at least twice as fast as real time, so
    a short first window is not followed by a wait for a long second one.
    """

    def __init__(
        self,
        decode: Decode,
        *,
        window: int,
        left_context: int,
        samples_per_frame: int = 1920,
        trim: int = 555,
        first_window: int | None = None,
    ) -> None:
        first_window = window if first_window is None else first_window
        if window < 1 or first_window < 1:
            raise ValueError(f"windows must be at least 1 frame, got {first_window} and {window}")
        if trim > 0 and left_context * samples_per_frame < trim:
            # the trim samples before a join come from the context frames' decode
            raise ValueError(
                f"left_context {left_context} frames is too short to produce the {trim} samples "
                f"before each join; use at least {-(-trim // samples_per_frame)}"
            )
        self.decode = decode
        self.window = window
        self.first_window = first_window
        self.left_context = left_context
        self.samples_per_frame = samples_per_frame
        self.trim = trim
        self._frames: list[np.ndarray] = []  # [k, Q] chunks kept (older ones are dropped)
        self._base = 0  # index of the first kept frame
        self._count = 0  # frames received
        self._done = 0  # frames whose audio has been emitted (the next window's start)
        self.windows = 0  # windows decoded so far

    def push(self, frames: np.ndarray) -> np.ndarray:
        """Add frames [k, Q]; returns the samples of every window now complete (maybe none)."""
        self.add(frames)
        pieces = []
        while (window := self.pending()) is not None:
            pieces.append(self.accept(window, self._call(window.codes)))
        return np.concatenate(pieces) if pieces else np.zeros(0, np.float32)

    def add(self, frames: np.ndarray) -> None:
        """Add frames [k, Q] without decoding (a caller that batches windows decodes them)."""
        frames = np.asarray(frames, dtype=np.int64)
        if frames.ndim == 1:
            frames = frames[None, :]
        if frames.ndim != 2:
            raise ValueError(f"frames must be [k, num_quantizers], got shape {frames.shape}")
        if len(frames):
            self._frames.append(frames)
            self._count += len(frames)

    @property
    def left(self) -> int:
        """Frames received whose audio is not made yet (nor being made: ``take``)."""
        return self._count - self._done

    def size(self, index: int) -> int:
        """New frames of window ``index`` (0: the first)."""
        if index == 0:
            return self.first_window
        return min(self.window, self.first_window << index)

    def lengths(self) -> list[int]:
        """The lengths (new frames plus left context) of every window but a last partial one,
        in order of first use: a vocoder that runs fixed lengths prepares these."""
        out: list[int] = []
        start, index = 0, 0
        while True:
            size, context = self.size(index), min(self.left_context, start)
            if size + context not in out:
                out.append(size + context)
            if size == self.window and context == self.left_context:
                return out
            start, index = start + size, index + 1

    def pending(self) -> Window | None:
        """The next complete window, to decode and hand to ``accept``; None while incomplete."""
        size = self.size(self.windows)
        if self._count - self._done < size:
            return None
        return self._window(self._done + size)

    def accept(self, window: Window, samples: np.ndarray) -> np.ndarray:
        """The final audio of a decoded window (its samples [n*S - trim]); the next starts."""
        self.take(window)
        return self.cut(window, samples)

    def take(self, window: Window) -> None:
        """The window is being decoded (``cut`` gives its audio once it is): the next starts,
        so a caller may decode the next before this one's samples are back."""
        if window.start != self._done:
            raise ValueError(f"window at frame {window.start}, expected {self._done}")
        self._done = window.end
        self.windows += 1
        # keep only what later windows read: their left context and the frames not yet decoded
        kept = self._kept()
        first = max(self._base, window.end - self.left_context)
        self._frames = [kept[first - self._base :]]
        self._base = first

    def cut(self, window: Window, samples: np.ndarray) -> np.ndarray:
        """The final audio of a taken window from its samples [n*S - trim]."""
        samples = self._checked(samples, len(window.codes))
        s, trim, k = self.samples_per_frame, self.trim, window.context
        lo = k * s - trim if window.start > 0 else 0
        hi = (window.end - window.start + k) * s - trim
        return samples[lo:hi]

    def tail(self) -> Window | None:
        """The last, partial window once no more frames come (None when nothing is left)."""
        return None if self._count == self._done else self._window(self._count)

    def flush(self) -> np.ndarray:
        """The samples of the last, partial window (empty when nothing is pending)."""
        window = self.tail()
        if window is None:
            return np.zeros(0, np.float32)
        return self.accept(window, self._call(window.codes))

    def decode_whole(self, codes: np.ndarray) -> np.ndarray:
        """All of ``codes`` [n, Q] in one decode call: the reference the windows reproduce."""
        codes = np.asarray(codes, dtype=np.int64)
        if len(codes) == 0:
            return np.zeros(0, np.float32)
        self.windows += 1
        return self._call(codes)

    # ---------------------------------------------------------------------------------------
    def _window(self, end: int) -> Window:
        start = self._done
        k = min(self.left_context, start)
        return Window(self._kept()[start - k - self._base : end - self._base], start, end, k)

    def _kept(self) -> np.ndarray:
        """The frames kept, [k, Q], from frame ``_base`` on."""
        return np.concatenate(self._frames) if len(self._frames) > 1 else self._frames[0]

    def _call(self, codes: np.ndarray) -> np.ndarray:
        """One decode of frames [n, Q]."""
        return self._checked(self.decode(np.ascontiguousarray(codes.T[None])), len(codes))

    def _checked(self, samples: np.ndarray, n: int) -> np.ndarray:
        """A decode's samples for ``n`` frames, flat float32, held to the vocoder's sample rule
        (n*S - trim of them)."""
        samples = np.asarray(samples, np.float32).ravel()
        expected = n * self.samples_per_frame - self.trim
        if samples.size != expected:
            raise ValueError(
                f"the vocoder returned {samples.size} samples for {n} frames; expected {expected}"
            )
        return samples


def playback_stall_s(arrivals: Sequence[tuple[float, int]], sample_rate: int) -> float:
    """Seconds a player would wait for audio after it started: it starts playing the first piece
    when it arrives and plays the pieces back to back, waiting whenever the next has not come
    yet. ``arrivals``: (time in seconds, samples) for each piece, in order. First audio alone
    does not tell this: a short first window can be followed by a wait for the next one."""
    stall = 0.0
    end = None  # when the audio received so far finishes playing
    for at, samples in arrivals:
        if end is None:
            end = at
        elif at > end:
            stall += at - end
            end = at
        end += samples / sample_rate
    return stall
