"""Qwen3.5 on this CPU: edgeomni's fp32 and int4 engines against transformers' eager model,
side by side in one run, decode and prefill, each decode step beside its bandwidth bound.

Builds a random-weight checkpoint at Qwen3.5-0.8B's text dimensions (no download: 24 layers, 18
Gated DeltaNet + 6 gated attention, hidden 1024, FFN 3584, attention 8 Q / 2 KV heads of 256,
DeltaNet 16 key and 16 value heads of 128, vocabulary 248,320, tied embeddings), builds it with
edge-build (ONNX Runtime, CPU) as fp32 and ``--quantization int4_rtn`` (group 32, the lm_head
int4 too), then times through edge-infer's pipeline, at batch 1, greedy:
- decode: a fixed number of new tokens after a short prompt (ms a step);
- prefill: a longer prompt (ms, tokens/s);
and transformers' fp32 eager ``generate`` on the same checkpoint the same way. A decode step's
bound is the bytes it must read at the best measured read bandwidth: the engine's weights as
stored, every DeltaNet layer's recurrent and convolution state (read and written: ~19 MB at
these dimensions, whatever the context) and the attention layers' KV at mid-generation.

    python bench/qwen35_cpu.py [--work DIR] [--layers 24] [--new-tokens 64] [--repeats 3]
                               [--prefill-words 48] [--json FILE]
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from int4_cpu import build, engine_bytes  # noqa: E402 - one definition each
from llm_decode_cpu import (  # noqa: E402
    decode_parser,
    prompt_messages,
    read_bandwidth_gbs,
    time_edgeomni,
    time_transformers,
)

QWEN35_08B: dict[str, Any] = dict(
    vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
    num_attention_heads=8, num_key_value_heads=2, head_dim=256, linear_conv_kernel_dim=4,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
    linear_num_value_heads=16, tie_word_embeddings=True, max_position_embeddings=32768,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                     "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]},
    initializer_range=0.02,
)  # fmt: skip


def make_checkpoint(path: Path, layers: int) -> None:
    from edgeomni.export.families.qwen3_5.tiny import make_qwen3_5

    if not (path / "config.json").is_file():
        make_qwen3_5(path, **{**QWEN35_08B, "num_hidden_layers": layers})


def state_bytes(layers: int, context: int, itemsize: int = 4) -> dict[str, int]:
    """What a decode step reads of the row state at ``context`` positions: each DeltaNet
    layer's recurrent [Hv, dv, dk] float32 and conv [C, 3] (read, then written in place), each
    attention layer's keys and values; conv and KV in the engine's float of ``itemsize``."""
    c = QWEN35_08B
    attention = layers // 4
    linear = layers - attention
    hv, dk, dv = c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
    conv = 2 * c["linear_num_key_heads"] * dk + hv * dv
    recurrent = linear * (4 * hv * dv * dk + itemsize * conv * (c["linear_conv_kernel_dim"] - 1))
    kv = itemsize * 2 * attention * c["num_key_value_heads"] * c["head_dim"] * context
    return {"recurrent_and_conv": 2 * recurrent, "kv": kv}


def time_prefill(engine: Path, words: int, repeats: int) -> dict[str, float]:
    """A prompt of ``words`` words, one token drawn: the prefill's ms (best of ``repeats``)."""
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    pipe = Pipeline(engine)
    body = {"temperature": 0, "max_generate_length": 1,
            "requests": [{"messages": prompt_messages(words)}]}  # fmt: skip
    requests, _ = parse_request_file(body)
    times = []
    for _ in range(repeats + 1):
        (outcome,) = pipe.run(requests, batch_size=1)
        d = outcome.entry["stages"]["llm"]
        times.append(d["prefill_ms"])
    return {"prefill_ms": min(times[1:]), "prompt_tokens": d["prompt_tokens"]}


def transformers_prefill(ckpt: Path, engine: Path, words: int, repeats: int) -> dict[str, float]:
    """transformers' eager forward over the same prompt (its prefill), best of ``repeats``."""
    import torch
    from transformers import AutoModelForCausalLM

    from edgeomni.runtime.tokenizer import TextTokenizer

    tok = TextTokenizer(engine)
    ids = torch.tensor([tok.encode(tok.apply_chat_template(prompt_messages(words),
                                                           add_generation_prompt=True))])  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32,
                                                 attn_implementation="eager").eval()  # fmt: skip
    times = []
    with torch.no_grad():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            model(ids, use_cache=True)
            times.append((time.perf_counter() - start) * 1e3)
    return {"prefill_ms": min(times[1:]), "prompt_tokens": int(ids.shape[1])}


