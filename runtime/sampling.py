"""Token sampling as plain numpy functions.

The semantics follow Hugging Face's logits processors (repetition penalty, then temperature,
top-k and top-p), so a request sampled here draws from the same token set as the reference
``generate()`` it is compared against. Only the standard library and numpy are used: this runs
on the embedded board next to ONNX Runtime.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_SAMPLING",
    "SAMPLING_KEYS",
    "SamplingParams",
    "apply_repetition_penalty",
    "candidate_distribution",
    "log_softmax_top",
    "StepLogits",
    "sample",
    "sample_rows",
    "sample_step",
    "sampling_from_dict",
]

# Accepted key names; "sampling_seed" is llm_inference's spelling of "seed".
SAMPLING_KEYS: tuple[str, ...] = (
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "seed",
    "sampling_seed",
)
_SEED_ALIASES = ("seed", "sampling_seed")

# Top-p without top-k grows its candidate set from this many tokens instead of sorting the vocab.
_TOP_P_FIRST_GUESS = 256


# each setting: the types it takes, the range it must lie in, and what an error says of each
_RULES: dict[str, tuple[type | tuple[type, ...], Callable[[Any], bool], str, str]] = {
    "temperature": ((int, float), lambda v: math.isfinite(v) and v >= 0, "a number",
                    "a finite number >= 0"),
    "top_k": (int, lambda v: v >= 0, "an integer (0 turns top-k off)", ">= 0 (0 turns top-k off)"),
    "top_p": ((int, float), lambda v: 0.0 < v <= 1.0, "a number", "in (0, 1]"),
    "repetition_penalty": ((int, float), lambda v: math.isfinite(v) and v > 0, "a number",
                           "a finite number > 0"),
    "seed": (int, lambda v: v >= 0, "an integer >= 0 or null", "an integer >= 0 or null"),
}  # fmt: skip


def _check(name: str, key: str, value: Any) -> Any:
    """Validate one sampling value; ``key`` is the name the user wrote (used in messages)."""
    if name not in _RULES:
        raise ValueError(f"unknown sampling key {key!r}; accepted: {', '.join(SAMPLING_KEYS)}")
    if name == "seed" and value is None:
        return None
    types, inside, kind, bounds = _RULES[name]
    if isinstance(value, bool) or not isinstance(value, types):
        raise ValueError(f"{key} must be {kind}, got {value!r}")
    if not inside(value):
        raise ValueError(f"{key} must be {bounds}, got {value!r}")
    return int(value) if types is int else float(value)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one request; defaults are llm_inference's.

    Frozen and hashable, so cohorts can group requests by equal settings.
    """

    temperature: float = 1.0
    top_k: int = 50  # 0 = off
    top_p: float = 0.8
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        # Catch bad values at construction too, not only when read from a file.
        for name in ("temperature", "top_k", "top_p", "repetition_penalty", "seed"):
            object.__setattr__(self, name, _check(name, name, getattr(self, name)))

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to argmax (temperature 0 or top-k 1)."""
        return self.temperature == 0 or self.top_k == 1


DEFAULT_SAMPLING = SamplingParams()


def sampling_from_dict(
    d: Mapping[str, Any], base: SamplingParams = DEFAULT_SAMPLING, *, prefix: str = ""
) -> SamplingParams:
    """Override ``base`` with the keys ``prefix + name`` present in ``d``.

    Other keys are ignored here; the request parser decides which keys are unknown. The
    prefix lets the talker's settings (``talker_temperature``...) share this code.
    """
    values: dict[str, Any] = {}
    for name in ("temperature", "top_k", "top_p", "repetition_penalty"):
        key = prefix + name
        if key in d:
            values[name] = _check(name, key, d[key])
    seeds = {prefix + a: d[prefix + a] for a in _SEED_ALIASES if prefix + a in d}
    if seeds:
        checked = {k: _check("seed", k, v) for k, v in seeds.items()}
        if len(set(checked.values())) > 1:
            raise ValueError(f"{' and '.join(checked)} disagree: {checked}")
        values["seed"] = next(iter(checked.values()))
    if not values:
        return base
    return replace(base, **values)


def apply_repetition_penalty(
    logits: np.ndarray, seen: Sequence[np.ndarray], penalty: float
) -> None:
    """Penalise, in place, every token already seen in each row (HF's repetition penalty).

    A logit below 0 is multiplied by ``penalty``, any other is divided, once per distinct id;
    ids at or beyond the vocabulary size are skipped, as Hugging Face does.
    """
    if logits.ndim != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {logits.shape}")
    if len(seen) != logits.shape[0]:
        raise ValueError(f"seen has {len(seen)} rows, logits has {logits.shape[0]}")
    if penalty == 1.0:
        return
    vocab = logits.shape[1]
    for b, ids in enumerate(seen):
        ids = np.unique(np.asarray(ids, dtype=np.int64).reshape(-1))
        if ids.size and ids[0] < 0:
            raise ValueError(f"seen[{b}] holds a negative token id {int(ids[0])}")
        ids = ids[ids < vocab]
        if not ids.size:
            continue
        row = logits[b]
        vals = row[ids]
        row[ids] = np.where(vals < 0, vals * penalty, vals / penalty)


def _softmax_over(z: np.ndarray, temperature: float) -> np.ndarray:
    """Unnormalised exp((z - max) / T) in float64, for numerical headroom."""
    z = z.astype(np.float64) / temperature
    z -= z.max()
    return np.exp(z)


def _canonical(ids: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The order a draw walks candidates in: the highest logit first, and the lower id first
    among equal logits. Fixed by the logits alone, so an engine that samples in its graph
    (export/common/sampler.py) walks them in the same order as this module."""
    return np.lexsort((ids, -x))


def _top_p_kept(probs: np.ndarray, top_p: float) -> Any:
    """How many of the ordered candidates top-p keeps: each one whose preceding mass is below
    ``top_p``. This is HF's TopPLogitsWarper (drop the tokens whose ascending cumulative mass is
    at most 1 - p) read from the other end; the mass outside the candidates, all of it smaller,
    comes after them and changes nothing."""
    before = np.cumsum(probs, axis=-1) - probs  # as the engine's sampler computes it
    return np.count_nonzero(before < top_p, axis=-1)


def candidate_distribution(
    logits: np.ndarray, params: SamplingParams
) -> tuple[np.ndarray, np.ndarray]:
    """Token ids a draw can return for one row of logits [V], in the order the draw walks them,
    and their probabilities.

    Applies temperature, top-k (ties with the k-th logit stay, as in HF) and top-p. The
    repetition penalty is the caller's (``sample`` applies it first). Top-k selects with
    ``argpartition``, so only the k candidates are sorted, never the whole vocabulary; top-p
    alone grows a partitioned candidate set until the mass outside it is already dropped.
    Candidates come highest logit first (lower id first among equals), except with neither
    top-k nor top-p, where every id is a candidate, in id order. Probabilities are float64,
    renormalised over the returned ids.
    """
    x = np.asarray(logits)
    if x.ndim != 1:
        raise ValueError(f"expected one row of logits [vocab], got shape {x.shape}")
    vocab = x.shape[0]
    if params.greedy:
        return np.array([int(np.argmax(x))], dtype=np.int64), np.ones(1)
    k = params.top_k
    if 0 < k < vocab:
        top = np.argpartition(x, vocab - k)[vocab - k :]
        ids = np.flatnonzero(x >= x[top].min()).astype(np.int64)
        ids = ids[_canonical(ids, x[ids])]
        probs = _softmax_over(x[ids], params.temperature)
        probs /= probs.sum()
    else:
        weights = _softmax_over(x, params.temperature)
        total = weights.sum()
        if params.top_p >= 1.0:
            return np.arange(vocab, dtype=np.int64), weights / total
        m = min(vocab, _TOP_P_FIRST_GUESS)
        while True:
            if m >= vocab:
                ids = np.arange(vocab, dtype=np.int64)
                break
            ids = np.argpartition(weights, vocab - m)[vocab - m :].astype(np.int64)
            rest = max(0.0, (total - weights[ids].sum()) / total)
            # Everything outside has cumulative mass <= rest; if that is dropped, stop.
            if rest <= 1.0 - params.top_p:
                break
            m *= 4
        ids = ids[_canonical(ids, x[ids])]
        probs = weights[ids] / total
    if params.top_p < 1.0:
        kept = int(_top_p_kept(probs, params.top_p))
        ids, probs = ids[:kept], probs[:kept]
    return ids, probs / probs.sum()


def _draw(probs: np.ndarray, uniform: float) -> int:
    """The index one draw from ``probs`` (normalised or not) picks, for ``uniform`` (one
    ``rng.random()``)."""
    cdf = np.cumsum(probs)
    return min(int(np.searchsorted(cdf, uniform * cdf[-1], side="right")), cdf.size - 1)


def sample(
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
    seen: Sequence[np.ndarray] | None = None,
) -> np.ndarray:
    """Pick one token per row: logits [B, V] -> int64 ids [B].

    ``seen[b]`` is row b's prompt plus generated ids, for the repetition penalty (which also
    applies to greedy decoding, as in HF). The caller's logits are never modified. Each
    sampled row consumes exactly one ``rng.random()`` so a seed reproduces a whole run.
    """
    x = np.asarray(logits)
    if x.ndim != 2:
        raise ValueError(f"logits must be [batch, vocab], got shape {x.shape}")
    if seen is not None and params.repetition_penalty != 1.0:
        x = np.array(x, copy=True)
        apply_repetition_penalty(x, seen, params.repetition_penalty)
    if params.greedy:
        return np.argmax(x, axis=-1).astype(np.int64)
    out = np.empty(x.shape[0], dtype=np.int64)
    for b in range(x.shape[0]):
        ids, probs = candidate_distribution(x[b], params)
        out[b] = ids[_draw(probs, rng.random())]
    return out


@dataclass(frozen=True)
class StepLogits:
    """One decode step's logits as the engine left them.

    ``topk_values``/``topk_indices`` [B, K]: the engine's own top-K of each row (an in-graph
    reduction, so the full vocabulary need not leave the device), or None. ``full(rows)`` copies
    the full logits of those rows [len(rows), V] to the host: only for rows the top-K cannot
    decide exactly.
    """

    rows: int
    full: Any  # Callable[[np.ndarray], np.ndarray]
    topk_values: np.ndarray | None = None
    topk_indices: np.ndarray | None = None


def _topk_scores(
    step: StepLogits,
    params: SamplingParams,
    seen: Sequence[np.ndarray] | None,
    banned: Sequence[np.ndarray | None] | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The engine's top-K after the bans and the penalty: scores [B, K] (float32), their ids,
    each row's k-th best score and whether the top-K decides the row's draw exactly; None
    without a top-K or with a top-k it cannot hold.

    Every token outside the K is at most the K-th value (the floor), or was kept out of the
    top-K by the engine and is in ``banned`` (the talker's control band); the penalty and bans
    only lower scores. So the draw is exact when the k-th best score after them is above the
    floor: no outside token can enter the top-k or tie with it.
    """
    values, indices = step.topk_values, step.topk_indices
    if values is None or indices is None:
        return None
    width = values.shape[1]
    k = 1 if params.greedy else params.top_k
    if not 0 < k < width:
        return None
    x = np.asarray(values).astype(np.float32)
    floor = x.min(axis=1)
    ids = np.asarray(indices).astype(np.int64)
    _ban_and_penalise(x, ids, params, seen, banned)
    kth = np.partition(x, width - k, axis=1)[:, width - k]
    return x, ids, kth, kth > floor


def _ban_and_penalise(
    x: np.ndarray,
    ids: np.ndarray,
    params: SamplingParams,
    seen: Sequence[np.ndarray] | None,
    banned: Sequence[np.ndarray | None] | None,
) -> None:
    """The bans and penalty on every row of a top-K at once, in place: one ``isin`` per
    distinct ban list (a cohort shares one or two), and the seen ids of all rows as one
    table; float32 arithmetic, elementwise (a row's result is the one it gets alone)."""
    if banned is not None:
        for rows, ban in _ban_groups(banned):
            hit = np.isin(ids[rows], ban)
            x[rows] = np.where(hit, np.float32(-np.inf), x[rows])
    if seen is None or params.repetition_penalty == 1.0:
        return
    hit = np.take_along_axis(_seen_table(seen, int(ids.max()) + 1), ids, axis=1)
    pen = params.repetition_penalty
    x[hit] = np.where(x[hit] < 0, x[hit] * pen, x[hit] / pen)


def _ban_groups(banned: Sequence[np.ndarray | None]) -> list[tuple[list[int], np.ndarray]]:
    """The rows of each distinct ban list (by identity: a cohort shares one or two), and it."""
    groups: dict[int, list[int]] = {}
    for b, ban in enumerate(banned):
        if ban is not None and ban.size:
            groups.setdefault(id(ban), []).append(b)
    return [(rows, banned[rows[0]]) for rows in groups.values()]  # type: ignore[misc]


def _seen_table(seen: Sequence[np.ndarray], width: int) -> np.ndarray:
    """[rows, width] bool: each row's seen ids below ``width``, every row's at once."""
    table = np.zeros((len(seen), width), bool)
    flat = [np.asarray(row, np.int64).reshape(-1) for row in seen]
    cols = np.concatenate(flat) if flat else np.zeros(0, np.int64)
    rows = np.repeat(np.arange(len(flat)), [len(row) for row in flat])
    inside = (cols >= 0) & (cols < width)
    table[rows[inside], cols[inside]] = True
    return table


def draw_marks(
    vocab: int, seen: Sequence[np.ndarray] | None, banned: Sequence[np.ndarray | None]
) -> np.ndarray:
    """What ``_ban_and_penalise`` does to a row, as a device's draw takes it
    (plugins/speech_draw_cuda.py's ``marks`` [rows, vocab] uint8): SEEN where a row drew an id
    before (``seen`` None: the penalty is off), BANNED where it may not draw it now (a ban
    outranks a penalty, as -inf stays -inf under it)."""
    from edgeomni.plugins.speech_draw_cuda import BANNED, SEEN

    marks = np.zeros((len(banned), vocab), np.uint8)
    if seen is not None:
        marks[_seen_table(seen, vocab)] = SEEN
    for rows, ban in _ban_groups(banned):
        marks[np.ix_(rows, np.asarray(ban, np.int64))] = BANNED
    return marks


def _sample_topk_rows(
    step: StepLogits,
    params: SamplingParams,
    rng: Any,
    seen: Sequence[np.ndarray] | None = None,
    banned: Sequence[np.ndarray | None] | None = None,
) -> np.ndarray | None:
    """``sample_step`` for a whole batch at once when the engine's top-K decides every row (the
    code predictor's steps, the talker's with its penalty and bans, greedy decoding), or None
    (nothing drawn) when it does not. Rows with as many candidates (k, or more when tied at the
    k-th value) are worked together; the draws then go row by row, in order. The arithmetic is
    the per-row path's, row for row: elementwise float32 for bans and penalty, a reduction along
    a row's own axis, a sort and a cumulative sum give the same bits as on that row alone, so
    the draws equal ``sample``'s (tests/test_sampling_step.py)."""
    scored = _topk_scores(step, params, seen, banned)
    if scored is None or not scored[3].all():  # a row the K cannot decide
        return None
    x, ids, kth, _ = scored
    n = len(x)
    order = np.lexsort((ids, -x), axis=-1)  # _canonical, row by row
    x, ids = np.take_along_axis(x, order, axis=1), np.take_along_axis(ids, order, axis=1)
    if params.greedy:  # the best, the lowest id among equals: argmax over the full row's order
        return ids[:, 0]
    count = (x >= kth[:, None]).sum(axis=1)  # the candidates: a prefix of each sorted row
    # one number a row, in row order: the numbers n calls of _draw take from the generator
    uniform = _uniforms(rng, n)
    pos = np.empty(n, np.int64)
    for c in np.unique(count):
        rows = np.flatnonzero(count == c)
        z = x[rows, :c].astype(np.float64) / params.temperature
        z -= z.max(axis=1, keepdims=True)
        probs = np.exp(z)
        probs /= probs.sum(axis=1, keepdims=True)
        if params.top_p < 1.0:  # rows keep different numbers: _draw's arithmetic, row by row
            m = _top_p_kept(probs, params.top_p)
            for j, b in enumerate(rows):
                kept = probs[j, : m[j]]
                pos[b] = _draw(kept / kept.sum(), uniform[b])
            continue
        # every row keeps its c candidates (the talker's case): drawn together, a row's sum,
        # cumulative sum and count along its own contiguous axis giving the bits it gives alone
        cdf = np.cumsum(probs / probs.sum(axis=1, keepdims=True), axis=1)
        point = uniform[rows] * cdf[:, -1]
        below = (cdf <= point[:, None]).sum(axis=1)  # searchsorted(..., side="right")
        pos[rows] = np.minimum(below, c - 1)
    return ids[np.arange(n), pos]


Rng = np.random.Generator | Sequence[np.random.Generator]


def _uniforms(rng: Rng, n: int) -> np.ndarray:
    """One number a row, in row order: from one generator shared by the rows, or from each
    row's own."""
    if isinstance(rng, (list, tuple)):
        return np.array([r.random() for r in rng], np.float64)
    return rng.random(n)  # type: ignore[union-attr]


def _row_rng(rng: Rng, b: int) -> np.random.Generator:
    return rng[b] if isinstance(rng, (list, tuple)) else rng  # type: ignore[return-value]


def sample_step(
    step: StepLogits,
    params: SamplingParams,
    rng: Rng,
    seen: Sequence[np.ndarray] | None = None,
    banned: Sequence[np.ndarray | None] | None = None,
    bias: Sequence[tuple[np.ndarray, np.ndarray] | None] | None = None,
) -> tuple[np.ndarray, int]:
    """``sample`` over a step's logits, from the engine's top-K where that is exact.

    ``banned[b]``: ids row b may not draw now (end of sequence before a minimum length, a
    suppressed band). ``bias[b]``: (ids, values) added to row b's logits first, as Hugging
    Face's ``sequence_bias`` processor does before the repetition penalty (a biased row reads
    its full logits: a raised token may come from outside the top-K). Returns the ids [B] and
    how many rows needed their full logits. The draws, and the rng they consume, are those
    ``sample`` makes on the full logits (plus the bias). ``rng``: one generator the rows
    draw from in row order, or each row's own (a request's draws then depend on its seed
    alone, whatever rows sit beside it).
    """
    n = step.rows
    penalise = seen is not None and params.repetition_penalty != 1.0
    biased = [bias is not None and bias[b] is not None for b in range(n)]
    if n > 1 and not any(biased):  # one row: the per-row path is as fast
        fast = _sample_topk_rows(step, params, rng, seen if penalise else None, banned)
        if fast is not None:
            return fast, 0
    # each row's (ids, scores): the candidates of a row the top-K decides, sorted by id; the
    # full logits of the others (ids None: a score's position is its id)
    picked: list[tuple[np.ndarray | None, np.ndarray] | None] = [None] * n
    scored = _topk_scores(step, params, seen if penalise else None, banned)
    if scored is not None:
        scores, top_ids, _, decided = scored
        for b in np.flatnonzero(decided):
            if not biased[b]:
                order = np.argsort(top_ids[b], kind="stable")
                picked[b] = top_ids[b][order], scores[b][order]
    need = np.array([b for b in range(n) if picked[b] is None], np.int64)
    if need.size:
        full = np.array(step.full(need), np.float32)
        for j, b in enumerate(need):
            if biased[b]:
                ids, values = bias[b]  # type: ignore[index, misc]
                full[j, ids] += values
            if banned is not None and banned[b] is not None and banned[b].size:
                full[j, banned[b]] = -np.inf
        if penalise and seen is not None:
            apply_repetition_penalty(full, [seen[b] for b in need], params.repetition_penalty)
        for j, b in enumerate(need):
            picked[b] = None, full[j]
    out = np.empty(n, np.int64)
    for b, (ids, x) in enumerate(picked):
        if params.greedy:
            pos = int(np.argmax(x))
        else:
            cand, probs = candidate_distribution(x, params)
            pos = int(cand[_draw(probs, _row_rng(rng, b).random())])
        out[b] = pos if ids is None else ids[pos]
    return out, int(need.size)


def log_softmax_top(logits: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` most likely tokens of each row of logits [B, V] and their log-probabilities
    log(softmax(logits)) at temperature 1 (OpenAI's logprobs), highest first (the lower id
    first among equals): ids int64 [B, n] and float64 [B, n]."""
    x = np.asarray(logits, np.float64)
    top = x.max(axis=-1, keepdims=True)
    lse = top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True))
    n = min(n, x.shape[-1])
    part = np.argpartition(-x, n - 1, axis=-1)[:, :n]
    vals = np.take_along_axis(x, part, axis=-1)
    order = np.lexsort((part, -vals), axis=-1)
    ids = np.take_along_axis(part, order, axis=-1).astype(np.int64)
    return ids, np.take_along_axis(vals, order, axis=-1) - lse


def sample_rows(
    step: StepLogits,
    params: Sequence[SamplingParams],
    rngs: Sequence[np.random.Generator],
    seen: Sequence[np.ndarray] | None = None,
    banned: Sequence[np.ndarray | None] | None = None,
    bias: Sequence[tuple[np.ndarray, np.ndarray] | None] | None = None,
) -> tuple[np.ndarray, int]:
    """``sample_step`` for rows that each have their own settings and generator: rows with
    equal settings are drawn together. Returns the ids [B] and the full-logit row count."""
    n = step.rows
    groups: dict[SamplingParams, list[int]] = {}
    for b in range(n):
        groups.setdefault(params[b], []).append(b)
    if len(groups) == 1:
        return sample_step(step, params[0], list(rngs), seen, banned, bias)
    out = np.empty(n, np.int64)
    fetched = 0
    for p, rows in groups.items():
        idx = np.array(rows, np.int64)

        def full(r: np.ndarray, idx: np.ndarray = idx) -> np.ndarray:
            return step.full(idx[np.asarray(r, np.int64)])

        sub = StepLogits(
            len(rows), full,
            None if step.topk_values is None else step.topk_values[idx],
            None if step.topk_indices is None else step.topk_indices[idx],
        )  # fmt: skip
        ids, k = sample_step(sub, p, [rngs[b] for b in rows], _pick(seen, rows),
                             _pick(banned, rows), _pick(bias, rows))  # fmt: skip
        out[idx] = ids
        fetched += k
    return out, fetched


def _pick(values: Sequence[Any] | None, rows: Sequence[int]) -> list[Any] | None:
    return None if values is None else [values[b] for b in rows]
