"""The files edge-infer writes for each request's speech, made from the event stream: a
request's audio (and its codes) is written the moment its vocoder finishes it, so what a long
run has spoken is on disk before the run ends, and an interrupted run keeps it."""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime.audio import write_wav
from edgeomni.runtime.events import AudioChunk, CodecFrames, Event, Failed, Finished
from edgeomni.runtime.safetensors_np import save


@dataclass
class _Speech:
    chunks: list[np.ndarray] = field(default_factory=list)
    samples: int = 0
    sample_rate: int | None = None
    frames: list[np.ndarray] = field(default_factory=list)


class AudioWriter:
    """A listener that gathers each request's ``AudioChunk`` events from the ``audio_stages``
    (and its ``CodecFrames`` from the ``codec_stages``) and, on that audio stage's
    ``Finished``, writes ``out_audio`` (one request) or ``audio_req<i>.wav`` and
    ``rvq_req<i>.safetensors`` (``rvq_codes``, int32 [frames, groups]) in ``out_dir``, as
    upstream names them. ``fields[i]`` are the predictions entry's audio fields of what was
    written. The first write that fails is kept in ``error`` and nothing more is written (the
    run goes on; the caller reports it). ``guard`` wraps each write (the CLI defers stop signals
    until the file is whole)."""

    def __init__(
        self,
        audio_stages: Collection[str],
        codec_stages: Collection[str],
        *,
        out_audio: Path | None = None,
        out_dir: Path | None = None,
        guard: Callable[[], AbstractContextManager[Any]] = nullcontext,
    ) -> None:
        self.audio_stages = frozenset(audio_stages)
        self.codec_stages = frozenset(codec_stages)
        self.out_audio = out_audio
        self.out_dir = out_dir
        self.guard = guard
        self.fields: dict[int, dict[str, Any]] = {}
        self.error: OSError | None = None
        self._open: dict[int, _Speech] = {}

    @property
    def enabled(self) -> bool:
        return self.out_audio is not None or self.out_dir is not None

    def __call__(self, event: Event) -> None:
        if not self.enabled:
            return
        if isinstance(event, AudioChunk) and event.stage in self.audio_stages:
            speech = self._open.setdefault(event.index, _Speech())
            if event.offset != speech.samples:  # a stage's chunks are contiguous, in order
                raise RuntimeError(
                    f"request {event.index}: audio chunk at sample {event.offset}, expected "
                    f"{speech.samples}"
                )
            speech.chunks.append(event.samples)
            speech.samples += len(event.samples)
            speech.sample_rate = event.sample_rate
        elif isinstance(event, CodecFrames) and event.stage in self.codec_stages:
            self._open.setdefault(event.index, _Speech()).frames.append(event.codes)
        elif isinstance(event, Finished) and event.stage in self.audio_stages:
            speech = self._open.pop(event.index, None)
            if speech is not None and speech.sample_rate is not None and self.error is None:
                try:
                    with self.guard():
                        self.fields[event.index] = self._write(event.index, speech)
                except OSError as e:
                    self.error = e
        elif isinstance(event, Failed):
            self._open.pop(event.index, None)

    def _write(self, index: int, speech: _Speech) -> dict[str, Any]:
        rate = int(speech.sample_rate or 0)
        audio = np.concatenate(speech.chunks).astype(np.float32, copy=False)
        fields: dict[str, Any] = {}
        if self.out_audio is not None:
            wav = self.out_audio
        else:
            assert self.out_dir is not None
            self.out_dir.mkdir(exist_ok=True)  # its parent was checked before the run
            wav = self.out_dir / f"audio_req{index}.wav"
            if speech.frames:
                rvq = self.out_dir / f"rvq_req{index}.safetensors"
                codes = np.concatenate(speech.frames)
                save(rvq, {"rvq_codes": np.ascontiguousarray(codes, np.int32)})
                fields["rvq_file"] = str(rvq)
        write_wav(wav, audio, rate)
        fields.update(
            audio_file=str(wav),
            audio_samples=int(len(audio)),
            audio_sample_rate=rate,
            audio_duration_ms=int(round(1e3 * len(audio) / rate)),
        )
        return fields