def main() -> int:
    p = decode_parser(__doc__, "edgeomni-qwen35-bench")
    p.set_defaults(layers=24)
    p.add_argument("--prefill-words", type=int, default=48, help="the build takes 256 tokens")
    p.add_argument("--bandwidth-probes", type=int, default=3, help="before and after the runs")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()

    ckpt = args.work / f"qwen3.5-0.8b-L{args.layers}"
    make_checkpoint(ckpt, args.layers)
    engines = {
        "fp32": (args.work / f"engine-L{args.layers}", {}),
        "int4 g32": (args.work / f"engine-L{args.layers}-int4-g32",
                     {"quantization": "int4_rtn", "group_size": 32}),
    }  # fmt: skip
    build_s = {name: build(ckpt, path, 1024, **q) for name, (path, q) in engines.items()}
    probes = [read_bandwidth_gbs() for _ in range(args.bandwidth_probes)]
    runs = {}
    for name, (path, _) in engines.items():
        decode = time_edgeomni(path, args.new_tokens, args.repeats)
        decode["decode_prompt_tokens"] = decode.pop("prompt_tokens")
        runs[name] = {**decode, **time_prefill(path, args.prefill_words, args.repeats)}
    fp32_engine = engines["fp32"][0]
    eager = time_transformers(ckpt, fp32_engine, "eager", args.new_tokens, args.repeats)
    eager.update(transformers_prefill(ckpt, fp32_engine, args.prefill_words, args.repeats))
    probes += [read_bandwidth_gbs() for _ in range(args.bandwidth_probes)]
    best_bw = max(max(x.values()) for x in probes)
    fp32 = runs["fp32"]
    context = int(fp32["decode_prompt_tokens"]) + args.new_tokens // 2  # KV at mid-generation
    state = state_bytes(args.layers, context)
    rows = {}
    for name, (path, _) in engines.items():
        r = runs[name]
        read = engine_bytes(path) + sum(state.values())
        bound_ms = read / (best_bw * 1e9) * 1e3
        rows[name] = {
            "engine_gb": round(engine_bytes(path) / 1e9, 3),
            "step_ms": round(r["step_ms"], 2),
            "step_ms_median": round(r["step_ms_median"], 2),
            "tok_s": round(1e3 / r["step_ms"], 2),
            "decode_vs_transformers_eager": round(eager["step_ms"] / r["step_ms"], 2),
            "bytes_per_step_gb": round(read / 1e9, 3),
            "bound_step_ms": round(bound_ms, 2),
            "fraction_of_bandwidth_bound": round(bound_ms / r["step_ms"], 3),
            "prefill_ms": round(r["prefill_ms"], 1),
            "prefill_tok_s": round(r["prompt_tokens"] / r["prefill_ms"] * 1e3, 1),
            "prefill_vs_transformers_eager": round(eager["prefill_ms"] / r["prefill_ms"], 2),
            "greedy_agreement_with_fp32": sum(
                a == b for a, b in zip(r["tokens"], fp32["tokens"], strict=True)
            ) / len(fp32["tokens"]),
            "build_s": round(build_s[name], 1),
        }  # fmt: skip
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "dims": {**QWEN35_08B, "num_hidden_layers": args.layers},
        "new_tokens": args.new_tokens,
        "prefill_prompt_tokens": fp32["prompt_tokens"],
        "best_read_bandwidth_gbs": round(best_bw, 2),
        "bandwidth_probes_gbs": [round(max(x.values()), 2) for x in probes],
        "state_bytes_per_step": state,
        "transformers_eager": {
            "step_ms": round(eager["step_ms"], 2),
            "step_ms_median": round(eager["step_ms_median"], 2),
            "prefill_ms": round(eager["prefill_ms"], 1),
            "tokens_equal_fp32_engine": eager["tokens"] == fp32["tokens"],
        },
        "engines": rows,
    }
    print(json.dumps(result, indent=2))
    print("\n| engine | GB | step ms | tok/s | vs transformers eager | % of bound | prefill ms "
          "| prefill vs transformers |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['engine_gb']} | {r['step_ms']} | {r['tok_s']} | "
              f"{r['decode_vs_transformers_eager']}x | "
              f"{100 * r['fraction_of_bandwidth_bound']:.0f}% | {r['prefill_ms']} | "
              f"{r['prefill_vs_transformers_eager']}x |")  # fmt: skip
    e = result["transformers_eager"]
    print(f"| transformers eager (fp32) | | {e['step_ms']} | | 1x | | {e['prefill_ms']} | 1x |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
