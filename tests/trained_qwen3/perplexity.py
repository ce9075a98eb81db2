"""Held-out perplexity of the trained tiny Qwen3 (``ckpt/``) and Qwen3.5
(``../trained_qwen35/ckpt``), measured through a built engine.

Why: int4 weight quantization (issue 32) can only be judged on a model that has learned
something, and only through what edgeomni actually runs. ``engine_perplexity`` drives the
engine with the runtime's own pieces (open_engine, RowState, DecoderSession: no torch), and
``torch_perplexity`` scores the same windows with transformers, so the fp32 engine's agreement
with it (tests/test_trained_qwen3.py) shows the harness is right, and a quantized engine's
numbers can then be read against the fp32 engine's.

Teacher forcing: an engine returns logits at one position per row (``last_indices``), so each
window is fed one token per call (cache length t, position t), always the true token, and the
logits of call t score token t + 1. Windows are consecutive and non-overlapping, ``window``
tokens each (a trailing partial window is dropped); each row of a call is one window, so a
window's first token is context only and ``window - 1`` tokens are scored per window. Before
each batch of windows the rows' state is reset (RowState.reset_rows): a recurrent or convolution
state (Qwen3.5's DeltaNet layers) carries everything the row saw, so a window scored in a row
an earlier window used would start from that window's state; a KV row needs no reset.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
CKPT = HERE / "ckpt"  # the trained Qwen3 (train.py writes it)
CKPT_QWEN3_5 = HERE.parent / "trained_qwen35" / "ckpt"  # train.py --model qwen3_5, same corpus
HELDOUT = HERE / "heldout.txt"  # text from documents the model was not trained on

# what the tests score, in seconds on two cores: 16 windows of 128 held-out tokens (2032 scored),
# 8 windows a call, through an engine built for exactly that
WINDOW = 128
N_WINDOWS = 16
BATCH = 8
BUILD = dict(max_batch_size=BATCH, max_input_len=WINDOW, max_kv_cache_capacity=WINDOW)


@dataclass(frozen=True)
class Baseline:
    """The fp32 engine's run, once per session (tests/conftest.py's ``trained_qwen3`` and
    ``trained_qwen35``): what an int4 engine's perplexity, greedy tokens and log-probs
    (``scores["logprobs"]``) are read against."""

    ckpt: Path
    engine_dir: Path  # built with BUILD, float32
    ids: list[int]  # heldout_ids(N_WINDOWS, WINDOW)
    scores: dict[str, Any]  # engine_perplexity(engine_dir, ids, WINDOW, BATCH, keep_logprobs)


def heldout_ids(
    n_windows: int | None = None, window: int = WINDOW, ckpt: Path = CKPT, text: Path = HELDOUT
) -> list[int]:
    """The held-out text as the checkpoint's tokenizer reads it (no special tokens). With
    ``n_windows``: that many windows of ``window`` tokens, spread evenly over the whole text and
    concatenated (so ``windows`` cuts them back apart), so a short run sees every held-out
    document, not the first one only."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    ids = tok.encode(text.read_text(encoding="utf-8"), add_special_tokens=False).ids
    if n_windows is None:
        return ids
    cut = windows(ids, window)
    if n_windows > len(cut):
        raise ValueError(f"the held-out text has {len(cut)} windows of {window}, not {n_windows}")
    picked = np.linspace(0, len(cut) - 1, n_windows).round().astype(int)
    return cut[picked].reshape(-1).tolist()


def windows(text_ids: Sequence[int], window: int) -> np.ndarray:
    """[n, window] int64: the ids cut into consecutive full windows (the tail dropped)."""
    if window < 2:
        raise ValueError(f"a window scores window - 1 tokens; {window} is too short")
    n = len(text_ids) // window
    if n == 0:
        raise ValueError(f"{len(text_ids)} tokens make no window of {window}")
    return np.asarray(text_ids[: n * window], np.int64).reshape(n, window)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """In float64, so both paths' scores differ only by their logits."""
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _result(
    groups: list[np.ndarray],
    logits_of: Callable[[int], np.ndarray],
    targets: np.ndarray,
    keep_logprobs: bool,
) -> dict[str, Any]:
    """Scores from ``logits_of(i)``: the [rows, window - 1, V] float32 logits of batch i, whose
    rows are windows ``groups[i]``; ``targets`` [windows, window - 1]: the tokens scored."""
    n, scored = targets.shape
    token_nll = np.zeros((n, scored), np.float64)
    greedy = np.zeros((n, scored), np.int64)
    logprobs: np.ndarray | None = None
    for i, which in enumerate(groups):
        lp = _log_softmax(logits_of(i))
        token_nll[which] = -np.take_along_axis(lp, targets[which][..., None], axis=-1)[..., 0]
        greedy[which] = lp.argmax(axis=-1)
        if keep_logprobs:
            if logprobs is None:
                logprobs = np.zeros((n, scored, lp.shape[-1]), np.float32)
            logprobs[which] = lp
    nll = float(token_nll.mean())
    out: dict[str, Any] = {
        "nll": nll,
        "ppl": float(np.exp(nll)),
        "tokens": int(token_nll.size),
        "windows": n,
        "window": scored + 1,
        "token_nll": token_nll,
        "greedy": greedy,
    }
    if keep_logprobs:
        out["logprobs"] = logprobs
    return out


