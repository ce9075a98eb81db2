"""Code-predictor speculation, one measured try (issue 34): TensorRT Edge-LLM 0.11's idea (a
later depth's head applied to the current hidden state drafts the next codes; one call of the
code predictor over the code and its drafts verifies them exactly) measured on what this
machine has, in two parts.

1. Acceptance (CPU, torch, float32): the code predictor's greedy frame loop on a random model
   at Qwen3-TTS 0.6B's dimensions (5 layers, 15 heads, 2048 codes), each step's final hidden
   state put through every later head: ``drafts[g][j]`` is head ``g-1+j`` on the hidden state
   that gave code ``g``, a draft of code ``g+j``. From them, for verify sizes S, the calls a
   frame would take after its first code (a call feeds the code and S-1 drafts, keeps the
   drafts up to the first wrong one and the true code after it), against 14 one-code steps.
   Exactness needs nothing more: a verify call's rows are the plain loop's steps, and a
   sampled draw reads the uniform of its group (runtime/speech/code_predictor.py stages one a
   group), so the codes are the plain loop's whatever was accepted.
2. Cost (``--gpu``, the H200): the fused engine's call of width S (1, 2, 4, 8 rows a request)
   as a frame graph runs it: 14 calls captured as one CUDA graph, per call. A verify call also
   needs the heads of S positions and the drafts' heads, up to 2S-1 distinct [2048, 1024]
   float16 matrices: added at the measured copy bandwidth (modelled, not run).

Random weights draft nothing (the acceptance comes out ~1/2048); the checkpoints that would
show a real rate cannot be downloaded here. What the run settles is the price: the acceptance
each verify size needs to break even, printed from the measured call times.

    python bench/cp_speculation.py [--frames 20] [--verify 2 4 8]          # part 1
    python bench/cp_speculation.py --gpu [--batch 1 8 32] --out DIR         # both (H200)
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

# Qwen3-TTS 0.6B's code predictor (bench/fused_gpu.py's DECODERS["code_predictor"])
DIMS = {"hidden_size": 1024, "num_layers": 5, "num_heads": 16, "num_kv_heads": 8,
        "head_dim": 128, "intermediate_size": 3072, "vocab_size": 2048, "lm_heads": 15}  # fmt: skip
STEPS = 14  # one-code steps of a frame after its first residual code


def verify_calls(codes: np.ndarray, drafts: dict[int, dict[int, int]], size: int) -> int:
    """Calls to go from code 1 to the frame's last code ``len(codes) - 1`` with verify size
    ``size``: at frontier g a call feeds code g and drafts g+1..g+size-1, gives the true codes
    g+1..g+size, and the frontier moves past the drafts that matched plus one."""
    last, g, calls = len(codes) - 1, 1, 0
    while g < last:
        width = min(size, last - g)
        matched = 0
        while matched < width - 1 and drafts[g][matched + 1] == codes[g + matched + 1]:
            matched += 1
        g += matched + 1
        calls += 1
    return calls


def acceptance(frames: int, sizes: list[int], seed: int = 0, dims: dict | None = None,
               zero_heads: bool = False) -> dict:  # fmt: skip
    """Part 1. ``zero_heads``: every head zero, so every draft (code 0) is right (the check
    that the loop and the counting see acceptance where there is some)."""
    import torch

    from edgeomni.export.common.decoder import CausalLM, DecoderConfig

    fields = dict(dims or DIMS)
    cfg = DecoderConfig(rms_norm_eps=1e-6, rope_theta=1e6, last_hidden_output=True, **fields)
    torch.manual_seed(seed)
    module = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.02) if p.dim() > 1 else p.uniform_(0.8, 1.2)
        if zero_heads:
            module.lm_head_t.zero_()
    h, v, groups = cfg.hidden_size, cfg.vocab_size, cfg.lm_heads + 1
    tables = torch.randn(cfg.lm_heads, v, h)  # each head's codes' embeddings (the next input)
    first = torch.randn(v, h)  # the talker's code-0 embeddings
    heads = module.lm_head_t  # [G-1, H, V]
    capacity = groups + 2
    hits = np.zeros(groups)
    tries = np.zeros(groups)
    calls = {s: [] for s in sizes}

    def run(x: torch.Tensor, past: int, cache: list) -> tuple[torch.Tensor, list]:
        n = x.shape[1]
        with torch.no_grad():
            out = module(x, torch.arange(past, past + n)[None], torch.tensor([past], dtype=torch.int32),
                         torch.tensor([n], dtype=torch.int32), torch.tensor([n - 1]),
                         torch.zeros(1, dtype=torch.int64), *cache)  # fmt: skip
        return out[1][0], list(out[2:])  # the final-norm hidden state, the cache

    rng = np.random.default_rng(seed)
    for _ in range(frames):
        cache = [torch.zeros(1, cfg.num_kv_heads, capacity, cfg.head_dim)
                 for _ in range(2 * cfg.num_layers)]  # fmt: skip
        codes = np.zeros(groups, np.int64)
        codes[0] = rng.integers(v)
        talker_hidden = torch.randn(1, 1, h)
        x = torch.cat([talker_hidden, first[codes[0]][None, None]], dim=1)
        hidden, cache = run(x, 0, cache)
        past = 2
        drafts: dict[int, dict[int, int]] = {}
        for g in range(1, groups):
            with torch.no_grad():  # every head from g-1 on, on the hidden state that gives code g
                logits = torch.einsum("h,khv->kv", hidden, heads[g - 1 :])
            best = logits.argmax(-1).numpy()
            codes[g] = best[0]
            drafts[g] = {j: int(best[j]) for j in range(1, len(best))}
            if g < groups - 1:
                hidden, cache = run(tables[g - 1][codes[g]][None, None], past, cache)
                past += 1
        for g in range(1, groups - 1):
            for j, d in drafts[g].items():
                tries[j] += 1
                hits[j] += d == codes[g + j]
        for s in sizes:
            calls[s].append(verify_calls(codes, drafts, s))
    rate = {j: round(float(hits[j] / tries[j]), 4) for j in range(1, groups - 1) if tries[j]}
    return {"frames": frames, "acceptance_by_depth": rate,
            "calls_per_frame": {s: float(np.mean(c)) for s, c in calls.items()},
            "one_code_steps": STEPS}  # fmt: skip


def expected_codes(p: float, size: int) -> float:
    """Codes a verify call gives when each draft is right with probability p (independently,
    given the ones before): 1 + p + ... + p^(size-1)."""
    return sum(p**i for i in range(size))


def break_even(ratio: float, size: int) -> float | None:
    """The acceptance at which a verify call of ``ratio`` one-code steps pays for itself."""
    if ratio <= 1:
        return 0.0
    if expected_codes(1.0, size) < ratio:
        return None  # not even every draft right pays
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_codes(mid, size) < ratio else (lo, mid)
    return round(hi, 3)


def queue_calls(sessions: list[Any], x: np.ndarray, greedy: dict[str, np.ndarray]) -> None:
    """A frame's worth of calls of width ``x.shape[1]`` (each with its own head), queued; a
    session each (a call wider than the step widths DecoderSession graphs shares its binding
    with the session's other calls of that width, and a sequence graph freezes each call's
    host feeds in its binding)."""
    from edgeomni.runtime.decoder import text_positions

    batch, size = x.shape[:2]
    q, last = np.full(batch, size, np.int32), np.full(batch, size - 1, np.int64)
    for i in range(STEPS):
        past = np.full(batch, 2 + i * size, np.int32)
        sessions[i].run(x, text_positions(past, size, False), past, q, last, tag=i,
                    wait=False, lm_head_index=np.array([i], np.int64), **greedy)  # fmt: skip


def gpu_costs(batches: list[int], sizes: list[int], repeats: int, work: Path) -> dict:
    """Part 2: ms per call of width S in a graph of 14 calls, on the fused engine."""
    import fused_gpu

    from edgeomni.graph_schema.state import kv_tensors
    from edgeomni.runtime.decoder import DecoderSession
    from edgeomni.runtime.fused_engine import FusedEngine
    from edgeomni.runtime.row_state import RowState

    _, path, meta = fused_gpu.build("code_predictor", work)
    meta["name"] = "code_predictor"
    engine = FusedEngine(path, meta, cuda_graphs=True)
    bw = fused_gpu.copy_bandwidth_gbs()
    head_ms = DIMS["vocab_size"] * DIMS["hidden_size"] * 2 / (bw * 1e9) * 1e3
    memory = engine.buffers
    rows = []
    for batch in batches:
        layers = (meta["num_hidden_layers"], meta["num_key_value_heads"], meta["head_dim"])
        kv = RowState(kv_tensors(*layers, meta.get("dtype", "float32")), batch, 256,
                      engine.buffers)
        outputs = {"logits": (DIMS["vocab_size"],), "sampled_ids": (),
                   "sampled_embeds": (DIMS["hidden_size"],)}  # fmt: skip
        sessions = [DecoderSession(engine, kv, batch, outputs) for _ in range(STEPS)]
        greedy = {"sample_uniform": np.zeros(batch), "sample_temperature": np.ones(1),
                  "sample_top_k": np.ones(1, np.int64), "sample_top_p": np.ones(1)}  # fmt: skip
        dtype = engine.input_types["inputs_embeds"]
        rng = np.random.default_rng(0)
        timed: dict[int, float] = {}
        for size in sizes:
            x = (rng.standard_normal((batch, size, DIMS["hidden_size"])) * 0.5).astype(dtype)
            graph = engine.sequence_graph(functools.partial(queue_calls, sessions, x, greedy))
            graph.launch()
            memory.synchronize()
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                graph.launch()
                memory.synchronize()
                best = min(best, time.perf_counter() - start)
            timed[size] = best / STEPS * 1e3
        for size in sizes:
            # the verify call's other heads: 2S-1 distinct matrices in all, one in the call
            verify = timed[size] + (2 * size - 2) * head_ms
            ratio = verify / timed[1]
            rows.append({"batch": batch, "verify_size": size, "call_ms": round(timed[size], 4),
                         "verify_call_ms": round(verify, 4), "over_one_code_step": round(ratio, 3),
                         "break_even_acceptance": break_even(ratio, size)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    return {"copy_bandwidth_gbs": round(bw, 1), "head_ms": round(head_ms, 4), "rows": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--frames", type=int, default=20, help="frames of the acceptance run")
    p.add_argument("--verify", type=int, nargs="+", default=[2, 4, 8], help="verify sizes S")
    p.add_argument("--gpu", action="store_true", help="also time verify calls on the fused engine")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--work", type=Path, default=Path("/tmp/edgeomni-cp-speculation"))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if any(s < 2 or s > 8 for s in args.verify):
        p.error("--verify sizes are 2..8 (Edge-LLM's --cpSpecVerifySize range)")
    start = time.perf_counter()
    result = {"date": time.strftime("%Y-%m-%d"), "command": " ".join([sys.executable, *sys.argv]),
              "acceptance": acceptance(args.frames, args.verify)}  # fmt: skip
    result["acceptance"]["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result["acceptance"]), flush=True)
    if args.gpu:
        import torch

        result["gpu"] = torch.cuda.get_device_name(0)
        result["cost"] = gpu_costs(args.batch, [1, *args.verify], args.repeats, args.work)
        calls = result["acceptance"]["calls_per_frame"]
        for row in result["cost"]["rows"]:
            s = row["verify_size"]
            if s > 1:  # a frame's 14 steps, as measured calls at the measured acceptance
                one = next(r for r in result["cost"]["rows"]
                           if r["batch"] == row["batch"] and r["verify_size"] == 1)  # fmt: skip
                row["frame_steps_ms_plain"] = round(STEPS * one["call_ms"], 3)
                row["frame_steps_ms_speculating"] = round(calls[s] * row["verify_call_ms"], 3)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cp_speculation.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
