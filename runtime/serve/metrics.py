"""edge-serve's /metrics: Prometheus's text format, from counters the server keeps.

Requests by outcome (ok, error, cancelled, and those turned away: invalid, rejected), requests
in the server and its capacity, tokens and audio seconds made, and histograms of the time to
first token and to first audio from submission.
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections.abc import Callable

BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
OUTCOMES = ("ok", "error", "cancelled", "invalid", "rejected")


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)  # the last: above every bucket
        self.total = 0.0
        self.n = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS_S, seconds)] += 1
        self.total += seconds
        self.n += 1

    def lines(self, name: str) -> list[str]:
        bounds = [*map(repr, BUCKETS_S), "+Inf"]
        out = [f'{name}_bucket{{le="{le}"}} {running}'
               for le, running in zip(bounds, itertools.accumulate(self.counts), strict=True)]
        return [*out, f"{name}_sum {self.total:.6f}", f"{name}_count {self.n}"]


class Metrics:
    """Thread-safe: the scheduler's thread and the HTTP handlers both update it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self.tokens = 0
        self.audio_s = 0.0
        self.first_token = Histogram()
        self.first_audio = Histogram()

    def count(self, outcome: str) -> None:
        with self._lock:
            self.outcomes[outcome] += 1

    def left(self, outcome: str, tokens: int, audio_s: float) -> None:
        with self._lock:
            self.outcomes[outcome] += 1
            self.tokens += tokens
            self.audio_s += audio_s

    def first(self, kind: str, seconds: float) -> None:
        with self._lock:
            (self.first_token if kind == "token" else self.first_audio).observe(seconds)

    def render(self, in_flight: int, capacity: int, running: Callable[[], bool]) -> str:
        with self._lock:
            lines = [
                "# HELP edgeomni_requests_total Requests by outcome.",
                "# TYPE edgeomni_requests_total counter",
                *(
                    f'edgeomni_requests_total{{outcome="{k}"}} {v}'
                    for k, v in self.outcomes.items()
                ),
                "# HELP edgeomni_requests_in_flight Requests in the server (running or waiting).",
                "# TYPE edgeomni_requests_in_flight gauge",
                f"edgeomni_requests_in_flight {in_flight}",
                "# HELP edgeomni_requests_capacity Requests the server holds before it answers 429.",
                "# TYPE edgeomni_requests_capacity gauge",
                f"edgeomni_requests_capacity {capacity}",
                "# HELP edgeomni_loop_running Whether the scheduler loop runs.",
                "# TYPE edgeomni_loop_running gauge",
                f"edgeomni_loop_running {int(running())}",
                "# HELP edgeomni_generated_tokens_total Text tokens of the requests that left.",
                "# TYPE edgeomni_generated_tokens_total counter",
                f"edgeomni_generated_tokens_total {self.tokens}",
                "# HELP edgeomni_audio_seconds_total Seconds of audio made.",
                "# TYPE edgeomni_audio_seconds_total counter",
                f"edgeomni_audio_seconds_total {self.audio_s:.6f}",
                "# HELP edgeomni_time_to_first_token_seconds From submission to the first text.",
                "# TYPE edgeomni_time_to_first_token_seconds histogram",
                *self.first_token.lines("edgeomni_time_to_first_token_seconds"),
                "# HELP edgeomni_time_to_first_audio_seconds From submission to the first audio.",
                "# TYPE edgeomni_time_to_first_audio_seconds histogram",
                *self.first_audio.lines("edgeomni_time_to_first_audio_seconds"),
            ]
        return "\n".join(lines) + "\n"
