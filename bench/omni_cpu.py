"""Qwen3-Omni on this CPU: edgeomni against transformers, side by side, on one checkpoint.

Text in, speech out: for each prompt, both run greedy thinker -> talker -> code predictor ->
code2wav; printed are wall time, audio seconds, real-time factor (wall / audio), and time to
first audio (edgeomni vocodes windows while the talker runs; transformers returns all audio at
the end, so its first audio is its wall time). Speech in, text out runs when the build has an
audio encoder. The two must produce the same codes and tokens; the script says so and exits 1
when they differ.

    python bench/omni_cpu.py [--size small|tiny] [--prompts 3] [--max-frames 100]
        [--code-predictor-calls frame|steps] [--vocoder-threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# Scaled-down Qwen3-Omni proportions (the real thinker is H2048 x48 layers, 128 experts): big
# enough that engine time, not Python overhead, dominates, small enough for a 2-core machine.
MROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 8, 8],
         "interleaved": True, "mrope_interleaved": True}  # fmt: skip
SIZES: dict[str, dict] = {
    "tiny": {},
    "small": {
        "thinker": dict(
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            moe_intermediate_size=256,
            num_experts=16,
            num_experts_per_tok=4,
            rope_parameters=MROPE,
        ),  # fmt: skip
        "audio": dict(
            d_model=256,
            encoder_layers=4,
            encoder_attention_heads=4,
            encoder_ffn_dim=1024,
            output_dim=512,
        ),  # fmt: skip
        "vision": dict(hidden_size=256, intermediate_size=1024, num_heads=4, out_hidden_size=512),
        "talker": dict(
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            moe_intermediate_size=256,
            num_local_experts=16,
            num_experts_per_tok=4,
            shared_expert_intermediate_size=512,
            rope_parameters=MROPE,
        ),  # fmt: skip
        "talker_top": dict(thinker_hidden_size=512),
        "code_predictor": dict(
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=5,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            layer_types=["full_attention"] * 5,
        ),  # fmt: skip
        "code2wav": dict(
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=8,
            decoder_dim=768,
            sliding_window=72,
        ),  # fmt: skip
    },
}
PROMPTS = [
    "What is the capital of France?",
    "Tell me about edge devices.",
    "Write a short poem about rain.",
    "How are you today?",
]


def build(size: str, work: Path, calls: str = "frame") -> tuple[Path, Path]:
    """The checkpoint and its engine, made once; ``calls``: the code predictor's build
    (edge-build's --code-predictor-calls)."""
    from edgeomni.builder.build import build as edge_build
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.tiny_omni import make_qwen3_omni

    ckpt, engine = work / f"omni-{size}", work / f"omni-{size}-engine-{calls}"
    if not (ckpt / "config.json").is_file():
        make_qwen3_omni(ckpt, sizes=SIZES[size])
    if not (engine / "multistage_config.json").is_file():
        edge_build(ckpt, engine, BuildArgs(1, 256, 2048, code_predictor_calls=calls))
    return ckpt, engine


def set_window(engine: Path, frames: int, first: int | None = None) -> None:
    """The vocoder's windows (and a shorter first one) in the graph's code2wav stage config."""
    path = engine / "multistage_config.json"
    graph = json.loads(path.read_text())
    for stage in graph["stages"]:
        if stage["runner"] == "qwen3_omni.code2wav":
            stage["config"] = {**stage.get("config", {}), "window_frames": frames,
                               "first_window_frames": first or frames}  # fmt: skip
    path.write_text(json.dumps(graph, indent=2) + "\n")


def run_edgeomni(
    engine: Path, prompts: list[str], max_new: int, max_frames: int, stream: bool = False,
    vocoder_threads: int | None = None,
) -> list[dict]:
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    pipe = Pipeline(engine, stream_stages=stream, vocoder_threads=vocoder_threads)
    body = {
        "max_generate_length": max_new,
        "top_k": 1,
        "requests": [
            {
                "messages": [{"role": "user", "content": [{"type": "text", "text": p}]}],
                "sampling": {"talker_top_k": 1, "talker_max_new_tokens": max_frames + 1},
            }
            for p in prompts
        ],
    }
    requests, _ = parse_request_file(body)
    pipe.run(requests[:1], batch_size=1)  # warm-up: loads every engine
    results = []
    for request in requests:
        start = time.perf_counter()
        (outcome,) = pipe.run([request], batch_size=1)
        wall = time.perf_counter() - start
        st = outcome.entry["stages"]
        results.append(
            {
                "wall_s": wall,
                "audio_s": len(outcome.audio) / outcome.sample_rate,
                "first_audio_s": st["code2wav"]["first_audio_ms"] / 1e3,
                "thinker_s": st["thinker"]["prefill_ms"] / 1e3 + st["thinker"]["decode_ms"] / 1e3,
                "frames": st["talker"]["frames"],
                "codes": outcome.codes,
            }
        )
    return results


def run_transformers(ckpt: Path, prompts: list[str], max_new: int, max_frames: int) -> list[dict]:
    import torch
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(ckpt)
    captured: dict = {}
    original = model.code2wav.chunked_decode

    def capture(codes, *a, **k):  # noqa: ANN001, ANN002, ANN003
        captured["codes"] = codes[0].T.numpy()
        return original(codes, *a, **k)

    model.code2wav.chunked_decode = capture

    def generate(prompt: str):  # noqa: ANN202
        messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
        with torch.no_grad():
            return model.generate(
                input_ids=ids,
                speaker="ethan",
                return_audio=True,
                thinker_max_new_tokens=max_new,
                thinker_do_sample=False,
                thinker_eos_token_id=model.config.im_end_token_id,
                talker_do_sample=False,
                talker_max_new_tokens=max_frames + 1,
            )

    generate(prompts[0])  # warm-up
    results = []
    for prompt in prompts:
        start = time.perf_counter()
        _, wav = generate(prompt)
        wall = time.perf_counter() - start
        results.append(
            {
                "wall_s": wall,
                "audio_s": wav.numel() / 24000,
                "first_audio_s": wall,
                "frames": len(captured["codes"]),
                "codes": captured["codes"].astype(np.int64),
            }
        )
    return results


def speech_in(ckpt: Path, engine: Path, work: Path, seconds: float, max_new: int) -> dict | None:
    """Speech in, text out: one clip through the audio encoder and the thinker, both sides."""
    if not (engine / "audio" / "config.json").is_file():
        return None
    import torch
    from transformers import (
        AutoFeatureExtractor,
        AutoTokenizer,
        Qwen3OmniMoeForConditionalGeneration,
    )

    from edgeomni.runtime.audio import read_wav, write_wav
    from edgeomni.runtime.media.audio_input import audio_token_count
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    rng = np.random.default_rng(0)
    t = np.arange(int(16000 * seconds)) / 16000
    clip = (0.3 * np.sin(2 * np.pi * 180 * t) + 0.05 * rng.standard_normal(t.size)).astype(
        np.float32
    )
    write_wav(work / "question.wav", clip, 16000)
    clip, _ = read_wav(work / "question.wav")
    content = [
        {"type": "audio", "audio": str(work / "question.wav")},
        {"type": "text", "text": "Answer."},
    ]
    body = {
        "max_generate_length": max_new,
        "top_k": 1,
        "requests": [{"messages": [{"role": "user", "content": content}]}],
    }
    requests, _ = parse_request_file(body)
    pipe = Pipeline(engine)
    pipe.run(requests, batch_size=1, requested=pipe.text_terminals())
    start = time.perf_counter()
    (ours,) = pipe.run(requests, batch_size=1, requested=pipe.text_terminals())
    ours_s = time.perf_counter() - start

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(ckpt)
    fe = AutoFeatureExtractor.from_pretrained(ckpt)
    feats = fe(
        [clip],
        sampling_rate=16000,
        padding=True,
        truncation=False,
        return_attention_mask=True,
        return_tensors="pt",
    )
    text = tok.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    n = audio_token_count(int(feats["attention_mask"].sum()))
    text = text.replace(tok.audio_token, tok.audio_token * n, 1)
    ids = tok([text], return_tensors="pt")

    def generate():  # noqa: ANN202
        with torch.no_grad():
            return model.generate(
                input_ids=ids["input_ids"], attention_mask=ids["attention_mask"],
                input_features=feats["input_features"], feature_attention_mask=feats["attention_mask"],
                return_audio=False, thinker_max_new_tokens=max_new, thinker_do_sample=False,
                thinker_eos_token_id=model.config.im_end_token_id,
            )  # fmt: skip

    generate()
    start = time.perf_counter()
    seq = generate()
    ref_s = time.perf_counter() - start
    ref_tokens = seq[0, ids["input_ids"].shape[1] :].tolist()
    return {
        "audio_in_s": seconds,
        "edgeomni_s": round(ours_s, 3),
        "transformers_s": round(ref_s, 3),
        "speedup": round(ref_s / ours_s, 2),
        "same_tokens": ours.entry["stages"]["thinker"]["output_tokens"] == ref_tokens,
    }


def summary(rows: list[dict]) -> dict:
    wall = sum(r["wall_s"] for r in rows)
    audio = sum(r["audio_s"] for r in rows)
    return {
        "wall_s": round(wall, 3),
        "audio_s": round(audio, 3),
        "rtf": round(wall / audio, 3) if audio else None,
        "first_audio_ms_median": round(
            1e3 * statistics.median(r["first_audio_s"] for r in rows), 1
        ),
        "frames": [r["frames"] for r in rows],
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--max-frames", type=int, default=100)
    p.add_argument("--window-frames", type=int, default=25, help="edgeomni vocoder window")
    p.add_argument("--first-window-frames", type=int, help="a shorter first window (default: same)")
    p.add_argument("--speech-seconds", type=float, default=5.0, help="clip length, speech in")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edgeomni-bench")
    p.add_argument(
        "--stage-streaming",
        action="store_true",
        help="the talker streams the thinker's reply (edge-infer's flag)",
    )
    p.add_argument("--code-predictor-calls", choices=("frame", "steps"), default="frame",
                   help="edgeomni's code predictor: one call a frame (the CPU default) or a step")
    p.add_argument("--vocoder-threads", type=int, metavar="N",
                   help="edgeomni's vocoder on a thread of its own (edge-infer's flag)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    ckpt, engine = build(args.size, args.work, args.code_predictor_calls)
    set_window(engine, args.window_frames, args.first_window_frames)
    prompts = PROMPTS[: args.prompts]
    ours = run_edgeomni(engine, prompts, args.max_new_tokens, args.max_frames, args.stage_streaming,
                        args.vocoder_threads)
    ref = run_transformers(ckpt, prompts, args.max_new_tokens, args.max_frames)
    same = all(np.array_equal(a["codes"], b["codes"]) for a, b in zip(ours, ref, strict=True))
    a2t = speech_in(ckpt, engine, args.work, args.speech_seconds, args.max_new_tokens)
    o, r = summary(ours), summary(ref)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "size": args.size,
        "code_predictor_calls": args.code_predictor_calls,
        "window_frames": args.window_frames,
        "first_window_frames": args.first_window_frames or args.window_frames,
        "stage_streaming": args.stage_streaming,
        "vocoder_threads": args.vocoder_threads,
        "max_new_tokens": args.max_new_tokens,
        "max_frames": args.max_frames,
        "edgeomni": o,
        "transformers": r,
        "rtf_speedup": round(r["rtf"] / o["rtf"], 2) if o["rtf"] and r["rtf"] else None,
        "first_audio_speedup": round(r["first_audio_ms_median"] / o["first_audio_ms_median"], 2),
        "same_codes": same,
        "speech_in_text_out": a2t,
    }
    print(json.dumps(result, indent=2))
    print(
        f"\ntext -> speech ({args.size}): RTF edgeomni {o['rtf']} vs transformers {r['rtf']} "
        f"({result['rtf_speedup']}x); first audio {o['first_audio_ms_median']} ms vs "
        f"{r['first_audio_ms_median']} ms ({result['first_audio_speedup']}x); same codes: {same}"
    )
    if a2t:
        print(
            f"speech -> text ({args.size}, {a2t['audio_in_s']} s clip): edgeomni {a2t['edgeomni_s']} s "
            f"vs transformers {a2t['transformers_s']} s ({a2t['speedup']}x); same tokens: "
            f"{a2t['same_tokens']}"
        )
        same = same and a2t["same_tokens"]
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
