"""Context reuse: what a request begins with (a system prompt, an image, a voice), computed once
and copied into the rows of every later request that begins the same way.

One ``ContextCache`` holds every stage's entries in one memory budget (``--context-cache-mb``),
least recently used first out. An entry is published once and never changes; a request copies
what it finds into its own rows before its prefill, so an entry evicted later costs no running
request anything, and nothing a request computes reaches another's rows but through an entry
made of the same inputs.

A decoder stage's entries (``PrefixCache``) are fixed blocks of ``BLOCK_TOKENS`` prompt
positions, keyed by a hash chain over everything its prefill feeds per position (the
embeddings, so a token's id, an image's or an audio clip's encoded rows and a voice's
embedding alike; the positions; per-position extras such as DeepStack features), seeded by the
stage, its build and the request's ``context_cache_key``. Per block it keeps:

- ``kv``: the attention keys and values of its positions;
- ``state``: the other declared state (a linear-attention layer's recurrent and convolution
  state) at the block's end, for the boundaries where one was taken: a hybrid model resumes at
  the longest cached boundary that has one;
- ``outputs``: per-position outputs a request reads on the host (a thinker's accept-layer states
  of the prompt, handed to its talker), where one was kept.

Other stages keep whole values (``get``/``put``: an encoder's output for a clip it has seen).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeomni.runtime.buffers import Array
from edgeomni.runtime.row_state import RowState

__all__ = ["BLOCK_TOKENS", "AUTO_MIN_MEMORY_GIB", "AUTO_MB", "CachePart", "ContextCache",
           "PrefixCache", "auto_budget_mb", "build_identity", "digest"]  # fmt: skip

BLOCK_TOKENS = 8  # prompt positions per block: a hit resumes at a multiple of this
# --context-cache-mb's default: on with AUTO_MB where the machine has at least
# AUTO_MIN_MEMORY_GIB of memory, off below (an 8 GiB board's memory is its weights' and rows')
AUTO_MB = 1024
AUTO_MIN_MEMORY_GIB = 16


CONTEXT_CACHE_HELP = (
    "the context cache's budget in MiB: a prompt's blocks (a system prompt, an image, a voice "
    "or a clone's reference), kept after its request and copied into the rows of every later "
    "request that begins the same way, which prefills only the rest (the same outputs; "
    "cached_tokens in the predictions, usage and /metrics); least recently used out first; "
    "a Qwen3-TTS Base clone's reference clip is encoded once. 0: off. Default: "
    f"{AUTO_MB} where the machine has at least {AUTO_MIN_MEMORY_GIB} GiB of memory, off below "
    "(a small board's memory is its weights' and rows'), and not for decoders on a GPU (there "
    "copying a prompt's blocks was measured slower than prefilling it: give a budget to use it)"
)


def cache_mb_error(mb: float | None, flag: str = "--context-cache-mb") -> str | None:
    """Why a budget cannot be used, or None (None: the default)."""
    if mb is None:
        return None
    if not 0 <= mb < float("inf"):
        return f"{flag} must be a number of MiB >= 0 (0: off), got {mb}"
    return None


def auto_budget_mb(total_bytes: int | None = None) -> int:
    """The default budget: AUTO_MB on a machine of at least AUTO_MIN_MEMORY_GIB, else 0 (off)."""
    if total_bytes is None:
        total_bytes = _total_memory()
    return AUTO_MB if total_bytes >= AUTO_MIN_MEMORY_GIB * 2**30 else 0


def _total_memory() -> int:
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def digest(*parts: bytes | str) -> bytes:
    """A 16-byte key over these parts (each length-prefixed, so no two splits collide)."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        raw = part.encode() if isinstance(part, str) else part
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw)
    return h.digest()


@dataclass
class PartStats:
    """What one stage's part of the cache did (``--dump-profile``, ``/metrics``)."""

    lookups: int = 0  # requests (rows) that looked
    hits: int = 0  # those that found something
    cached_tokens: int = 0  # prompt positions copied from entries
    computed_tokens: int = 0  # prompt positions prefilled
    stored: int = 0  # entries published
    stored_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        total = self.cached_tokens + self.computed_tokens
        return {"lookups": self.lookups, "hits": self.hits, "cached_tokens": self.cached_tokens,
                "computed_tokens": self.computed_tokens, "stored": self.stored,
                "stored_bytes": self.stored_bytes,
                "token_hit_rate": round(self.cached_tokens / total, 4) if total else None}  # fmt: skip


@dataclass(frozen=True)
class _Entry:
    value: Any
    nbytes: int


