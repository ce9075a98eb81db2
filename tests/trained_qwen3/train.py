"""Train the tiny Qwen3 (tests/trained_qwen3/ckpt) or Qwen3.5 (tests/trained_qwen35/ckpt) on real
English text, offline (not run by CI).

Why: quantization quality (int4 weights, issue 32) cannot be seen on random weights; it needs a
model whose predictions are better than chance, small enough to commit (~4 MB) and to score in
seconds on a CPU.

    python tests/trained_qwen3/train.py --out DIR   # DIR/ckpt (the checkpoint), DIR/heldout.txt
    python tests/trained_qwen3/train.py --model qwen3_5 --steps 300 --out tests/trained_qwen35 \
        --heldout tests/trained_qwen3/heldout.txt       # the same corpus: the same held-out text

The committed files came from ``--out tests/trained_qwen3`` and the Qwen3.5 line above (CPU
torch, 2 threads, seed 0).

Corpus, built deterministically from text on a Debian machine, in this order:
  * every regular file in /usr/share/common-licenses (sorted by name; the GPL, LGPL and GFDL
    symlinks skipped): GPL-1/2/3, LGPL-2/2.1/3, GFDL-1.2/1.3, MPL-1.1/2.0, Apache-2.0,
    Artistic, BSD, CC0-1.0; free to redistribute verbatim;
  * the Python language reference prose of the standard library's ``pydoc_data.topics`` (the
    ``topics`` dict, sorted by topic; PSF license), of the Python that runs this script (the
    committed checkpoint: 3.11.7).
Paragraphs (blank-line separated) are de-duplicated across the corpus, first occurrence kept:
pydoc's topics repeat one another's sections (``compound`` holds ``if``, ``while``, ...).
Held out: the documents in HELDOUT_DOCS (whole documents, none with a near-copy in training:
Apache-2.0 has no other version among the licenses, and those topics' paragraphs are removed
from training wherever they recur), ~31 KB written to heldout.txt, which the test reads, so CI
needs nothing from /usr/share. Everything else is training text (regenerated here, not
committed; ckpt/training.json records its sha256 and size, so a different Debian release or
Python can be noticed).

Tokenizer: byte-level BPE (``tokenizers``), 1024 ids with the three specials of
edgeomni/export/tiny.py (ChatML chat template, eos <|im_end|>, pad <|endoftext|>), so
edge-build takes the checkpoint as it takes the tiny random one. Model (``--model``): Qwen3,
hidden 128, intermediate 384, 4 layers, 4 heads / 2 KV heads of 32, untied lm_head (every linear
input a multiple of 128, so int4 groups of 32/64/128 divide them), float32; or Qwen3.5 of the
same widths (three Gated DeltaNet layers, then one gated full-attention layer: the recurrent
state a quantized engine must carry, issue 52). Training: AdamW on random 128-token windows of
the training stream, warmup then cosine decay, a fixed number of steps (Qwen3.5: 300, since at
500 it overfits: held-out perplexity 47 against 34, tests/trained_qwen35/README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from perplexity import torch_perplexity, unigram_nll  # noqa: E402

LICENSES = Path("/usr/share/common-licenses")
HELDOUT_DOCS = ("license:Apache-2.0", "topic:import", "topic:calls", "topic:objects")
VOCAB = 1024
MODEL = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
# Qwen3.5 (Qwen3_5ForCausalLM, model_type qwen3_5_text) of the same widths: DeltaNet with 2 key
# heads and 4 value heads of 32 (in_proj_qkv 256, z 128), one gated attention layer last, partial
# rotary 0.25 of head_dim 32 (rotary dim 8, MRoPE sections summing to 4)
MODEL_QWEN3_5 = dict(
    MODEL,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    linear_conv_kernel_dim=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                     "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]},
)  # fmt: skip
MODELS = {"qwen3": MODEL, "qwen3_5": MODEL_QWEN3_5}
TRAIN = dict(seq=128, batch=32, steps=500, warmup=50, lr=3e-3, min_lr=3e-4, wd=0.1, clip=1.0)
EVAL_EVERY = 100


def documents() -> list[tuple[str, str]]:
    """(name, text) of every source document, in the fixed order the module docstring gives."""
    from pydoc_data.topics import topics

    docs = [
        (f"license:{p.name}", p.read_text(encoding="utf-8"))
        for p in sorted(LICENSES.iterdir())
        if p.is_file() and not p.is_symlink()
    ]
    docs += [(f"topic:{k}", topics[k]) for k in sorted(topics)]
    return docs


def _paragraphs(text: str) -> list[str]:
    return [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


def _key(paragraph: str) -> str:
    return " ".join(paragraph.split())


def corpus() -> tuple[str, str, dict[str, Any]]:
    """(training text, held-out text, a record of both): documents joined by blank lines, each
    paragraph once (held-out paragraphs never in training)."""
    docs = documents()
    names = [n for n, _ in docs]
    missing = [d for d in HELDOUT_DOCS if d not in names]
    if missing:
        raise SystemExit(f"held-out documents not found on this machine: {missing}")
    held_keys = {_key(p) for n, t in docs if n in HELDOUT_DOCS for p in _paragraphs(t)}
    seen: set[str] = set()
    train, held = [], []
    for name, text in docs:
        kept = []
        for p in _paragraphs(text):
            k = _key(p)
            if k in seen or (name not in HELDOUT_DOCS and k in held_keys):
                continue
            seen.add(k)
            kept.append(p)
        if kept:
            (held if name in HELDOUT_DOCS else train).append((name, "\n\n".join(kept)))
    train_text = "\n\n".join(t for _, t in train) + "\n"
    held_text = "\n\n".join(t for _, t in held) + "\n"
    record = {
        "python": sys.version.split()[0],
        "train_docs": [n for n, _ in train],
        "heldout_docs": [n for n, _ in held],
        "train_chars": len(train_text),
        "heldout_chars": len(held_text),
        "train_sha256": hashlib.sha256(train_text.encode()).hexdigest(),
        "heldout_sha256": hashlib.sha256(held_text.encode()).hexdigest(),
    }
    return train_text, held_text, record


def make_tokenizer(train_text: str, out_dir: Path) -> Any:
    """A byte-level BPE of VOCAB ids trained on the training paragraphs, saved as
    export/tiny.py saves its own (same specials, eos, pad and chat template)."""
    from edgeomni.export.tiny import make_tokenizer as tiny_tokenizer

    return tiny_tokenizer(out_dir, VOCAB, _paragraphs(train_text))


def _lr(step: int) -> float:
    """Linear warmup, then cosine from lr down to min_lr at the last step."""
    if step < TRAIN["warmup"]:
        return TRAIN["lr"] * (step + 1) / TRAIN["warmup"]
    frac = (step - TRAIN["warmup"]) / max(1, TRAIN["steps"] - TRAIN["warmup"])
    return TRAIN["min_lr"] + 0.5 * (TRAIN["lr"] - TRAIN["min_lr"]) * (1 + math.cos(math.pi * frac))


def new_model(name: str, vocab: int, eos: int, pad: int) -> Any:
    """A freshly initialised model of MODELS[name] (after torch.manual_seed: reproducible)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = {"qwen3": (Qwen3Config, Qwen3ForCausalLM),
                             "qwen3_5": (Qwen3_5TextConfig, Qwen3_5ForCausalLM)}[name]  # fmt: skip
    # eager attention: on the CPU its backward ran 5x faster than sdpa's (not saved in config.json)
    config = config_cls(vocab_size=vocab, eos_token_id=eos, pad_token_id=pad, bos_token_id=None,
                        attn_implementation="eager", **MODELS[name])  # fmt: skip
    return model_cls(config)