def engine_perplexity(
    engine_dir: Path,
    text_ids: Sequence[int],
    window: int = 128,
    batch: int = 8,
    *,
    threads: int | None = None,
    keep_logprobs: bool = False,
) -> dict[str, Any]:
    """Teacher-forced scores of ``text_ids`` through the decoder engine in ``engine_dir``
    (``llm.onnx`` and its config.json, embedding.safetensors, as edge-build wrote them).

    Returns ``nll`` (mean, nats), ``ppl`` (exp of it), ``tokens`` scored, ``windows``,
    ``window``, ``token_nll`` [windows, window - 1] float64, ``greedy`` (argmax next token at
    every scored position, same shape) and, with ``keep_logprobs``, ``logprobs``
    [windows, window - 1, V] float32 (for KL divergences between engines). ``batch`` windows
    run as rows of one call (capped at the build's max batch)."""
    from edgeomni.runtime import safetensors_np
    from edgeomni.runtime.decoder import DecoderSession, text_positions
    from edgeomni.runtime.engine import open_engine
    from edgeomni.runtime.row_state import RowState

    engine_dir = Path(engine_dir)
    cfg = json.loads((engine_dir / "config.json").read_text(encoding="utf-8"))
    limits = cfg["builder_config"]
    capacity = int(limits["max_kv_cache_capacity"])
    if window > capacity:
        raise ValueError(f"window {window} exceeds the engine's KV capacity {capacity}")
    wins = windows(text_ids, window)
    rows_max = max(1, min(batch, int(limits["max_batch_size"])))
    engine = open_engine(engine_dir, cfg, threads=threads)
    embedding = safetensors_np.load(engine_dir / "embedding.safetensors")["embedding"]
    mrope = bool(cfg.get("mrope_section"))
    vocab = int(cfg["vocab_size"])
    state = RowState.for_engine(cfg, rows_max, engine, capacity)
    groups = [np.arange(s, min(s + rows_max, len(wins))) for s in range(0, len(wins), rows_max)]

    def logits_of(i: int) -> np.ndarray:
        ids = wins[groups[i]]
        rows = len(ids)
        # a fresh session binds rows 0..rows-1: what earlier windows left in a KV row lies past
        # its cache length, which attention never reads, but a recurrent or conv row holds it
        state.reset_rows(0, rows)
        session = DecoderSession(engine, state, rows, {"logits": (vocab,)})
        ones, last = np.ones(rows, np.int32), np.zeros(rows, np.int64)
        out = np.zeros((rows, window - 1, vocab), np.float32)
        for t in range(window - 1):
            past = np.full(rows, t, np.int32)
            step = session.run(
                embedding[ids[:, t]][:, None, :], text_positions(past, 1, mrope), past, ones, last
            )
            out[:, t] = np.asarray(step["logits"], np.float32)  # the next call overwrites it
        return out

    return _result(groups, logits_of, wins[:, 1:], keep_logprobs)


def torch_perplexity(
    model: Any,
    text_ids: Sequence[int],
    window: int = 128,
    batch: int = 8,
    *,
    keep_logprobs: bool = False,
) -> dict[str, Any]:
    """The same scores from transformers (the reference): ``model`` a causal LM module
    (Qwen3ForCausalLM, Qwen3_5ForCausalLM) or a checkpoint dir (AutoModelForCausalLM), run in
    float32 over whole windows."""
    import torch

    if not isinstance(model, torch.nn.Module):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(Path(model), dtype=torch.float32)
    model = model.eval()
    wins = windows(text_ids, window)
    groups = [np.arange(s, min(s + batch, len(wins))) for s in range(0, len(wins), batch)]

    def logits_of(i: int) -> np.ndarray:
        with torch.no_grad():
            logits = model(input_ids=torch.from_numpy(wins[groups[i]])).logits
        return logits[:, :-1].float().numpy()

    return _result(groups, logits_of, wins[:, 1:], keep_logprobs)


def against(baseline: Baseline, engine_dir: Path, name: str = "") -> dict[str, Any]:
    """A quantized engine's held-out scores (built with BUILD) read against the fp32 engine's:
    ``ratio`` of perplexities, greedy ``agreement``, mean ``kl`` from the fp32 engine, and
    ``record``, its config.json quantization record; with a ``name``, one line printed
    (pytest -s shows it)."""
    s = engine_perplexity(engine_dir, baseline.ids, WINDOW, BATCH, keep_logprobs=True)
    s["record"] = json.loads((Path(engine_dir) / "config.json").read_text())["quantization"]
    base = baseline.scores
    s["ratio"] = s["ppl"] / base["ppl"]
    s["agreement"] = greedy_agreement(s, base)
    s["kl"] = mean_kl(base, s)
    if name:
        print(f"{name}: ppl {s['ppl']:.3f} vs fp32 {base['ppl']:.3f} "
              f"({100 * (s['ratio'] - 1):+.2f}%), greedy agreement {s['agreement']:.3f}, "
              f"KL {s['kl']:.4f}")  # fmt: skip
    return s


def unigram_nll(
    train_ids: Sequence[int], text_ids: Sequence[int], window: int, vocab: int
) -> float:
    """The baseline a trained model must beat: mean NLL of the scored tokens (each window's
    tokens after its first) under add-one-smoothed token frequencies of the training text."""
    counts = np.bincount(np.asarray(train_ids, np.int64), minlength=vocab).astype(np.float64) + 1
    logp = np.log(counts / counts.sum())
    return float(-logp[windows(text_ids, window)[:, 1:]].mean())


def greedy_agreement(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The fraction of scored positions where two runs' argmax next tokens agree."""
    return float((a["greedy"] == b["greedy"]).mean())


def mean_kl(p: dict[str, Any], q: dict[str, Any]) -> float:
    """Mean KL(p || q) in nats per scored position, from two runs kept with ``keep_logprobs``
    (p the reference): how far a quantized engine's next-token distribution moved."""
    lp, lq = p["logprobs"].astype(np.float64), q["logprobs"].astype(np.float64)
    return float((np.exp(lp) * (lp - lq)).sum(axis=-1).mean())
