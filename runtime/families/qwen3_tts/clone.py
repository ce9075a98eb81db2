"""Qwen3-TTS Base's clone encoders, stages of their own: a request that brings ``ref_audio``
gets its speaker embedding (``qwen3_tts.speaker_encoder``: the x-vector of a 24 kHz mel) and,
with ``ref_text`` too, its reference codes (``qwen3_tts.speech_encoder``: the 12 Hz codec's
encoder, 16 codes a 1920-sample frame). A request without them never plans these stages (the
graph's inputs fail when ``request:ref_audio`` is missing, and the talker skips theirs).

The reference clip is read and resampled to 24 kHz when the request is prepared, so a missing
or unreadable file fails that request before any engine runs. Each request is one engine call:
clips differ in length, and neither encoder takes a padding mask (upstream encodes them one at
a time too, or a zero-padded row changes its last frame's codes).

With a context cache attached (``use_context_cache``, issue 54) the same reference audio, hashed,
is encoded once: a voice cloned in request after request runs its encoders the first time only.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import numpy as np

from edgeomni.runtime.artifacts import Artifact, check_folder
from edgeomni.runtime.audio import read_wav, resample
from edgeomni.runtime.call_stage import CallStage
from edgeomni.runtime.context_cache import CachePart, ContextCache, build_identity, digest
from edgeomni.runtime.engine import DEFAULT_ENGINES, Engines
from edgeomni.runtime.families.qwen3_tts.speaker_mel import speaker_mel
from edgeomni.runtime.stage import RequestError, RequestState, StageRunner, stage_source

__all__ = ["SpeakerEncoder", "SpeechEncoder"]

REF_AUDIO = "ref_audio"  # the stage input both read


class _Encoder(StageRunner):
    """One reference clip in, one array out (``port``), a call per request."""

    kind = "iterative"
    artifact: Artifact
    port: str

    def __init__(self, stage: Any, folder: Path, *, engines: Engines = DEFAULT_ENGINES) -> None:
        """One call per request: nothing of its engine is captured."""
        self.open_stage(stage, folder, engines, replay=False)
        self.sample_rate = int(self.config["sample_rate"])
        self.cache: CachePart | None = None  # use_context_cache's part; None: every clip encoded

    def use_context_cache(self, cache: ContextCache) -> None:
        """Keep this stage's part of ``cache`` under the build's identity (its config.json and
        engine file as they are now), so a rebuilt engine never reads the old one's outputs."""
        self.cache = cache.part(self.stage.id, build_identity(self.folder, self.config))

    @classmethod
    def check(cls, stage: Any, folder: Path) -> Any:
        stage_source(stage, REF_AUDIO)
        return check_folder(folder, cls.artifact)

    def prepare(self, state: RequestState) -> np.ndarray:
        """The request's reference clip, mono float32 at the encoder's rate."""
        path = state.request.speech.get(REF_AUDIO)
        if path is None:
            raise RequestError(f"{self.stage.id}: the request has no ref_audio")
        try:
            wav, rate = read_wav(path)
        except (OSError, ValueError) as e:
            raise RequestError(f"ref_audio: {e}") from None
        return resample(wav, rate, self.sample_rate) if rate != self.sample_rate else wav

    def encode(self, wav: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def encode_request(self, state: RequestState) -> list[Any]:
        """Writes the request's output and report (it makes no events: its output is the
        talker's input); a RequestError fails it alone."""
        wav = cast(np.ndarray, state.prepared[self.stage.id])  # prepare's clip
        start = time.perf_counter()
        out, cached = self.cached_encode(wav)
        state.outputs[f"{self.stage.id}:{self.port}"] = out
        state.details[self.stage.id] = {
            "ref_audio_samples": int(wav.size),
            "encode_ms": round((time.perf_counter() - start) * 1e3, 3),
            "cached": cached,
            "finish_reason": "complete",
        }
        return []

    def cached_encode(self, wav: np.ndarray) -> tuple[np.ndarray, bool]:
        """``encode(wav)``, and whether the cache had it. An entry is a copy of what was
        encoded and a hit hands out a copy of the entry: no request changes what another reads."""
        if self.cache is None:
            return self.encode(wav), False
        clip = np.ascontiguousarray(wav)
        key = digest(clip.tobytes(), clip.dtype.str, repr(clip.shape), str(self.sample_rate))
        found = self.cache.find(key)
        if found is not None:
            return np.array(found, copy=True), True
        out = self.encode(wav)
        entry = np.array(out, copy=True)
        self.cache.put(entry, entry.nbytes, key)
        return out, False

    def slot_stage(self, *, stream_upstream: bool = False) -> CallStage:
        return CallStage(self.stage.id, self.encode_request)


class SpeakerEncoder(_Encoder):
    """qwen3_tts.speaker_encoder: the clip's x-vector [H] (upstream's
    ``extract_speaker_embedding``: a 128-bin log-mel of 24 kHz audio through ECAPA-TDNN)."""

    artifact = Artifact(
        keys=("sample_rate", "n_fft", "num_mels", "hop_size", "win_size", "fmin", "fmax",
              "embedding_size", "min_frames"),
    )  # fmt: skip
    port = "xvector"

    def encode(self, wav: np.ndarray) -> np.ndarray:
        cfg = self.config
        try:
            mel = speaker_mel(
                wav, sample_rate=self.sample_rate, n_fft=int(cfg["n_fft"]),
                num_mels=int(cfg["num_mels"]), hop_size=int(cfg["hop_size"]),
                win_size=int(cfg["win_size"]), fmin=float(cfg["fmin"]), fmax=float(cfg["fmax"]),
            )  # fmt: skip
        except ValueError as e:
            raise RequestError(f"ref_audio: {e}") from None
        if len(mel) < int(cfg["min_frames"]):
            raise RequestError(
                f"ref_audio: {wav.size} samples give {len(mel)} mel frames; the speaker "
                f"encoder needs at least {cfg['min_frames']}"
            )
        out = np.empty((1, int(cfg["embedding_size"])), np.float32)
        binding = self.engine.binding()
        binding.bind_output("speaker_embedding", out)
        binding.run({"mels": np.ascontiguousarray(mel[None], np.float32)})
        return out[0]


class SpeechEncoder(_Encoder):
    """qwen3_tts.speech_encoder: the clip's codes [ceil(samples / 1920), 16] (upstream's
    ``speech_tokenizer.encode``), the reference part of an ICL prompt."""

    artifact = Artifact(keys=("sample_rate", "samples_per_frame", "num_quantizers"))
    port = "codes"

    def encode(self, wav: np.ndarray) -> np.ndarray:
        per_frame = int(self.config["samples_per_frame"])
        frames = -(-wav.size // per_frame)
        out = np.empty((1, frames, int(self.config["num_quantizers"])), np.int64)
        binding = self.engine.binding()
        binding.bind_output("codes", out)
        binding.run({"wav": np.ascontiguousarray(wav[None], np.float32)})
        return out[0]
