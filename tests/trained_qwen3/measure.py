"""The quality tables of docs/quantization.md: a trained checkpoint built fp32 and in int4
variants, every build scored on the held-out text through perplexity.py (not run by CI).

Why: CI scores 16 windows of a few builds; the tables score every window of every variant, so a
committed command reproduces them:

    python tests/trained_qwen3/measure.py --ckpt tests/trained_qwen35/ckpt [--windows 16] \\
        [--variants "rtn g32" "awq g32"]

Prints one markdown row per build (perplexity, vs fp32, greedy agreement, mean KL).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import perplexity as ppl  # noqa: E402

CALIBRATION = str(HERE / "calibration.json")  # paragraphs of the training text
VARIANTS: dict[str, dict[str, Any]] = {
    "rtn g32, float lm_head": dict(quantization="int4_rtn", group_size=32,
                                   quantize_lm_head=False),  # fmt: skip
    "rtn g64, float lm_head": dict(quantization="int4_rtn", group_size=64,
                                   quantize_lm_head=False),  # fmt: skip
    "rtn g128, float lm_head": dict(quantization="int4_rtn", group_size=128,
                                    quantize_lm_head=False),  # fmt: skip
    "rtn g32": dict(quantization="int4_rtn", group_size=32),
    "rtn g128": dict(quantization="int4_rtn", group_size=128),
    "awq g32": dict(quantization="int4_awq", group_size=32),
    "awq g32, own calibration": dict(quantization="int4_awq", group_size=32,
                                     calibration=CALIBRATION),  # fmt: skip
    "awq g128": dict(quantization="int4_awq", group_size=128),
}


def _build(ckpt: Path, engine_dir: Path, **quant: Any) -> Path:
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    build(ckpt, engine_dir, BuildArgs(**ppl.BUILD, **quant))
    return engine_dir


def measure(ckpt: Path, n_windows: int | None, variants: list[str], work: Path) -> None:
    """Build and score fp32, then each variant against it; one table row each, as it ends."""
    ids = ppl.heldout_ids(n_windows, ppl.WINDOW, ckpt)
    start = time.perf_counter()
    fp32 = _build(ckpt, work / "fp32")
    scores = ppl.engine_perplexity(fp32, ids, ppl.WINDOW, ppl.BATCH, keep_logprobs=True)
    base = ppl.Baseline(ckpt, fp32, ids, scores)
    print(f"{scores['windows']} windows, {scores['tokens']} scored tokens\n")
    print("| build | perplexity | vs fp32 | greedy agreement with fp32 "
          "| mean KL(fp32 \\|\\| int4) |")
    print("|---|---|---|---|---|")
    print(f"| fp32 | {scores['ppl']:.3f} | | | |", flush=True)
    for name in variants:
        engine = _build(ckpt, work / name.replace(" ", "-").replace(",", ""), **VARIANTS[name])
        s = ppl.against(base, engine)
        print(f"| {name} | {s['ppl']:.3f} | {100 * (s['ratio'] - 1):+.2f}% | "
              f"{100 * s['agreement']:.1f}% | {s['kl']:.3f} |", flush=True)  # fmt: skip
    print(f"\n{time.perf_counter() - start:.0f} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", type=Path, default=ppl.CKPT)
    p.add_argument("--windows", type=int, default=None, help="default: every held-out window")
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="edgeomni-measure-") as work:
        measure(args.ckpt, args.windows, args.variants, Path(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
