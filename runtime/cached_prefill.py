"""A decoder stage's prefill through its prefix cache (runtime/context_cache.py).

Each row of a run looks its prompt's blocks up, copies what it finds into its row and prefills
only the rest: its feeds from the first position not found, its past length that position. A
hybrid model (state beside its kv) also splits a row's prefill at the block boundaries where a
state is worth keeping: where its kv blocks were found without one (a second request that
shares a system prompt with the first takes one where they part, so the third resumes there)
and at its prompt's last boundary (a repeated prompt). A row's segments run as calls over the
whole run, right-aligned (a row with fewer sits the first calls out, query length 0), so the
last call holds every row's last position and its logits.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeomni.runtime.context_cache import PrefixCache, row_arrays, seed_of

__all__ = ["Assembled", "CachedRow", "assemble", "phase_feeds", "plan_rows"]


@dataclass
class CachedRow:
    """One row of a run: its keys, the positions restored from the cache (``start``), its
    segments' ends, and the per-position outputs it keeps (name -> host arrays in order)."""

    row: int  # in the run's call (0-based)
    length: int
    keys: list[bytes]
    start: int
    ends: list[int]
    outputs: tuple[str, ...] = ()
    kept: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def segment(self, phase: int, phases: int) -> tuple[int, int] | None:
        """The positions it prefills in call ``phase`` of ``phases`` (right-aligned), or None."""
        k = phase - (phases - len(self.ends))
        if k < 0:
            return None
        return (self.start if k == 0 else self.ends[k - 1]), self.ends[k]


def plan_rows(
    prefix: PrefixCache,
    feeds: Mapping[str, np.ndarray],
    axes: Mapping[str, int],
    lengths: Sequence[int],
    first: int,
    salts: Sequence[str | None],
    wants: Sequence[bool],
    per_position: Sequence[str],
) -> list[CachedRow] | None:
    """Look each row up and restore what it finds into cache row ``first + j``; None when a
    feed's row axis is not known (the run prefills as if there were no cache)."""
    out = []
    for j, length in enumerate(lengths):
        arrays = row_arrays(feeds, axes, j)
        if arrays is None:
            return None
        keys = prefix.chain(seed_of(prefix.part, salts[j]), arrays, length)
        names = tuple(per_position) if wants[j] else ()
        match = prefix.match(keys, length, names)
        kept: dict[str, list[np.ndarray]] = {n: [] for n in names}
        blocks = match.blocks
        if blocks:
            found = prefix.restore(first + j, keys[:blocks], names)
            if found is None:
                blocks = 0
            else:
                kept = {n: list(found[n]) for n in names}
        start = blocks * prefix.block
        last = (length - 1) // prefix.block  # the last boundary that leaves a position to run
        cuts: set[int] = set()
        if prefix.hybrid:
            cuts = {b for b in (match.known, last) if blocks < b <= last}
        ends = [b * prefix.block for b in sorted(cuts)] + [length]
        stats = prefix.part.stats
        stats.lookups += 1
        stats.hits += int(start > 0)
        stats.cached_tokens += start
        stats.computed_tokens += length - start
        out.append(CachedRow(j, length, keys, start, ends, names, kept))
    return out


def phase_feeds(
    rows: Sequence[CachedRow],
    phase: int,
    phases: int,
    feeds: Mapping[str, np.ndarray],
    axes: Mapping[str, int],
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Call ``phase``'s feeds (each row's segment from its row's first column), past lengths and
    query lengths (0: the row sits the call out)."""
    spans = [r.segment(phase, phases) for r in rows]
    width = max(b - a for a, b in (s for s in spans if s is not None))
    past = np.zeros(len(rows), np.int32)
    query = np.zeros(len(rows), np.int32)
    out = {}
    for name, x in feeds.items():
        a = axes[name]
        shape = list(x.shape)
        shape[a + 1] = width
        y = np.zeros(shape, x.dtype)
        for r, span in zip(rows, spans, strict=True):
            if span is None:
                continue
            lo, hi = span
            src = [slice(None)] * x.ndim
            src[a], src[a + 1] = r.row, slice(lo, hi)
            dst = [slice(None)] * x.ndim
            dst[a], dst[a + 1] = r.row, slice(0, hi - lo)
            y[tuple(dst)] = x[tuple(src)]
        out[name] = y
    for r, span in zip(rows, spans, strict=True):
        if span is None:
            past[r.row] = r.start  # right-aligned: a row sitting out has not started
        else:
            past[r.row], query[r.row] = span[0], span[1] - span[0]
    return out, past, query


class Assembled(Mapping[str, Any]):
    """A prefill's outputs as a spec reads them: the last call's, but the per-position ones
    assembled per row from the cache's and every call's (rows that keep none read NaN)."""

    def __init__(self, last: Any, per_position: Mapping[str, np.ndarray]) -> None:
        self._last, self._per_position = last, dict(per_position)
        self.rows = last.rows

    def __getitem__(self, name: str) -> Any:
        if name in self._per_position:
            return self._per_position[name]
        return self._last[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._last)

    def __len__(self) -> int:
        return len(self._last)

    def buffer(self, name: str) -> Any:
        return self._last.buffer(name)

    def fetch(self, *names: str) -> None:
        self._last.fetch(*(n for n in names if n not in self._per_position))

    def logits(self) -> Any:
        return self._last.logits()


def assemble(rows: Sequence[CachedRow], name: str, width: int, tail: tuple[int, ...]
             ) -> np.ndarray:  # fmt: skip
    """Per-position output ``name`` [rows, width, *tail]: each keeping row's cached and computed
    positions in order, NaN elsewhere."""
    out = np.full((len(rows), width, *tail), np.nan, np.float32)
    for r in rows:
        if name in r.kept:
            parts = r.kept[name]
            got = np.concatenate(parts) if parts else np.zeros((0, *tail), np.float32)
            out[r.row, : len(got)] = got
    return out
