"""The transformers reference side of bench/gpu_omni.py: Qwen3-Omni's generate(), one request
at a time, with the same fixed work as the edgeomni side.

Apart from gpu_omni.py to keep each file under the project's 800-line limit; gpu_omni.main
calls run_transformers after the edgeomni runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_common import SAMPLE_RATE, free_gpu, phase, scaled, sync


# -- transformers ----------------------------------------------------------------------------
def run_transformers(ckpt: Path, prompt_ids: list[int], args: argparse.Namespace,
                     device: str) -> dict[str, Any]:  # fmt: skip
    """One request at a time: bf16 + sdpa on the GPU (float32 on a CPU), generate() with the
    same fixed work; each sub-generate timed between synchronisations (as the baseline notes)."""
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    free_gpu()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()  # the checkpoint was made in this process
    with phase("transformers: load"):
        try:
            model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
                ckpt, dtype=dtype, attn_implementation="sdpa", device_map=device
            )
        except (ImportError, ValueError):  # device_map needs accelerate in some versions
            model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
                ckpt, dtype=dtype, attn_implementation="sdpa"
            ).to(device)
        model.eval()
    times: dict[str, float] = {}
    captured: dict[str, Any] = {}

    def timed(owner: Any, name: str, key: str, keep: Callable[[Any], None] | None = None) -> None:
        original = getattr(owner, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            if keep is not None:
                keep(a[0] if a else k.get("codes"))
            sync()
            start = time.perf_counter()
            result = original(*a, **k)
            sync()
            times[key] = times.get(key, 0.0) + time.perf_counter() - start
            return result

        setattr(owner, name, wrapper)

    timed(model.thinker, "generate", "thinker")
    timed(model.talker, "generate", "talker_cp")
    timed(model.talker.code_predictor, "generate", "code_predictor")
    timed(model.code2wav, "chunked_decode", "code2wav", lambda codes: captured.update(codes=codes))
    ids = torch.tensor([prompt_ids], device=device)
    kwargs: dict[str, Any] = dict(
        speaker="Ethan",  # generate() lowercases it for the config's speaker_id table
        return_audio=True,
        thinker_max_new_tokens=args.new_tokens,
        thinker_min_new_tokens=args.new_tokens,
        thinker_do_sample=False,
        thinker_eos_token_id=model.config.im_end_token_id,  # the default is the real tokenizer's
        talker_max_new_tokens=args.frames + 1,
        talker_min_new_tokens=args.frames + 1,
    )
    if args.greedy_talker:
        kwargs["talker_do_sample"] = False

    def one(run: int) -> dict[str, Any]:
        times.clear()
        torch.manual_seed(args.seed + run)
        sync()
        start = time.perf_counter()
        with torch.no_grad():
            seq, wav = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        sync()
        wall = time.perf_counter() - start
        audio_s = wav.numel() / SAMPLE_RATE
        codes = captured["codes"][0].T.cpu().numpy()
        return {
            "wall_ms": round(wall * 1e3, 3),
            "ttfa_ms": round(wall * 1e3, 3),  # all audio comes back when generate returns
            "audio_s": round(audio_s, 4),
            "rtf": round(wall / audio_s, 4) if audio_s else None,
            "thinker_tokens": int(seq.shape[1] - ids.shape[1]),
            "frames": int(codes.shape[0]),
            "thinker_ms": round(times.get("thinker", 0.0) * 1e3, 3),
            "talker_cp_ms": round(times.get("talker_cp", 0.0) * 1e3, 3),
            "code_predictor_ms": round(times.get("code_predictor", 0.0) * 1e3, 3),
            "code2wav_ms": round(times.get("code2wav", 0.0) * 1e3, 3),
            "_codes": codes,
        }

    with phase("transformers: warm-up"):
        warm = one(0)
    runs = []
    for r in range(args.hf_runs):
        with phase(f"transformers: timed run {r + 1}/{args.hf_runs}"):
            runs.append(one(r + 1))
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    model = None  # free it before anything else runs (the closures above hold no reference)
    free_gpu()
    med = statistics.median
    summary = {
        "ok": True,
        "requests": len(runs),
        "ttfa_p50_ms": round(med(r["ttfa_ms"] for r in runs), 1),
        "ttfa_max_ms": round(max(r["ttfa_ms"] for r in runs), 1),
        "ttfa_from": "submission (generate returns all audio at the end)",
        "stall_max_ms": 0.0,  # all of it at once
        "rtf_p50": round(med(r["rtf"] for r in runs), 4),
        "audio_s_per_s": round(
            sum(r["audio_s"] for r in runs) / (sum(r["wall_ms"] for r in runs) / 1e3), 3
        ),
        "wall_ms_p50": round(med(r["wall_ms"] for r in runs), 1),
        "thinker_ms": round(med(r["thinker_ms"] for r in runs), 1),
        "talker_cp_ms": round(med(r["talker_cp_ms"] for r in runs), 1),
        "code_predictor_ms": round(med(r["code_predictor_ms"] for r in runs), 1),
        "code2wav_ms": round(med(r["code2wav_ms"] for r in runs), 1),
        "fixed_work": all(
            r["thinker_tokens"] == args.new_tokens and r["frames"] == args.frames for r in runs
        ),
    }
    rows = [{**r, "e2e_ms": r["wall_ms"]} for r in runs]
    summary.update(scaled(summary, rows, runs, args.thinker_layers, summary["thinker_ms"]))
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "device": device,
        "attn_implementation": "sdpa",
        "generate_kwargs": kwargs,
        "warmup_wall_ms": warm["wall_ms"],
        "peak_gpu_gib": round(peak, 2) if peak is not None else None,
        "runs": runs,
        "summary": summary,
    }
