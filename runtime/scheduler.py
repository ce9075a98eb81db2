"""Group requests into cohorts that can run as one batch.

A cohort's requests must run the same stages with the same request fields and share
batch-wide settings (sampling, chat-template flags); the caller folds all of that into one
hashable key per request. Grouping is greedy in input order so results are deterministic and
early requests are never starved by later ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence

__all__ = ["make_cohorts"]


def make_cohorts(keys: Sequence[Hashable], width: int) -> list[list[int]]:
    """Split request indices into cohorts of at most ``width`` requests with equal keys.

    Walking the requests in order, each cohort starts at the first unassigned request and
    takes the following unassigned requests with an equal key until it is full; requests that
    do not fit wait for a later cohort. Every index appears exactly once, in increasing order
    within its cohort, and cohorts are ordered by their first request.
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"cohort width must be an integer >= 1, got {width!r}")
    # Per key, its requests in input order: a cohort always takes from the front, so the
    # front is the earliest unassigned request with that key.
    queues: dict[Hashable, deque[int]] = {}
    for i, key in enumerate(keys):
        queues.setdefault(key, deque()).append(i)
    assigned = [False] * len(keys)
    cohorts: list[list[int]] = []
    for i, key in enumerate(keys):
        if assigned[i]:
            continue
        queue = queues[key]
        cohort = [queue.popleft() for _ in range(min(width, len(queue)))]
        for j in cohort:
            assigned[j] = True
        cohorts.append(cohort)
    return cohorts
