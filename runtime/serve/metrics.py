"""edge-serve's /metrics: prometheus-client's metrics in a registry of the server's own (never
the process-wide one, so servers in one process, and a ``forget``, count apart).

Requests by outcome (ok, error, cancelled, and those turned away: invalid, rejected), requests
in the server and its capacity, tokens and audio seconds made, the decoders' prompt positions
(from the context cache or prefilled), and histograms of the time to first token and to first
audio from submission.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
OUTCOMES = ("ok", "error", "cancelled", "invalid", "rejected")


class Metrics:
    """Thread-safe (prometheus-client's metrics are): the scheduler's thread and the HTTP
    handlers both update it."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.outcomes = Counter("edgeomni_requests", "Requests by outcome.", ["outcome"],
                                registry=r)  # fmt: skip
        for outcome in OUTCOMES:
            self.outcomes.labels(outcome)
        self.in_flight = Gauge("edgeomni_requests_in_flight",
                               "Requests in the server (running or waiting).", registry=r)  # fmt: skip
        self.capacity = Gauge("edgeomni_requests_capacity",
                              "Requests the server holds before it answers 429.", registry=r)  # fmt: skip
        self.running = Gauge("edgeomni_loop_running", "Whether the scheduler loop runs.",
                             registry=r)  # fmt: skip
        self.tokens = Counter("edgeomni_generated_tokens",
                              "Text tokens of the requests that left.", registry=r)  # fmt: skip
        self.prompt_positions = Counter(
            "edgeomni_prompt_tokens", "Prompt positions of the decoder stages, from the context "
            "cache (cached) or prefilled (computed).", ["source"], registry=r)  # fmt: skip
        for source in ("cached", "computed"):
            self.prompt_positions.labels(source)
        self.audio_s = Counter("edgeomni_audio_seconds", "Seconds of audio made.", registry=r)
        self.first_token = Histogram("edgeomni_time_to_first_token_seconds",
                                     "From submission to the first text.", buckets=BUCKETS_S,
                                     registry=r)  # fmt: skip
        self.first_audio = Histogram("edgeomni_time_to_first_audio_seconds",
                                     "From submission to the first audio.", buckets=BUCKETS_S,
                                     registry=r)  # fmt: skip

    def count(self, outcome: str) -> None:
        self.outcomes.labels(outcome).inc()

    def left(self, outcome: str, tokens: int, audio_s: float) -> None:
        self.outcomes.labels(outcome).inc()
        self.tokens.inc(tokens)
        self.audio_s.inc(audio_s)

    def prompt(self, cached: int, computed: int) -> None:
        self.prompt_positions.labels("cached").inc(cached)
        self.prompt_positions.labels("computed").inc(computed)

    def first(self, kind: str, seconds: float) -> None:
        (self.first_token if kind == "token" else self.first_audio).observe(seconds)

    def render(self, in_flight: int, capacity: int, running: Callable[[], bool]) -> str:
        """Prometheus's text format, the server's gauges as they are now."""
        self.in_flight.set(in_flight)
        self.capacity.set(capacity)
        self.running.set(int(running()))
        return generate_latest(self.registry).decode()