class ContextCache:
    """Entries of every stage in one budget of ``budget_bytes``, least recently used out first.
    Thread-safe (a served pipeline's stages may run on several threads)."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"the context cache's budget must be >= 0 bytes, got {budget_bytes}")
        self.budget = int(budget_bytes)
        self.used = 0
        self.evicted = 0
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.parts: dict[str, CachePart] = {}

    def part(self, name: str, identity: str = "") -> CachePart:
        """One stage's view: its keys never meet another's (``identity``: its build, so an
        engine rebuilt under the same stage id never reads the old one's entries)."""
        seed = digest(name, identity)
        part = self.parts.get(name)
        if part is None or part.seed != seed:  # a stage reopened on another build: new keys
            part = self.parts[name] = CachePart(self, name, seed)
        return part

    def get(self, key: Hashable) -> Any:
        """The entry's value (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry.value

    def has(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def touch(self, keys: Iterable[Hashable]) -> None:
        """These entries become the most recently used, in this order (the last most)."""
        with self._lock:
            for key in keys:
                if key in self._entries:
                    self._entries.move_to_end(key)

    def put(self, key: Hashable, value: Any, nbytes: int) -> bool:
        """Publish an entry (once: an entry never changes, so one already there stays as it
        is), evicting the least recently used until it fits; False when it is there already
        or larger than the whole budget."""
        with self._lock:
            if key in self._entries or nbytes > self.budget:
                return False
            while self.used + nbytes > self.budget and self._entries:
                _, old = self._entries.popitem(last=False)
                self.used -= old.nbytes
                self.evicted += 1
            self._entries[key] = _Entry(value, nbytes)
            self.used += nbytes
            return True

    def __len__(self) -> int:
        return len(self._entries)

    def as_dict(self) -> dict[str, Any]:
        """The budget, what it holds and each stage's counts."""
        return {"budget_mb": round(self.budget / 2**20, 3), "used_mb": round(self.used / 2**20, 3),
                "entries": len(self), "evicted": self.evicted,
                "stages": {n: p.stats.as_dict() for n, p in self.parts.items()}}  # fmt: skip


@dataclass
class CachePart:
    """One stage's keys in a ContextCache: each is (its seed, the stage's own key)."""

    cache: ContextCache
    name: str
    seed: bytes
    stats: PartStats = field(default_factory=PartStats)

    def key(self, *parts: Hashable) -> tuple[Any, ...]:
        return (self.seed, *parts)

    def get(self, *parts: Hashable) -> Any:
        return self.cache.get(self.key(*parts))

    def find(self, *parts: Hashable) -> Any:
        """``get``, counted as a request's lookup (and a hit when found): a stage that keeps
        whole values (an encoder's output, a vocoder's state) looks up once a request."""
        value = self.get(*parts)
        self.stats.lookups += 1
        self.stats.hits += value is not None
        return value

    def put(self, value: Any, nbytes: int, *parts: Hashable) -> bool:
        stored = self.cache.put(self.key(*parts), value, nbytes)
        if stored:
            self.stats.stored += 1
            self.stats.stored_bytes += nbytes
        return stored


@dataclass(frozen=True)
class Match:
    """What a row's prompt found: ``blocks`` it resumes after (their kv, and its state at the
    last one's end where the model has more than kv), and ``known`` blocks whose kv is there
    (a hybrid model found kv without a state at their end: the prefill takes one there)."""

    blocks: int
    known: int


class PrefixCache:
    """A decoder stage's prompt blocks (module docstring) in its part of the cache, copied
    between entries and the rows of its ``RowState``."""

    def __init__(self, part: CachePart, state: RowState, block: int = BLOCK_TOKENS) -> None:
        if block < 1:
            raise ValueError(f"a block holds at least one position, got {block}")
        self.part, self.state, self.block = part, state, block
        self.kv = [t for t in state.tensors if t.kind == "kv"]
        self.carried = [t for t in state.tensors if t.kind != "kv"]
        self.kv_bytes = sum(t.row_bytes(block) for t in self.kv)
        self.state_bytes = sum(t.row_bytes() for t in self.carried)

    @property
    def hybrid(self) -> bool:
        """Whether its rows carry more than kv: a resume needs that state at a boundary."""
        return bool(self.carried)

    def chain(self, seed: bytes, rows: Sequence[np.ndarray], length: int) -> list[bytes]:
        """The keys of the full blocks of a ``length``-position prompt: each block's hash over
        the one before it and every per-position array of ``rows`` ([S, ...] each, position
        first) over its positions."""
        keys: list[bytes] = []
        prev = seed
        for b in range(length // self.block):
            span = slice(b * self.block, (b + 1) * self.block)
            prev = digest(prev, *(np.ascontiguousarray(r[span]).tobytes() for r in rows))
            keys.append(prev)
        return keys

    def match(self, keys: Sequence[bytes], length: int, outputs: Sequence[str] = ()) -> Match:
        """The blocks a ``length``-position prompt resumes after: at most all but its last
        position's (the prefill computes at least one, whose logits it draws from), each with
        its kv and, for ``outputs``, its per-position outputs; a hybrid model's last one also
        with its state."""
        usable = min(len(keys), (length - 1) // self.block)
        part, known = self.part, 0
        while known < usable and part.cache.has(part.key("kv", keys[known])) and all(
            part.cache.has(part.key("out", name, keys[known])) for name in outputs
        ):
            known += 1
        blocks = known
        if self.hybrid:
            while blocks and not part.cache.has(part.key("state", keys[blocks - 1])):
                blocks -= 1
        return Match(blocks, known)

    def restore(self, row: int, keys: Sequence[bytes], outputs: Sequence[str] = ()
                ) -> dict[str, list[np.ndarray]] | None:  # fmt: skip
        """Copy these blocks (a Match's) into ``row``: their kv at their positions and, for a
        hybrid model, the state at the last one's end; their outputs, per name, as host arrays.
        None when an entry was evicted since the match (the row is then as it was: prefill it
        all)."""
        part, memory = self.part, self.state.buffers
        kvs = [part.get("kv", k) for k in keys]
        saved = part.get("state", keys[-1]) if self.hybrid and keys else None
        outs = {n: [part.get("out", n, k) for k in keys] for n in outputs}
        if any(v is None for v in kvs) or (self.hybrid and keys and saved is None) or any(
            v is None for vs in outs.values() for v in vs
        ):
            return None
        for i, blocks in enumerate(kvs):
            for t in self.kv:
                dst = memory.rows(self.state.arrays[t.name], 1, row)
                memory.copy_positions(dst, blocks[t.name], _axis(t), self.block,
                                      dst_start=i * self.block)  # fmt: skip
        if saved is not None:
            for t in self.carried:
                memory.copy_into(memory.rows(self.state.arrays[t.name], 1, row), saved[t.name])
        part.cache.touch(part.key("kv", k) for k in reversed(keys))  # the chain's tail goes first
        return outs

    def publish(self, row: int, keys: Sequence[bytes], length: int) -> None:
        """Publish the kv of the full blocks among a prompt's first ``length`` positions in
        ``row`` (those not there yet)."""
        part, memory = self.part, self.state.buffers
        for i, key in enumerate(keys[: length // self.block]):
            if part.cache.has(part.key("kv", key)):
                continue
            blocks: dict[str, Array] = {}
            for t in self.kv:
                src = memory.rows(self.state.arrays[t.name], 1, row)
                dst = memory.zeros((1, *t.row_shape(self.block)), np.dtype(t.dtype))
                memory.copy_positions(dst, src, _axis(t), self.block, src_start=i * self.block)
                blocks[t.name] = dst
            part.put(blocks, self.kv_bytes, "kv", key)
        part.cache.touch(part.key("kv", k) for k in reversed(keys))

    def publish_state(self, row: int, key: bytes) -> None:
        """The row's carried state now (at the end of block ``key``), published."""
        if not self.hybrid or self.part.cache.has(self.part.key("state", key)):
            return
        memory = self.state.buffers
        saved = {t.name: memory.copy(memory.rows(self.state.arrays[t.name], 1, row))
                 for t in self.carried}  # fmt: skip
        self.part.put(saved, self.state_bytes, "state", key)

    def publish_outputs(self, name: str, keys: Sequence[bytes], rows: np.ndarray, first: int) -> None:
        """Per-position outputs ``rows`` [n, ...] of positions first.. (host arrays) for the
        full blocks they cover."""
        b = self.block
        for i in range(-(-first // b), (first + len(rows)) // b):
            if i >= len(keys):
                break
            chunk = np.array(rows[i * b - first : (i + 1) * b - first])
            self.part.put(chunk, chunk.nbytes, "out", name, keys[i])


def _axis(t: Any) -> int:
    """A kv tensor's positions axis in a one-row array (the row axis first)."""
    return int(t.capacity_axis) + 1


def build_identity(folder: Any, config: Mapping[str, Any]) -> str:
    """What tells one build of a stage from another: its config and its engine file's size and
    modification time (an engine rebuilt in place gets entries of its own)."""
    import json
    from pathlib import Path

    stamp = ""
    if folder is not None and config.get("engine"):
        with contextlib.suppress(OSError):
            st = (Path(folder) / str(config["engine"])).stat()
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
    return digest(json.dumps(config, sort_keys=True, default=str), stamp).hex()


def seed_of(part: CachePart, salt: str | None, *shared: np.ndarray | bytes) -> bytes:
    """A row's chain seed: the stage's, the request's key, what the call feeds the whole row."""
    raw = [x if isinstance(x, bytes) else np.ascontiguousarray(x).tobytes() for x in shared]
    return digest(part.seed, salt or "", *raw)


def row_arrays(feeds: Mapping[str, np.ndarray], axes: Mapping[str, int], row: int
               ) -> list[np.ndarray] | None:  # fmt: skip
    """One row's per-position arrays of a prefill's feeds, position first (``axes``: each
    feed's row axis, its positions the next); None when a feed's axis is not known."""
    out = []
    for name in sorted(feeds):
        if name not in axes:
            return None
        a = axes[name]
        x = np.take(feeds[name], row, axis=a)
        out.append(np.moveaxis(x, a, 0))
    return out
