"""LLM decode on one GPU: edgeomni (ONNX Runtime CUDA provider, float16 engine, KV cache in
device memory) against transformers' generate (bf16, sdpa) in the same run, at Qwen3-0.6B
dimensions.

Prints tokens/s for both at each batch size, the ratio, and the step time against the HBM
bound (bytes read per step / measured device copy bandwidth). Run it on the GPU machine:

    python bench/gpu_llm.py --batch 1 8 [--layers 28] [--new-tokens 64] [--out DIR]

--out DIR writes DIR/gpu_llm.json and DIR/gpu_llm.md (bench/gpu_all.sh puts both GPU benchmarks'
results in one folder this way).
"""

from __future__ import annotations

import json
import platform
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from llm_decode_cpu import QWEN3_06B, decode_parser, make_checkpoint, prompt_messages  # noqa: E402


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 2 GiB: read + write bytes / time, best of 10."""
    import torch

    src = torch.empty(1 << 29, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best / 1e9


def bytes_per_step(layers: int, batch: int, context: int, itemsize: int = 2) -> float:
    c = {**QWEN3_06B, "num_hidden_layers": layers}
    h, i, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i
    weights = itemsize * (layers * per_layer + h * c["vocab_size"])
    return weights + itemsize * 2 * layers * kv * context * batch


def edgeomni_step(
    engine: Path, batch: int, new_tokens: int, repeats: int
) -> tuple[float, int, float]:
    """Best ms per decode step, the prompt length, and the ms of that step spent inside the
    engine's run call (the rest is host work: inputs, the top-K copy, sampling)."""
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    pipe = Pipeline(engine)
    body = {
        "temperature": 0,
        "max_generate_length": new_tokens,
        "min_generate_length": new_tokens,  # a fixed number of steps
        "requests": [{"messages": prompt_messages(48)} for _ in range(batch)],
    }
    requests, _ = parse_request_file(body)
    best, prompt, engine_ms = float("inf"), 0, 0.0
    for i in range(repeats + 1):
        outcomes = pipe.run(requests, batch_size=batch)
        d = outcomes[0].entry["stages"]["llm"]
        step = d["decode_ms"] / d["decode_steps"]
        if i and step < best:  # the first run warms up
            best, engine_ms = step, d["decode_engine_ms"] / d["decode_steps"]
        prompt = d["prompt_tokens"]
    return best, prompt, engine_ms


def transformers_step(ckpt: Path, engine: Path, batch: int, new_tokens: int, repeats: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    from edgeomni.runtime.tokenizer import TextTokenizer

    tok = TextTokenizer(engine)
    text = tok.apply_chat_template(prompt_messages(48), add_generation_prompt=True)
    ids = torch.tensor([tok.encode(text)] * batch, device="cuda")
    model = (
        AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16, attn_implementation="sdpa")
        .to("cuda")
        .eval()
    )

    def gen(n: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(
                ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None
            )
        torch.cuda.synchronize()
        return time.perf_counter() - start

    gen(2)
    best = float("inf")
    for _ in range(repeats):
        best = min(best, (gen(new_tokens) - gen(1)) / (new_tokens - 1) * 1e3)
    return best


def markdown(result: dict) -> str:
    """The table docs/benchmarks.md keeps for this benchmark."""
    lines = [
        f"### LLM decode, Qwen3-0.6B dimensions ({result['layers']} layers), {result['gpu']} "
        f"({result['date']})",
        "",
        f"{result['new_tokens']} greedy tokens; edgeomni float16 engine on ONNX Runtime "
        f"{result['onnxruntime']} (CUDA provider), transformers {result['transformers']} bf16 + "
        f"sdpa; build {result['build_s']} s; device copy bandwidth "
        f"{result['copy_bandwidth_gbs']} GB/s.",
        "",
        "| batch | edgeomni step | of which in the engine | tok/s | transformers step | tok/s | "
        "speed-up | bytes/step (fp16) | HBM bound | edgeomni / bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['batch']} | {r['edgeomni_step_ms']:.2f} ms | "
            f"{r.get('edgeomni_engine_ms', float('nan')):.2f} ms | {r['edgeomni_tok_s']} | "
            f"{r['transformers_step_ms']:.2f} ms | {r['transformers_tok_s']} | "
            f"**{r['speedup']}x** | {r['bytes_per_step_gb']} GB | {r['hbm_bound_ms']} ms | "
            f"{r['edgeomni_over_bound']}x |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    p = decode_parser(__doc__, "edgeomni-gpu", batch=True)
    p.add_argument("--json", type=Path)
    p.add_argument("--out", type=Path, help="write gpu_llm.json and gpu_llm.md here")
    args = p.parse_args()

    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    ckpt, engine = args.work / f"qwen3-0.6b-L{args.layers}", args.work / f"cuda-L{args.layers}"
    make_checkpoint(ckpt, args.layers)
    start = time.perf_counter()
    if not (engine / "multistage_config.json").is_file():
        build(ckpt, engine, BuildArgs(max(args.batch), 256, 512, device="cuda", dtype="float16"))
    build_s = time.perf_counter() - start
    bw = copy_bandwidth_gbs()
    rows = []
    for batch in args.batch:
        ours, prompt, ours_engine = edgeomni_step(engine, batch, args.new_tokens, args.repeats)
        ref = transformers_step(ckpt, engine, batch, args.new_tokens, args.repeats)
        traffic = bytes_per_step(args.layers, batch, prompt + args.new_tokens // 2)
        bound = traffic / (bw * 1e9) * 1e3
        rows.append({
            "batch": batch,
            "edgeomni_step_ms": round(ours, 3),
            "edgeomni_engine_ms": round(ours_engine, 3),  # of the step, inside the engine call
            "transformers_step_ms": round(ref, 3),
            "edgeomni_tok_s": round(batch * 1e3 / ours, 1),
            "transformers_tok_s": round(batch * 1e3 / ref, 1),
            "speedup": round(ref / ours, 2),
            "bytes_per_step_gb": round(traffic / 1e9, 3),
            "hbm_bound_ms": round(bound, 3),
            "edgeomni_over_bound": round(ours / bound, 1),
        })  # fmt: skip
    import onnxruntime
    import torch
    import transformers

    result = {
        "date": time.strftime("%Y-%m-%d"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "gpu": torch.cuda.get_device_name(0),
        "host": platform.machine(),
        "onnxruntime": onnxruntime.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "layers": args.layers,
        "new_tokens": args.new_tokens,
        "build_s": round(build_s, 1),
        "copy_bandwidth_gbs": round(bw, 1),
        "rows": rows,
    }
    print(json.dumps(result, indent=2))
    for r in rows:
        print(
            f"B={r['batch']}: edgeomni {r['edgeomni_tok_s']} tok/s ({r['edgeomni_step_ms']} ms/step) vs "
            f"transformers {r['transformers_tok_s']} tok/s -> {r['speedup']}x; "
            f"{r['edgeomni_over_bound']}x the HBM bound ({r['hbm_bound_ms']} ms)"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_llm.json").write_text(json.dumps(result, indent=2) + "\n")
        text = markdown(result)
        (args.out / "gpu_llm.md").write_text(text)
        print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
