"""Tiny random checkpoints with a small local tokenizer, for tests, demos and benchmarks.

No hub: the model comes from transformers' config classes (``save_pretrained``) and the tokenizer
is a byte-level BPE trained here on a few sentences.

    python -m edgeomni.export.tiny MODEL_TYPE OUT_DIR [--seed 0] [--force]

MODEL_TYPE: one per registered family that declares a tiny maker (export/registry.py), listed
below with its maker, whose default kind it writes (a maker's module may write other kinds
itself: python -m MODULE --help).

OUT_DIR must be new or empty: a checkpoint's files have common names (config.json,
model.safetensors, tokenizer.json) that would replace yours, so a non-empty OUT_DIR is refused
(exit 2, naming what is there) unless it holds just a tiny checkpoint a writer put there, as it
left it (its record, .edgeomni-tiny.json, lists each file's size and digest), which is replaced;
--force writes into any OUT_DIR all the same, replacing the files of those names and leaving
the others. Exit status: 0 written; 2 bad arguments or an OUT_DIR it may not write; 1 a system
error (a full disk), in one line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CORPUS = [
    "Hello! How are you today? I am fine, thank you.",
    "The quick brown fox jumps over the lazy dog.",
    "Edge devices run small, fast models with predictable memory.",
    "Speech models turn text into audio, and audio into text.",
    "What is the capital of France? Paris is the capital of France.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
    "user assistant system: please answer briefly.",
]


def decoder_dims(hidden: int, layers: int, heads: int, kv: int, head_dim: int, inter: int) -> dict:
    """A tiny decoder section's dimensions (transformers' key names)."""
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, head_dim=head_dim, intermediate_size=inter)  # fmt: skip


def make_tokenizer(
    out_dir: Path, vocab_size: int = 320, corpus: Iterable[str] | None = None
) -> Any:
    """Train a byte-level BPE (on ``corpus``, default the built-in sentences) and save it with a
    ChatML chat template; returns the HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4 if corpus is None else corpus, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(out_dir)
    return hf


def make_qwen3(out_dir: Path, *, seed: int = 0, **overrides: Any) -> Path:
    """A 2-layer Qwen3 (hidden 64) with the tiny tokenizer; overrides go to Qwen3Config."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(out_dir)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    settings: dict[str, Any] = dict(
        vocab_size=384,
        **decoder_dims(64, 2, 4, 2, 16, 128),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        initializer_range=0.2,  # spread-out logits: greedy parity should not hinge on near-ties
    )
    settings.update(overrides)
    config = Qwen3Config(**settings)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    model.save_pretrained(out_dir)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad, do_sample=False).save_pretrained(out_dir)
    return out_dir


class _Makers(dict):
    """model_type -> make(out_dir, *, seed): every registered family's tiny checkpoint maker
    (export/registry.py; a family declares its own), each imported when used."""

    def __init__(self) -> None:
        from edgeomni.export.registry import tiny_makers

        super().__init__({t: f.tiny for t, f in tiny_makers().items()})
        self._families = tiny_makers()

    def __getitem__(self, model_type: str):  # type: ignore[override]
        return self._families[model_type].tiny_maker()


MAKERS = _Makers()


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (the usage block is --help's), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


FORCE_HELP = "write into a non-empty OUT_DIR, replacing files of the checkpoint's names"


# what a writer wrote into OUT_DIR: each file's size, and its digest up to HASH_LIMIT bytes
RECORD = ".edgeomni-tiny.json"
HASH_LIMIT = 64 << 20


def _files(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Every file under ``out_dir`` but the record: its size, and sha256 when small enough."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(out_dir.rglob("*")):
        rel = path.relative_to(out_dir).as_posix()
        if rel == RECORD or path.is_dir():
            continue
        entry: dict[str, Any] = {"size": path.lstat().st_size, "link": path.is_symlink()}
        if path.is_file() and not path.is_symlink() and entry["size"] <= HASH_LIMIT:
            entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        out[rel] = entry
    return out


def own_previous(out_dir: Path) -> list[str] | None:
    """The files of a tiny checkpoint a writer left in ``out_dir``, when the dir holds just
    those, unchanged (its record says so); None otherwise."""
    try:
        record = json.loads((out_dir / RECORD).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return sorted(record) if isinstance(record, dict) and _files(out_dir) == record else None


def out_dir_refusal(out_dir: Path, force: bool = False) -> str | None:
    """Why OUT_DIR may not be written, or None. Only a new or empty directory, or one holding
    just an earlier tiny checkpoint as its writer left it, is taken without --force: a file
    there cannot be told from one of the user's by its name."""
    if out_dir.exists() and not out_dir.is_dir():
        return f"{out_dir} exists and is not a directory"
    if out_dir.is_dir():
        names = sorted(os.listdir(out_dir))
        if names and not force and own_previous(out_dir) is None:
            shown = ", ".join(names[:5]) + (
                f", and {len(names) - 5} more" if len(names) > 5 else ""
            )
            return (
                f"{out_dir} is not empty ({shown}); choose a new or empty directory, or pass "
                "--force to write into it (files of the same names are replaced; a tiny "
                "checkpoint a writer left there unchanged is replaced without it)"
            )
        return None
    parent = next((p for p in out_dir.parents if p.exists() or p.is_symlink()), None)
    if parent is not None and not parent.is_dir():
        return f"{parent} is not a directory"
    return None


def write_checkpoint(prog: str, out_dir: Path, force: bool, make: Callable[[], Any]) -> int:
    """Run a tiny checkpoint writer behind the OUT_DIR rule: a refusal is one line and exit 2,
    a system error (a full disk, no permission) one line and exit 1."""
    refusal = out_dir_refusal(out_dir, force)
    if refusal:
        print(f"{prog}: error: {refusal}", file=sys.stderr)
        return 2
    try:
        fresh = not out_dir.is_dir() or not os.listdir(out_dir)
        previous = None if fresh else own_previous(out_dir)
        for rel in [*(previous or ()), RECORD] if previous is not None else ():
            (out_dir / rel).unlink()  # ours, unchanged: replaced whole (another family's too)
        make()
        if fresh or previous is not None:  # after --force into your files, no record
            text = json.dumps({"files": _files(out_dir)}, indent=1)
            (out_dir / RECORD).write_text(text + "\n", encoding="utf-8")
    except OSError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    return 0


def model_types_help() -> str:
    """--help's list of every MODEL_TYPE, from the registry: a family added there is listed."""
    from edgeomni.export.registry import tiny_makers

    rows = [f"  {t:<16} family {f.name}, written by {f.tiny}"
            for t, f in sorted(tiny_makers().items())]  # fmt: skip
    return "model types (MODEL_TYPE):\n" + "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    prog = "python -m edgeomni.export.tiny"
    p = Parser(prog=prog, description=__doc__, epilog=model_types_help(),
               formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("family", metavar="MODEL_TYPE", choices=sorted(MAKERS),
                   help="the checkpoint's model_type: one of those listed below")  # fmt: skip
    p.add_argument("out_dir", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help=FORCE_HELP)
    args = p.parse_args(argv)
    code = write_checkpoint(
        prog, args.out_dir, args.force, lambda: MAKERS[args.family](args.out_dir, seed=args.seed)
    )
    if code == 0:
        print(f"wrote a tiny random {args.family} checkpoint to {args.out_dir}")
    return code


if __name__ == "__main__":
    sys.exit(main())
