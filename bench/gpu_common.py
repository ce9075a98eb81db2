"""Shared by bench/gpu_omni.py and its two halves (gpu_omni_hf.py, gpu_omni_report.py), and
bench/gpu_tts_workers.py (Timeline).

The constants, phase timing and GPU helpers that the edgeomni side, the transformers side and
the report all use, and the 48-layer estimate both sides apply to their summaries. A module of
its own so that gpu_omni.py can import the other two without either importing gpu_omni.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Iterator
from typing import Any

REAL_THINKER_LAYERS = 48
SAMPLE_RATE = 24000
FRAME_S = 1920 / SAMPLE_RATE  # one codec frame: 80 ms of audio
SPEAKER = "ethan"
# Published figures to beat (shared/notes/peers.md: mstar PR benchmark matrix, T2S on Seed-TTS,
# 2x B300, thinker greedy): not reproduced here, different hardware and workload.
PEERS = {
    "source": "M* (mstar PR benchmark, 2x B300, T2S Seed-TTS; published, not reproduced)",
    "rtf_p50_c1": 0.099,
    "ttfa_p50_ms_c1": 142,
    "audio_s_per_s_c32": 80.5,
}


# -- phases ----------------------------------------------------------------------------------
PHASES: dict[str, float] = {}
TAG = ["gpu_omni"]  # the script name phase() prints (a script sets TAG[0])


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time and print one phase, so the output shows where the GPU machine's time goes."""
    print(f"[{TAG[0]}] {name} ...", flush=True)
    start = time.perf_counter()
    yield
    PHASES[name] = round(PHASES.get(name, 0.0) + time.perf_counter() - start, 2)
    print(f"[{TAG[0]}] {name} done in {time.perf_counter() - start:.1f} s", flush=True)


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free_gpu() -> None:
    gc.collect()
    if cuda_available():
        import torch

        torch.cuda.empty_cache()


# -- 48-layer estimate ----------------------------------------------------------------------
def scale_extra_ms(layered_ms: float, layers: int) -> float:
    """The 48-layer estimate adds ``layered_ms`` x (48/L - 1). edgeomni passes its thinker's
    engine time (calls waited for, so GPU time plus launch): the host work between calls does
    not grow with layers, but the LM head and logits top-K inside the engine are scaled too,
    so it still overstates the thinker. transformers passes its whole thinker time (its host
    work is per layer too)."""
    return layered_ms * (REAL_THINKER_LAYERS / layers - 1)


def scaled(summary: dict[str, Any], rows: list[dict[str, Any]], batches: list[dict[str, Any]],
           layers: int, layered_ms: float) -> dict[str, Any]:  # fmt: skip
    """ESTIMATES at 48 thinker layers (not measured): the thinker runs before any audio, so its
    extra time (``scale_extra_ms``) adds to every request's first audio and end-to-end time."""
    if layers >= REAL_THINKER_LAYERS:
        return {}
    extra = scale_extra_ms(layered_ms, layers)
    wall = sum(b["wall_ms"] for b in batches) + extra * len(batches)
    return {
        "scaled48_estimate": {
            "thinker_ms": round(summary["thinker_ms"] + extra, 1),
            "ttfa_p50_ms": round(summary["ttfa_p50_ms"] + extra, 1),
            "rtf_p50": round(
                statistics.median((r["e2e_ms"] + extra) / 1e3 / r["audio_s"] for r in rows), 4
            ),
            "audio_s_per_s": round(sum(b["audio_s"] for b in batches) / (wall / 1e3), 3),
        }
    }


class Timeline:
    """A Pipeline.run listener: each request's first audio (an AudioChunk with samples;
    runtime.events) and last event, in seconds from the listener's creation, just before the
    run (in flight events come as they happen; a cohort's come when it ends, so there the
    stages' own first-audio times are used, which count from the cohort's start)."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first_audio: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def __call__(self, event: Any) -> None:
        now = time.perf_counter() - self.start
        samples = getattr(event, "samples", None)
        if type(event).__name__ == "AudioChunk" and samples is not None and samples.size:
            self.first_audio.setdefault(event.index, now)
        self.last[event.index] = now
