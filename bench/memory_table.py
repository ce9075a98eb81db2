"""docs/quantization.md's memory table: edge-build --estimate over the released models' configs.

No weights are needed (or downloaded): each model's config files are written from its published
dimensions, then ``builder.estimate`` counts every component as a build would store it.

- Qwen3 0.6B, 1.7B, 4B and 8B: their config.json values.
- Qwen3-TTS 0.6B and 1.7B (a Base checkpoint, so the clone encoders count): export/tiny_tts.py's
  sizes, the release's dimensions.
- Qwen3-Omni-30B-A3B: the thinker, talker, code predictor and code2wav at
  bench/gpu_omni.py's published values; the audio and vision encoders at the public config's
  sizes (below).

Each at fp16 and at int4_rtn g32 (--quantize-lm-head default), KV cache for one request of
4096 slots in fp16, against Jetson memory.

    python bench/memory_table.py [--work DIR] [--kv-slots 4096] [--batch 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

QWEN3 = {  # hidden, intermediate, layers, heads, kv heads, tied
    "Qwen3-0.6B": (1024, 3072, 28, 16, 8, True),
    "Qwen3-1.7B": (2048, 6144, 28, 16, 8, True),
    "Qwen3-4B": (2560, 9728, 36, 32, 8, True),
    "Qwen3-8B": (4096, 12288, 36, 32, 8, False),
}
OMNI_ENCODERS = {  # the public config's audio tower and vision encoder
    "audio": dict(d_model=1280, encoder_layers=32, encoder_attention_heads=20,
                  encoder_ffn_dim=5120, output_dim=2048),
    "vision": dict(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304,
                   out_hidden_size=2048, deepstack_visual_indexes=[8, 16, 24]),
}  # fmt: skip
DEVICES = (("Orin Nano 8GB", 8), ("Orin NX 16GB", 16), ("AGX Orin 32GB", 32),
           ("AGX Orin 64GB", 64), ("AGX Thor 128GB", 128))  # fmt: skip


def qwen3_dir(root: Path, name: str) -> Path:
    from edgeomni.export.tiny import make_tokenizer

    h, i, layers, heads, kv, tied = QWEN3[name]
    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    make_tokenizer(out)  # so the checkpoint opens as one; the estimate reads none of it
    cfg = dict(model_type="qwen3", architectures=["Qwen3ForCausalLM"], vocab_size=151936,
               hidden_size=h, intermediate_size=i, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=kv, head_dim=128,
               rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=40960,
               tie_word_embeddings=tied)  # fmt: skip
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def tts_dir(root: Path, size: str) -> Path:
    from edgeomni.export import tiny_tts

    out = root / f"Qwen3-TTS-{size.upper()}"
    (out / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    ids = tiny_tts.write_tokenizer(out)
    cfg = tiny_tts.tts_config("base", size, ids, tiny_tts.SIZES[size]["text_vocab"])
    (out / "config.json").write_text(json.dumps(cfg))
    (out / "speech_tokenizer" / "config.json").write_text(json.dumps(tiny_tts.codec_config(size)))
    return out


def omni_dir(root: Path) -> Path:
    from gpu_common import REAL_THINKER_LAYERS
    from gpu_omni import real_sizes

    from edgeomni.export import tiny_omni

    out = root / "Qwen3-Omni-30B-A3B"
    out.mkdir(parents=True, exist_ok=True)
    tok = tiny_omni.make_omni_tokenizer(out)
    ids = {t: tok.convert_tokens_to_ids(t) for t in tiny_omni.SPECIALS}
    ids.update({w: tok.encode(w, add_special_tokens=False)[0] for w in tiny_omni.ROLE_WORDS})
    config = tiny_omni.omni_config(ids)
    sizes = real_sizes(REAL_THINKER_LAYERS)
    for name, fields in (*sizes.items(), *OMNI_ENCODERS.items()):
        target = config
        for attr in tiny_omni.SECTIONS[name]:
            target = getattr(target, attr)
        for key, value in fields.items():
            setattr(target, key, value)
    config.save_pretrained(out)
    return out


def estimate_row(model: Path, quantization: str | None, slots: int, batch: int) -> int:
    from edgeomni.builder import estimate
    from edgeomni.export.common.checkpoint import open_checkpoint
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.registry import family_for

    ckpt = open_checkpoint(model)
    hooks = family_for(ckpt.model_type).hooks()
    args = BuildArgs(batch, min(1024, slots), slots, dtype="float16", quantization=quantization)
    rows = estimate.estimate(ckpt, hooks, hooks.components(ckpt), args)
    return sum(r.total for r in rows)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edgeomni-mem")
    p.add_argument("--kv-slots", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    args = p.parse_args()
    models = [qwen3_dir(args.work, n) for n in QWEN3]
    models += [tts_dir(args.work, s) for s in ("0.6b", "1.7b")] + [omni_dir(args.work)]
    head = "| model | " + " | ".join(
        f"{q} GB | {' / '.join(f'{gb}' for _, gb in DEVICES)} GB" for q in ("fp16", "int4")
    )
    print(head + " |")
    print("|---" * 5 + "|")
    for model in models:
        cells = []
        for q in (None, "int4_rtn"):
            total = estimate_row(model, q, args.kv_slots, args.batch)
            fits = " ".join("yes" if total < gb * 1e9 else "no" for _, gb in DEVICES)
            cells += [f"{total / 1e9:.2f}", fits]
        print(f"| {model.name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