def train(
    out: Path,
    seed: int = 0,
    steps: int | None = None,
    model_name: str = "qwen3",
    heldout: Path | None = None,
) -> dict[str, Any]:
    """Write the held-out text (DIR/heldout.txt unless ``heldout``) and the checkpoint DIR/ckpt
    of model MODELS[model_name]; returns the training record."""
    import torch
    from transformers import GenerationConfig

    torch.set_num_threads(2)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    if steps is not None:
        TRAIN["steps"] = steps
    ckpt = out / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    train_text, held_text, record = corpus()
    (heldout or out / "heldout.txt").write_text(held_text, encoding="utf-8")
    tok = make_tokenizer(train_text, ckpt)
    train_ids = tok(train_text, add_special_tokens=False)["input_ids"]
    held_ids = tok(held_text, add_special_tokens=False)["input_ids"]
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    model = new_model(model_name, len(tok), eos, pad)
    params = sum(p.numel() for p in model.parameters())
    seq, bsz = TRAIN["seq"], TRAIN["batch"]
    data = torch.tensor(train_ids, dtype=torch.long)
    # a fixed sample of training windows, scored like the held-out text
    sample = np.asarray(train_ids[: (len(train_ids) // seq) * seq]).reshape(-1, seq)
    sample = sample[np.linspace(0, len(sample) - 1, 64).astype(int)].reshape(-1).tolist()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["wd"]},
                             {"params": other, "weight_decay": 0.0}],
                            lr=TRAIN["lr"], betas=(0.9, 0.95))  # fmt: skip
    base = unigram_nll(train_ids, held_ids, seq, len(tok))
    print(f"tokens: train {len(train_ids)}, held-out {len(held_ids)}; params {params}; "
          f"unigram held-out ppl {math.exp(base):.2f}", flush=True)  # fmt: skip
    history = []
    start = time.perf_counter()
    for step in range(TRAIN["steps"]):
        model.train()
        offsets = rng.integers(0, len(train_ids) - seq, size=bsz)
        x = torch.stack([data[o : o + seq] for o in offsets])
        for group in opt.param_groups:
            group["lr"] = _lr(step)
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), TRAIN["clip"])
        opt.step()
        if (step + 1) % EVAL_EVERY == 0 or step + 1 == TRAIN["steps"]:
            held = torch_perplexity(model, held_ids, seq, 16)["ppl"]
            seen = torch_perplexity(model, sample, seq, 16)["ppl"]
            elapsed = time.perf_counter() - start
            history.append({"step": step + 1, "train_ppl": seen, "heldout_ppl": held,
                            "seconds": round(elapsed, 1)})  # fmt: skip
            print(f"step {step + 1}: loss {loss.item():.3f}, train ppl {seen:.2f}, "
                  f"held-out ppl {held:.2f}, {elapsed:.0f} s", flush=True)  # fmt: skip
    model.eval()
    model.save_pretrained(ckpt)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad, do_sample=False).save_pretrained(ckpt)
    record.update(
        seed=seed,
        torch=torch.__version__,
        train_tokens=len(train_ids),
        heldout_tokens=len(held_ids),
        params=params,
        model=MODELS[model_name],
        model_type=model.config.model_type,
        vocab_size=len(tok),
        training=dict(TRAIN),
        unigram_heldout_ppl=math.exp(base),
        history=history,
        train_seconds=round(time.perf_counter() - start, 1),
    )
    (ckpt / "training.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="writes DIR/ckpt and DIR/heldout.txt")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help=f"default {TRAIN['steps']}")
    p.add_argument("--model", choices=sorted(MODELS), default="qwen3")
    p.add_argument("--heldout", type=Path, default=None, help="default DIR/heldout.txt")
    args = p.parse_args(argv)
    record = train(args.out, args.seed, args.steps, args.model, args.heldout)
    last = record["history"][-1]
    print(f"done in {record['train_seconds']} s: train ppl {last['train_ppl']:.2f}, held-out "
          f"{last['heldout_ppl']:.2f} (unigram {record['unigram_heldout_ppl']:.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
