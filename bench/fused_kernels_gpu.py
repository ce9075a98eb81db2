"""Where a fused decoder step's device time goes: each kernel of one Qwen3-0.6B layer, the LM
head and the top-K, timed alone at real dimensions (float16 weights), with the bytes it must
read and the bandwidth that makes. Run it on the GPU machine:

    python bench/fused_kernels_gpu.py [--batch 1 8 32] [--context 64] [--repeats 200] [--out DIR]

Each kernel is launched ``--repeats`` times back to back in one captured CUDA graph, timed by
two CUDA events around its replay (a launch's device-side gap is in the figure, as it is in
the engine's graphs), once plainly and once as programmatic dependent launches (``overlap``: each
launch may start while the one before runs, as the engine queues them on sm_90+); each linear
is timed again at every split of K over 1 to 8 warps. The step estimate is 28 layers of the
per-layer kernels plus the head and the top-K (qk_rope and attention apart, as prefills run
them). The decode attention with the q/k norm and rotary inside (what decode calls run instead
of those two) and the code predictor's tail (a top 64 of 2048 codes and the in-engine draw, one
kernel) are timed for the record, outside the estimate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

H, HEADS, KV, D, INTER, VOCAB, LAYERS = 1024, 16, 8, 128, 3072, 151936, 28
CP_VOCAB = 2048  # Qwen3-TTS's code predictor: its top-K and draw, timed for the record


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--out", type=Path)
    args = p.parse_args()

    from edgeomni.plugins import attention_cuda as ac
    from edgeomni.plugins import decoder_cuda as dc
    from edgeomni.plugins import decoder_linear_cuda as lc
    from edgeomni.plugins.decoder_cuda import f32, i32, i64, ptr
    from edgeomni.runtime import memory
    from edgeomni.runtime.memory import DeviceArray

    memory.stream(0)
    cudart = memory._cudart()
    stream = memory.stream(0)
    cu_stream = ac.stream_handle(stream)
    kernels = dc.DecoderKernels(dc.Variant("float16", "float16"))
    attention = ac.CudaAttention(ac.KernelConfig(HEADS, KV, D, dtype="float16"))
    # decode calls' attention as the engine runs it: q/k norm and rotary inside (no qk_rope)
    attention_qk = ac.CudaAttention(ac.KernelConfig(HEADS, KV, D, dtype="float16", fused_qk=1))
    rng = np.random.default_rng(0)

    def dev(shape: tuple[int, ...], dtype, scale: float = 0.02) -> DeviceArray:
        buf = DeviceArray.zeros(shape, dtype)
        if np.dtype(dtype).kind == "f":
            buf.upload((rng.standard_normal(shape) * scale).astype(dtype))
        return buf

    def timed(launch) -> float:
        """ms per launch: ``args.repeats`` of them captured back to back in one CUDA graph,
        the graph replayed (Python's ~10 us a launch would otherwise be what is measured)."""
        start = memory._check(cudart.cudaEventCreate(), "cudaEventCreate")
        end = memory._check(cudart.cudaEventCreate(), "cudaEventCreate")
        launch()
        memory.synchronize(0)
        mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        memory._check(cudart.cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture")
        try:
            for _ in range(args.repeats):
                launch()
        finally:
            graph = memory._check(cudart.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
        replay = memory._check(cudart.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
        memory._check(cudart.cudaGraphLaunch(replay, stream), "cudaGraphLaunch")  # warm
        memory._check(cudart.cudaEventRecord(start, stream), "cudaEventRecord")
        memory._check(cudart.cudaGraphLaunch(replay, stream), "cudaGraphLaunch")
        memory._check(cudart.cudaEventRecord(end, stream), "cudaEventRecord")
        memory._check(cudart.cudaEventSynchronize(end), "cudaEventSynchronize")
        ms = memory._check(cudart.cudaEventElapsedTime(start, end), "cudaEventElapsedTime")
        return ms / args.repeats

    qkv_n = (HEADS + 2 * KV) * D
    weights = {"qkv": dev((qkv_n, H), np.float16), "o": dev((H, HEADS * D), np.float16),
               "gate_up": dev((2 * INTER, H), np.float16), "down": dev((H, INTER), np.float16),
               "lm_head": dev((VOCAB, H), np.float16)}  # fmt: skip
    norm = dev((H,), np.float32, 1.0)
    rows_out = []
    def one_batch(batch: int) -> None:
        t = batch
        h = dev((t, H), np.float32, 1.0)
        qkv = dev((t, qkv_n), np.float32, 1.0)
        q, k, v = (dev((t, n * D), np.float16, 1.0) for n in (HEADS, KV, KV))
        attn = dev((t, HEADS * D), np.float16, 1.0)
        act = dev((t, INTER), np.float32, 1.0)
        logits = dev((batch, VOCAB), np.float32, 1.0)
        cache_k, cache_v = (dev((batch, KV, 4096, D), np.float16, 1.0) for _ in range(2))
        past = DeviceArray.zeros((batch,), np.int32)
        past.upload(np.full(batch, args.context, np.int32))
        ones = DeviceArray.zeros((batch,), np.int32)
        ones.upload(np.ones(batch, np.int32))
        pos = DeviceArray.zeros((1, t), np.int64)
        pos.upload(np.full((1, t), args.context, np.int64))
        last = DeviceArray.zeros((batch,), np.int64)
        inv = dev((D // 2,), np.float32, 1.0)
        qn = dev((D,), np.float32, 1.0)
        chunks = -(-VOCAB // dc.TOPK_CHUNK)
        cand_v, cand_i = dev((batch, chunks * 64), np.float32), dev((batch, chunks * 64), np.int32)
        top_v, top_i = dev((batch, 64), np.float32), dev((batch, 64), np.int64)
        top_h, logits_h = dev((batch, 64), np.float16), dev((batch, CP_VOCAB), np.float16)
        no_draw = [ptr(None)] * 6 + [i32(0), ptr(None), ptr(None)]
        scalars = {"u": (np.full(batch, 0.5), np.float64), "t": (np.ones(1), np.float64),
                   "k": (np.full(1, 50), np.int64), "p": (np.full(1, 0.8), np.float64),
                   "head": (np.zeros(1), np.int64)}  # fmt: skip
        held = {}
        for key, (value, dtype) in scalars.items():
            held[key] = DeviceArray.zeros(value.shape, dtype)
            held[key].upload(value.astype(dtype))
        tables = dev((CP_VOCAB, H), np.float16, 1.0)
        drawn, embeds = dev((batch,), np.int64), dev((batch, H), np.float16)
        draw = [*(ptr(held[key].ptr) for key in scalars), ptr(tables.ptr), i32(H),
                ptr(drawn.ptr), ptr(embeds.ptr)]

        def linear(x, w, out, kk, n, *, normed=False, swiglu=False, store=lc.STORE_SET,
                   half_x=False, rows=t, rowmap=None):  # noqa: ANN001, ANN202
            a = [ptr(x.ptr), ptr(rowmap.ptr if rowmap else None), i32(1),
                 ptr(norm.ptr if normed else None), f32(1e-6), ptr(w.ptr), i64(0), ptr(None),
                 ptr(None), ptr(out.ptr), i32(rows), i32(kk), i32(n), i32(store)]

            def run(warps: int | None = None, overlap: bool = False) -> None:
                plan = lc.linear_launch("float16", rows, kk, n, half_input=half_x,
                                        swiglu=swiglu, warps=warps)  # fmt: skip
                kernels.launch(plan.name, plan.grid, plan.block, a, stream=cu_stream,
                               overlap=overlap)  # fmt: skip

            run.k = kk  # type: ignore[attr-defined]
            run.default_warps = lc.linear_launch(  # type: ignore[attr-defined]
                "float16", rows, kk, n, half_input=half_x, swiglu=swiglu).block // 32
            return run

        mma = lc.linear_uses_mma("float16", t)
        rope = dc.rope_launch(t, HEADS + 2 * KV, D)
        rope_args = [ptr(qkv.ptr), ptr(pos.ptr), i32(t), ptr(qn.ptr), ptr(qn.ptr), f32(1e-6),
                     ptr(inv.ptr), ptr(None), ptr(q.ptr), ptr(k.ptr), ptr(v.ptr), i32(HEADS),
                     i32(KV), i32(D), i32(0), i32(D)]  # fmt: skip
        parts = {
            "qkv (norm fused)": (linear(h, weights["qkv"], qkv, H, qkv_n, normed=True),
                                 qkv_n * H * 2),
            "qk_rope": (lambda overlap=False: kernels.launch(
                "qk_rope", rope[0], rope[1], rope_args, shared=rope[2], stream=cu_stream,
                overlap=overlap), 0),
            "attention": (lambda overlap=False: attention.launch(
                q.ptr, k.ptr, v.ptr, cache_k.ptr, cache_v.ptr, past.ptr, ones.ptr, attn.ptr,
                batch=batch, seq=1, capacity=4096, stream=cu_stream, overlap=overlap),
                2 * batch * KV * (args.context + 1) * D * 2),
            "attention with q/k norm, rotary (decode)": (lambda overlap=False: attention_qk.launch(
                0, 0, 0, cache_k.ptr, cache_v.ptr, past.ptr, ones.ptr, attn.ptr, batch=batch,
                seq=1, capacity=4096, stream=cu_stream, overlap=overlap,
                qk=ac.FusedQK(qkv.ptr, pos.ptr, qn.ptr, qn.ptr, 1e-6, inv.ptr)),
                2 * batch * KV * (args.context + 1) * D * 2),
            "o (+residual)": (linear(attn, weights["o"], h, HEADS * D, H, store=lc.STORE_ADD,
                                     half_x=True), H * HEADS * D * 2),
            # as the engine runs them: SwiGLU's output in float16 where down is on tensor cores
            "gate_up (norm, SwiGLU)": (linear(h, weights["gate_up"], act, H, INTER, normed=True,
                                              swiglu=True,
                                              store=lc.STORE_HALF if mma else lc.STORE_SET),
                                       2 * INTER * H * 2),
            "down (+residual)": (linear(act, weights["down"], h, INTER, H, store=lc.STORE_ADD,
                                        half_x=mma), H * INTER * 2),
            "lm_head (norm fused)": (linear(h, weights["lm_head"], logits, H, VOCAB, normed=True,
                                            rows=batch, rowmap=last), VOCAB * H * 2),
            "topk (2 kernels)": (lambda overlap=False: (
                kernels.launch("topk_chunks", (chunks, batch), 512,
                               [ptr(logits.ptr), ptr(None), i32(VOCAB), i32(64), ptr(None),
                                ptr(cand_v.ptr), ptr(cand_i.ptr)], stream=cu_stream,
                               overlap=overlap),
                kernels.launch("topk_merge", (batch,), 512,
                               [ptr(cand_v.ptr), ptr(cand_i.ptr), i32(chunks * 64), i32(64),
                                ptr(top_v.ptr), ptr(top_i.ptr), ptr(None), i32(VOCAB),
                                *no_draw], stream=cu_stream, overlap=overlap)), 0),
            # the code predictor's tail: a top 64 of 2048 codes, float16 copies, the draw (and
            # without the draw, to tell the two apart)
            "topk_one + draw (V 2048)": (lambda overlap=False: kernels.launch(
                "topk_one", (1, batch), 512,
                [ptr(logits.ptr), ptr(None), i32(CP_VOCAB), i32(64), ptr(logits_h.ptr),
                 ptr(top_v.ptr), ptr(top_i.ptr), ptr(top_h.ptr), *draw], stream=cu_stream,
                overlap=overlap), 0),
            "topk_one (V 2048)": (lambda overlap=False: kernels.launch(
                "topk_one", (1, batch), 512,
                [ptr(logits.ptr), ptr(None), i32(CP_VOCAB), i32(64), ptr(logits_h.ptr),
                 ptr(top_v.ptr), ptr(top_i.ptr), ptr(top_h.ptr), *no_draw], stream=cu_stream,
                overlap=overlap), 0),
        }  # fmt: skip
        per_layer = ("qkv (norm fused)", "qk_rope", "attention", "o (+residual)",
                     "gate_up (norm, SwiGLU)", "down (+residual)")  # fmt: skip
        step = {False: 0.0, True: 0.0}
        for name, (launch, nbytes) in parts.items():
            times = LAYERS if name in per_layer else 1
            for overlap in (False, True):
                go = lambda launch=launch, overlap=overlap: launch(overlap=overlap)  # noqa: E731
                ms = timed(go)
                if not name.startswith(("topk_one", "attention with")):  # (reported apart)
                    step[overlap] += ms * times
                row = {"batch": batch, "kernel": name, "overlap": overlap,
                       "us": round(ms * 1e3, 2),
                       "gb_s": round(nbytes / (ms * 1e-3) / 1e9, 1) if nbytes else None,
                       "per_step_ms": round(ms * times, 3)}  # fmt: skip
                rows_out.append(row)
                print(json.dumps(row), flush=True)
            inner = getattr(launch, "k", None)  # (not ``k``: the attention's keys are k)
            if inner is None:
                continue
            for warps in range(1, lc.MAX_WARPS + 1):  # the other splits of K, for the record
                ms = timed(lambda launch=launch, warps=warps: launch(warps=warps, overlap=True))
                row = {"batch": batch, "kernel": name, "overlap": True, "warps": warps,
                       "default_warps": launch.default_warps,
                       "us": round(ms * 1e3, 2),
                       "gb_s": round(nbytes / (ms * 1e-3) / 1e9, 1)}  # fmt: skip
                rows_out.append(row)
                print(json.dumps(row), flush=True)
        print(json.dumps({"batch": batch, "estimated_step_ms": round(step[False], 3),
                          "estimated_step_ms_overlap": round(step[True], 3)}), flush=True)

    for batch in args.batch:
        one_batch(batch)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fused_kernels_gpu.json").write_text(json.dumps(
            {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
             "rows": rows_out}, indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
