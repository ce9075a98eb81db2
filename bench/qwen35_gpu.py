"""Qwen3.5 on one GPU: edgeomni (ONNX Runtime's CUDA provider) against transformers in the same
run, and greedy parity of the CUDA engines with transformers on a tiny checkpoint.

1. Parity: a tiny random Qwen3.5 (export/families/qwen3_5/tiny.py) built for cuda in float32,
   three prompts of different lengths through two rows (requests joining and leaving): each
   request's greedy tokens against transformers' float32 generate on the same checkpoint.
2. Speed: a random-weight checkpoint at Qwen3.5-0.8B's text dimensions (bench/qwen35_cpu.py's),
   built for cuda in float16; decode steps at each batch size and one prefill, against
   transformers' bf16 generate (sdpa) on the same GPU; each decode step beside its HBM bound
   (bytes read a step: float16 weights, the DeltaNet layers' float32 state read and written,
   the attention layers' KV at mid-generation, over the device copy bandwidth).

Which DeltaNet lowering the engines got depends on the onnxruntime that built them
(GatedDeltaNet and CausalConvWithState from 1.32, the plain-ONNX Loop before): printed.

    python bench/qwen35_gpu.py [--work DIR] [--layers 24] [--batch 1 8] [--new-tokens 64]
                               [--out DIR]
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from gpu_llm import copy_bandwidth_gbs, edgeomni_step, transformers_step  # noqa: E402
from llm_decode_cpu import decode_parser  # noqa: E402
from qwen35_cpu import QWEN35_08B, make_checkpoint, state_bytes  # noqa: E402

PROMPTS = ["Hello! How are you today?", "Hi",
           "The quick brown fox jumps over the lazy dog. Speech models turn text into audio."]  # fmt: skip


def parity(work: Path) -> dict[str, Any]:
    """The tiny checkpoint's cuda float32 engine against transformers, greedy, 2 rows."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from edgeomni.builder.build import build
    from edgeomni.export.families.qwen3_5.tiny import make_qwen3_5
    from edgeomni.export.family import BuildArgs
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    ckpt, engine = work / "tiny", work / "tiny-cuda-fp32"
    if not (ckpt / "config.json").is_file():
        make_qwen3_5(ckpt)
    if not (engine / "multistage_config.json").is_file():
        build(ckpt, engine, BuildArgs(2, 64, 128, device="cuda", dtype="float32"))
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(ckpt)
    lengths = [12, 5, 9]
    expected = []
    for prompt, n in zip(PROMPTS, lengths, strict=True):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                      add_generation_prompt=True, return_tensors="pt")  # fmt: skip
        ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, do_sample=False)
        expected.append(out[0, ids.shape[1] :].tolist())
    body = {"top_k": 1, "requests": [
        {"messages": [{"role": "user", "content": p}], "max_generate_length": n}
        for p, n in zip(PROMPTS, lengths, strict=True)]}  # fmt: skip
    requests, _ = parse_request_file(body)
    outcomes = Pipeline(engine).run(requests, batch_size=2)
    got = [o.entry["stages"]["llm"]["output_tokens"] for o in outcomes]
    cfg = json.loads((engine / "config.json").read_text())
    return {"equal": got == expected, "edgeomni": got, "transformers": expected,
            "lowering": cfg.get("lowering")}  # fmt: skip


def main() -> int:
    p = decode_parser(__doc__, "edgeomni-qwen35-gpu", batch=True)
    p.set_defaults(layers=24)
    p.add_argument("--out", type=Path, help="write qwen35_gpu.json here")
    p.add_argument("--skip-parity", action="store_true")
    args = p.parse_args()

    import onnxruntime
    import torch
    import transformers

    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "gpu": torch.cuda.get_device_name(0),
        "onnxruntime": onnxruntime.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if not args.skip_parity:
        result["parity"] = parity(args.work)
        print(json.dumps(result["parity"], indent=2), flush=True)
    ckpt = args.work / f"qwen3.5-0.8b-L{args.layers}"
    engine = args.work / f"cuda-fp16-L{args.layers}"
    make_checkpoint(ckpt, args.layers)
    start = time.perf_counter()
    if not (engine / "multistage_config.json").is_file():
        build(ckpt, engine, BuildArgs(max(args.batch), 256, 512, device="cuda", dtype="float16"))
    result["build_s"] = round(time.perf_counter() - start, 1)
    result["lowering"] = json.loads((engine / "config.json").read_text()).get("lowering")
    bw = copy_bandwidth_gbs()
    c = {**QWEN35_08B, "num_hidden_layers": args.layers}
    h, inter, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    params = sum(t.numel() for t in _meta_module(ckpt).parameters())
    rows = []
    for batch in args.batch:
        ours, prompt, ours_engine = edgeomni_step(engine, batch, args.new_tokens, args.repeats)
        ref = transformers_step(ckpt, engine, batch, args.new_tokens, args.repeats)
        state = state_bytes(args.layers, prompt + args.new_tokens // 2, itemsize=2)
        traffic = 2 * params + batch * sum(state.values())
        bound = traffic / (bw * 1e9) * 1e3
        rows.append({"batch": batch, "edgeomni_step_ms": round(ours, 3),
                     "edgeomni_engine_ms": round(ours_engine, 3),
                     "transformers_step_ms": round(ref, 3), "speedup": round(ref / ours, 2),
                     "bytes_per_step_gb": round(traffic / 1e9, 3),
                     "hbm_bound_ms": round(bound, 3),
                     "fraction_of_hbm_bound": round(bound / ours, 3)})  # fmt: skip
        print(rows[-1], flush=True)
    result.update(layers=args.layers, dims=c, params=params, new_tokens=args.new_tokens,
                  copy_bandwidth_gbs=round(bw, 1), rows=rows, hidden=h, ffn=inter, vocab=v)
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "qwen35_gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _meta_module(ckpt: Path) -> Any:
    """The engine's module on the meta device: its parameters are the weights a step reads
    (the embedding table stays on the host; the tied lm_head is the engine's copy of it)."""
    import torch

    from edgeomni.export.common.checkpoint import open_checkpoint
    from edgeomni.export.families.qwen3_5.model import Qwen35CausalLM, config_from

    with torch.device("meta"):
        return Qwen35CausalLM(config_from(open_checkpoint(ckpt).config))


if __name__ == "__main__":
    sys.exit(main())
