"""faster-qwen3-tts (0.5.4, its CUDA-graph torch path) on the checkpoint bench/gpu_tts.py uses.

The peer the issue names beside upstream: CUDA graphs over HF's StaticCache for the talker step
and the 15-step code predictor, batch 1. It runs on qwen-tts-hf (qwen-tts ported to transformers
5.x) and transformers 5.15+, so it gets a site dir of its own on the GPU machine (see
``install``). This script times it at c=1 on a random CustomVoice checkpoint written by
export/tiny_tts.py (same as gpu_tts.py's, same text and speaker, non-streaming text, the EOS row
zeroed so exactly --frames frames): first audio from its streaming API's first chunk, RTF from
the whole call. Its code predictor's sampling is fixed when its graph is captured (do_sample,
top-k 50, temperature 0.9), so greedy is not on offer for it: speed, not codes.

    python bench/gpu_tts_faster.py --ckpt DIR --out OUT.json [--frames 100] [--repeats 2]
    python bench/gpu_tts_faster.py install WHEELS_DIR SITE WHEEL...   # on the device, once

Tried on the H200 on 2026-12-01 (docs/benchmarks.md): it does not load there. qwen-tts-hf's
port builds its Mimi encoder's rotary embedding from ``config.rope_theta``, which transformers
5.17's MimiConfig (the GPU image's) no longer has (``rope_parameters``): AttributeError in
``qwen_tts/_transformers_compat.py``, the same failure families.md records on 5.24. The
torchaudio 2.11.1 wheel's libraries also fail to load there (renamed away; not needed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

TEXT = (
    "Hello world, this is a test of the speech engine on a small random model, speaking a "
    "sentence long enough to take a few seconds."
)
# the 4.57 stack of the upstream site dir; faster-qwen3-tts takes the image's transformers 5.x
SKIP = ("transformers-", "huggingface_hub-", "tokenizers-", "qwen_tts-")


def install(wheels: Path, site: Path, extra: list[Path]) -> None:
    """faster-qwen3-tts, qwen-tts-hf and accelerate (``extra``) plus librosa and the rest from
    the upstream staging's wheels, without its transformers 4.57 stack, into ``site``."""
    names = [p for p in sorted(wheels.glob("*.whl")) if not p.name.startswith(SKIP)]
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--target", str(site), *map(str, names), *map(str, extra)]  # fmt: skip
    subprocess.run(cmd, check=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "install":
        install(Path(argv[1]), Path(argv[2]), [Path(p) for p in argv[3:]])
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--frames", type=int, default=100)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--chunk", type=int, default=12, help="its streaming chunk (frames)")
    args = p.parse_args(argv)

    import torch
    import transformers
    from faster_qwen3_tts import FasterQwen3TTS

    start = time.perf_counter()
    model = FasterQwen3TTS.from_pretrained(str(args.ckpt), device="cuda", dtype=torch.bfloat16)
    model.warmup()
    load_s = time.perf_counter() - start
    kw = dict(text=TEXT, speaker="vivian", language="English", non_streaming_mode=True,
              max_new_tokens=args.frames + 1)  # fmt: skip
    runs = []
    for i in range(args.repeats + 1):  # the first is a warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        first = None
        samples = 0
        for chunk, _sr, _timing in model.generate_custom_voice_streaming(
            **kw, chunk_size=args.chunk
        ):
            if first is None and len(chunk):
                first = time.perf_counter() - t0
            samples += len(chunk)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        wavs, sr = model.generate_custom_voice(**kw)
        torch.cuda.synchronize()
        whole = time.perf_counter() - t1
        run = {"first_audio_ms": round(first * 1e3, 1) if first else None,
               "streaming_wall_ms": round(wall * 1e3, 1), "streaming_samples": samples,
               "whole_wall_ms": round(whole * 1e3, 1), "samples": int(len(wavs[0])), "sr": sr}  # fmt: skip
        print(json.dumps(run), flush=True)
        if i:
            runs.append(run)
    audio_s = runs[0]["samples"] / runs[0]["sr"]
    result = {
        "package": "faster-qwen3-tts 0.5.4 (torch backend, CUDA graphs), qwen-tts-hf",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "frames": args.frames,
        "load_and_warmup_s": round(load_s, 1),
        "runs": runs,
        "first_audio_p50_ms": statistics.median(r["first_audio_ms"] for r in runs),
        "rtf_whole_p50": round(
            statistics.median(r["whole_wall_ms"] for r in runs) / 1e3 / audio_s, 4
        ),
        "rtf_streaming_p50": round(
            statistics.median(r["streaming_wall_ms"] for r in runs) / 1e3 / audio_s, 4
        ),
        "audio_s": audio_s,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
