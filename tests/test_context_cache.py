"""The context cache's own rules (runtime/context_cache.py), on host rows: the budget and LRU,
entries that never change, block keys that follow every input, restores that copy exactly
what was published, a hybrid model's states at boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from edgeomni.graph_schema.state import StateTensor
from edgeomni.runtime.context_cache import (
    AUTO_MB,
    ContextCache,
    PrefixCache,
    auto_budget_mb,
    seed_of,
)
from edgeomni.runtime.row_state import RowState

KV = StateTensor("k0", "kv", "past_key_0", "present_key_0", (2, "capacity", 4), "float32")
REC = StateTensor("r0", "recurrent", "past_recurrent_0", "present_recurrent_0", (3, 3), "float32")


def test_budget_evicts_least_recently_used_first() -> None:
    cache = ContextCache(300)
    assert cache.put("a", 1, 100) and cache.put("b", 2, 100) and cache.put("c", 3, 100)
    assert cache.get("a") == 1  # a is now the most recent: b goes first
    assert cache.put("d", 4, 150)
    assert not cache.has("b") and not cache.has("c") and cache.get("a") == 1
    assert cache.used == 250 and cache.evicted == 2
    assert not cache.put("huge", 0, 301), "an entry larger than the budget is not kept"
    assert cache.get("a") == 1, "and evicts nothing"


def test_an_entry_never_changes_once_published() -> None:
    cache = ContextCache(1000)
    assert cache.put("k", "first", 10)
    assert not cache.put("k", "second", 10)
    assert cache.get("k") == "first" and cache.used == 10


def test_parts_never_share_keys() -> None:
    cache = ContextCache(1000)
    one, other = cache.part("talker", "build-1"), cache.part("talker2", "build-1")
    rebuilt = ContextCache(1000).part("talker", "build-2")
    one.put("x", 1, "kv", b"key")
    assert other.get("kv", b"key") is None
    assert rebuilt.seed != one.seed, "another build of the same stage keys apart"


def test_auto_budget_is_off_on_small_machines() -> None:
    assert auto_budget_mb(8 * 2**30) == 0
    assert auto_budget_mb(32 * 2**30) == AUTO_MB
    with pytest.raises(ValueError, match=">= 0"):
        ContextCache(-1)


def _state(rows: int = 3, hybrid: bool = False) -> RowState:
    return RowState([KV, REC] if hybrid else [KV], rows, capacity=40)


def _fill(state: RowState, row: int, rng: np.random.Generator) -> None:
    for arr in state.arrays.values():
        arr[row] = rng.standard_normal(arr.shape[1:]).astype(arr.dtype)


def test_chain_keys_follow_every_input_and_the_seed() -> None:
    cache = ContextCache(1 << 20)
    prefix = PrefixCache(cache.part("llm"), _state(), block=4)
    rng = np.random.default_rng(0)
    embeds, pos = rng.standard_normal((10, 5)).astype(np.float32), np.arange(10)
    seed = seed_of(prefix.part, None)
    keys = prefix.chain(seed, [embeds, pos], 10)
    assert len(keys) == 2, "full blocks only"
    changed = embeds.copy()
    changed[5, 0] += 1e-6  # a change in the second block keeps the first's key
    again = prefix.chain(seed, [changed, pos], 10)
    assert again[0] == keys[0] and again[1] != keys[1]
    assert prefix.chain(seed, [embeds, pos + 1], 10)[0] != keys[0], "positions count"
    assert prefix.chain(seed_of(prefix.part, "tenant"), [embeds, pos], 10)[0] != keys[0]


def test_restore_copies_exactly_what_was_published() -> None:
    cache = ContextCache(1 << 20)
    state = _state()
    prefix = PrefixCache(cache.part("llm"), state, block=4)
    rng = np.random.default_rng(1)
    _fill(state, 0, rng)
    keys = [b"k1", b"k2", b"k3"]
    prefix.publish(0, keys, 11)  # 11 positions: two full blocks
    assert prefix.match(keys, 20) .blocks == 2
    assert prefix.match(keys, 9).blocks == 2 and prefix.match(keys, 8).blocks == 1, (
        "a prompt keeps at least one position to compute"
    )
    published = state.arrays["k0"][0, :, :8].copy()
    _fill(state, 0, rng)  # the row moves on: the entry does not
    found = prefix.restore(2, keys[:2])
    assert found == {}
    np.testing.assert_array_equal(state.arrays["k0"][2, :, :8], published)


def test_a_hybrid_row_resumes_only_where_a_state_was_kept() -> None:
    cache = ContextCache(1 << 20)
    state = _state(hybrid=True)
    prefix = PrefixCache(cache.part("q35"), state, block=4)
    rng = np.random.default_rng(2)
    _fill(state, 0, rng)
    keys = [b"a", b"b", b"c"]
    prefix.publish(0, keys, 12)
    m = prefix.match(keys, 13)
    assert (m.blocks, m.known) == (0, 3), "kv alone does not resume a recurrent state"
    prefix.publish_state(0, keys[1])
    saved = state.arrays["r0"][0].copy()
    m = prefix.match(keys, 13)
    assert (m.blocks, m.known) == (2, 3)
    prefix.restore(1, keys[:2])
    np.testing.assert_array_equal(state.arrays["r0"][1], saved)


def test_eviction_between_match_and_restore_restores_nothing() -> None:
    state = _state()
    cache = ContextCache(PrefixCache(ContextCache(1).part("x"), state, block=4).kv_bytes * 2)
    prefix = PrefixCache(cache.part("llm"), state, block=4)
    _fill(state, 0, np.random.default_rng(3))
    prefix.publish(0, [b"a", b"b"], 8)
    assert prefix.match([b"a", b"b"], 9).blocks == 2
    prefix.publish(0, [b"c"], 4)  # evicts the oldest: the chain's tail, "b"
    assert cache.has(prefix.part.key("kv", b"a")) and not cache.has(prefix.part.key("kv", b"b"))
    before = state.arrays["k0"][1].copy()
    assert prefix.restore(1, [b"a", b"b"]) is None
    np.testing.assert_array_equal(state.arrays["k0"][1], before)
