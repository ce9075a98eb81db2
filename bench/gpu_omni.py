"""Qwen3-Omni text to speech on one GPU: edgeomni against transformers in the same run.

A text prompt goes in; the thinker writes text, the talker and code predictor make codec frames,
code2wav vocodes 24 kHz audio. The model has Qwen3-Omni-30B-A3B's per-layer dimensions with
random weights, made here from configs (no download). Both sides do the same fixed work per
request: a ~32-token ChatML prompt, exactly N greedy thinker tokens, exactly F codec frames with
speaker "ethan". edgeomni runs c requests submitted together (c = 1, 4, 16); transformers runs
one request at a time. Written: OUT/gpu_omni.json (raw numbers, config, machine, versions) and
OUT/gpu_omni.md (the table, also printed).

The thinker's layer count is reduced by default (--thinker-layers 4 of 48) to fit the GPU
machine's time and disk: the output says so and adds an estimate scaled to 48 layers. The
checkpoint and engines stay in --work and are reused, so a machine whose commands are limited
to 10 minutes can run `--stop-after build` first and the same command without it next.

    python bench/gpu_omni.py --out DIR [--thinker-layers 4] [--concurrency 1 4 16] [--backend fused]
    python bench/gpu_omni.py --out DIR --backend onnxruntime fused --skip-transformers  # both
    python bench/gpu_omni.py --size tiny --device cpu --concurrency 1 2 --frames 12 \\
        --new-tokens 8 --out /tmp/gpu_omni_tiny            # the script's logic, on a CPU
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from backend_pair import (  # noqa: E402
    BACKENDS,
    compare,
    copy_bandwidth_gbs,
    omni_traffic,
    run_backends,
    write_pair,
)
from gpu_common import (  # noqa: E402
    PEERS,
    PHASES,
    REAL_THINKER_LAYERS,
    SPEAKER,
    Timeline,
    cuda_available,
    free_gpu,
    phase,
    scaled,
    sync,
)
from gpu_omni_hf import run_transformers  # noqa: E402
from gpu_omni_report import machine, markdown, strip_private  # noqa: E402
from omni_cpu import set_window  # noqa: E402

SYSTEM_PROMPT = "You are a voice assistant."
# Qwen3-Omni-30B-A3B-Instruct's published config values (shared/notes/gpu-baseline.md, "Config
# actually used"); the class defaults are not the real model.
REAL_MROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [24, 20, 20],
              "interleaved": True, "mrope_interleaved": True}  # fmt: skip


def accept_layer(thinker_layers: int) -> int:
    """The real talker reads thinker layer 24 of 48; a reduced thinker keeps it when it has more
    than 24 layers, else reads the middle layer (the value must lie below the layer count)."""
    return 24 if thinker_layers > 24 else max(1, thinker_layers // 2)


def real_sizes(thinker_layers: int) -> dict[str, dict[str, Any]]:
    """Per-section config overrides (tiny_omni.SECTIONS) for the real per-layer dimensions.

    The audio and vision encoders stay tiny (TTS does not run them; transformers' model class
    needs them): only their output width must match the thinker's hidden size."""
    return {
        "thinker": dict(
            vocab_size=152064, hidden_size=2048, num_hidden_layers=thinker_layers,
            num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
            num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
            rope_parameters=REAL_MROPE,
        ),
        "audio": dict(output_dim=2048),
        "vision": dict(out_hidden_size=2048),
        "talker": dict(
            vocab_size=3072, hidden_size=1024, intermediate_size=2048, num_hidden_layers=20,
            num_attention_heads=16, num_key_value_heads=2, head_dim=128, num_experts=128,
            num_experts_per_tok=6, moe_intermediate_size=384,
            shared_expert_intermediate_size=768, norm_topk_prob=True, rope_parameters=REAL_MROPE,
        ),
        "talker_top": dict(
            thinker_hidden_size=2048, accept_hidden_layer=accept_layer(thinker_layers),
            num_code_groups=16, codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150,
            codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157,
            speaker_id={"chelsie": 2301, "ethan": 2302, "aiden": 2303}, spatial_merge_size=2,
        ),
        "code_predictor": dict(
            vocab_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=5,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, num_code_groups=16,
            layer_types=["full_attention"] * 5,
        ),
        "code2wav": dict(
            codebook_size=2048, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
            num_attention_heads=16, num_key_value_heads=16, num_quantizers=16,
            sliding_window=72, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2],
            decoder_dim=1536,
        ),
    }  # fmt: skip


# -- checkpoint ------------------------------------------------------------------------------
def make_checkpoint(out_dir: Path, sizes: dict[str, dict[str, Any]], seed: int, device: str,
                    dtype_name: str) -> dict[str, Any]:  # fmt: skip
    """tiny_omni.make_qwen3_omni's checkpoint, built where it is fast: on the GPU in bf16.

    make_qwen3_omni builds on the CPU in float32 with a CPU generator: at real size (6-35 B
    parameters) that is minutes to hours, and 35 B float32 parameters do not fit in 128 GiB. This
    uses the same tokenizer, config, overrides, weight rules (randomize_weights: every matrix
    N(0, 1/fan_in), routers non-zero, so top-k routing spreads over the experts as a trained
    model's does) and processor files, with the model and the generator on ``device``. On the
    CPU in float32 it writes the same weights as make_qwen3_omni with the same seed.
    """
    import torch
    from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration

    from edgeomni.export import tiny_omni as t

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = t.make_omni_tokenizer(out_dir)
    ids = {s: tok.convert_tokens_to_ids(s) for s in t.SPECIALS}
    ids.update({w: tok.encode(w, add_special_tokens=False)[0] for w in t.ROLE_WORDS})
    config = t.omni_config(ids)
    for name, fields in sizes.items():
        target = config
        for attr in t.SECTIONS[name]:
            target = getattr(target, attr)
        for key, value in fields.items():
            setattr(target, key, value)
    dtype = getattr(torch, dtype_name)
    start = time.perf_counter()
    with torch.device(device):  # factory calls (randn in randomize_weights) land on `device`
        model = Qwen3OmniMoeForConditionalGeneration._from_config(config, dtype=dtype).eval()
        generator = torch.Generator(device=device).manual_seed(seed)
        quiet = [ids[s] for s in t.SPECIALS if s != "<|im_end|>"]
        t.randomize_weights(model, generator, never_generated=quiet)
    if device == "cuda":
        sync()
    init_s = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    by_part: dict[str, int] = {}
    for name, p in model.named_parameters():  # by name: the module layout differs by version
        part = next(
            (k for k in ("code_predictor", "audio_tower", "visual", "lm_head") if f"{k}." in name),
            name.split(".")[0],
        )
        by_part[part] = by_part.get(part, 0) + p.numel()
    model.generation_config = GenerationConfig(
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], do_sample=False
    )
    start = time.perf_counter()
    model.save_pretrained(out_dir)
    save_s = time.perf_counter() - start
    (out_dir / "processor_config.json").write_text(
        json.dumps(t.processor_config(), indent=2, sort_keys=True) + "\n"
    )
    (out_dir / "chat_template.jinja").write_text(t.CHAT_TEMPLATE)
    del model
    free_gpu()
    return {
        "params": params,
        "params_by_part": by_part,  # thinker = its text model; lm_head = the thinker's
        "dtype": dtype_name,
        "made_on": device,
        "init_s": round(init_s, 2),
        "save_s": round(save_s, 2),
        "bytes_on_disk": sum(f.stat().st_size for f in out_dir.glob("*.safetensors")),
    }


def ensure_checkpoint(path: Path, sizes: dict[str, dict[str, Any]], seed: int, device: str,
                      dtype: str) -> dict[str, Any]:  # fmt: skip
    """Reuse a complete checkpoint made with the same settings (the stamp is written last)."""
    stamp = path / "bench_stamp.json"
    wanted = {"sizes": sizes, "seed": seed, "dtype": dtype}
    if stamp.is_file():
        info = json.loads(stamp.read_text())
        if info.get("wanted") == json.loads(json.dumps(wanted)):
            return {**info["made"], "reused": True}
    if path.exists():
        shutil.rmtree(path)
    made = make_checkpoint(path, sizes, seed, device, dtype)
    stamp.write_text(json.dumps({"wanted": wanted, "made": made}, indent=2) + "\n")
    return {**made, "reused": False}


def clear_leftovers(work: Path) -> None:
    """A build killed by a time limit leaves its workspace behind (staging dir and raw ONNX,
    each about the size of the checkpoint); on a 64 GB disk the next build would not fit beside
    them. The builder removes its own dead workspaces when it starts (builder/workspace.py),
    but the disk check comes first, so they go here: every engine dir's under WORK, and the
    .partial-/.old- dirs of builds before workspaces. WORK/tmp is torch's and ORT's scratch."""
    from edgeomni.builder.workspace import clean_stale

    for engine in {p.name.split(".edge-build-")[0][1:] for p in work.glob(".*.edge-build-*")}:
        clean_stale(work / engine)
    scratch = work / "tmp"
    stale = [*work.glob(".engine-*.partial-*"), *work.glob(".engine-*.old-*")]
    for path in [*stale, scratch]:
        if path.exists():
            print(f"[gpu_omni] removing leftover {path}", flush=True)
            shutil.rmtree(path, ignore_errors=True)
    scratch.mkdir(parents=True)
    tempfile.tempdir = str(scratch)


def check_disk(work: Path, ckpt_bytes: int) -> None:
    """The build keeps every component's raw ONNX until it ends, beside the engines: about twice
    the checkpoint (float16 engines, bf16 checkpoint) must be free. Stop before building, not
    minutes in: a warning here was followed by "No space left on device" 3 minutes later, on a
    machine whose time is counted."""
    free = shutil.disk_usage(work).free
    need = 2 * ckpt_bytes
    if free < need:
        raise SystemExit(
            f"[gpu_omni] the build needs about {need / 1e9:.0f} GB free; {work} has "
            f"{free / 1e9:.0f} GB (remove other work dirs, or use --work on a larger disk)"
        )


# -- prompts ---------------------------------------------------------------------------------
def make_prompts(ckpt: Path, count: int, target: int) -> list[tuple[list[dict], list[int]]]:
    """``count`` different ChatML prompts (system + user) of about ``target`` tokens each, with
    their token ids as the engine will tokenize them (transformers gets the same ids).

    Different prompts, so a batch's rows do not all route to the same experts."""
    from edgeomni.export.tiny_omni import CORPUS
    from edgeomni.runtime.tokenizer import TextTokenizer

    tok = TextTokenizer(ckpt)
    words = " ".join(CORPUS).split()
    prompts = []
    for i in range(count):
        shift = (11 * i) % len(words)
        pool = words[shift:] + words[:shift]
        for n in range(1, len(pool) + 1):
            messages = [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": " ".join(pool[:n])},
            ]
            ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True))
            if len(ids) >= target:
                break
        prompts.append((messages, ids))
    return prompts


# -- edgeomni --------------------------------------------------------------------------------
def request_body(
    prompts: Sequence[tuple[list[dict], list[int]]], args: argparse.Namespace
) -> dict[str, Any]:
    """The request file: greedy thinker of exactly N tokens, talker of exactly F frames."""
    talker: dict[str, Any] = {
        "talker_max_new_tokens": args.frames + 1,  # the last sampled code gets no frame
        "talker_min_new_tokens": args.frames + 1,
    }
    if args.greedy_talker:
        talker["talker_top_k"] = 1  # the code predictor follows the talker to greedy
    body: dict[str, Any] = {
        "top_k": 1,
        "sampling_seed": args.seed,
        "max_generate_length": args.new_tokens,
        "requests": [
            {"messages": messages, "voice": SPEAKER, "sampling": talker} for messages, _ in prompts
        ],
    }
    body["min_generate_length"] = args.new_tokens
    return body


def stage_id(pipe: Any, runner: str) -> str:
    return next(s.id for s in pipe.graph.stages if s.runner == runner)


def run_batch(pipe: Any, requests: list[Any], c: int) -> dict[str, Any]:
    """All c requests submitted together in one pipe.run; per-request and per-stage numbers."""
    import numpy as np

    live = pipe.batching == "inflight"
    events = Timeline()
    outcomes = pipe.run(requests, batch_size=c, listener=events)
    wall = time.perf_counter() - events.start
    rows, errors = [], []
    for o in outcomes:
        e = o.entry
        if not e["ok"] or o.audio is None:
            errors.append(e.get("error") or "no audio")
            continue
        st = e["stages"]
        audio_s = len(o.audio) / o.sample_rate
        first = st["code2wav"]["first_audio_ms"]
        index = e["request_idx"]
        rows.append({
            "request_idx": e["request_idx"],
            "prompt_tokens": st["thinker"]["prompt_tokens"],
            "thinker_tokens": st["thinker"]["generated_tokens"],
            "frames": st["talker"]["frames"],
            "audio_s": round(audio_s, 4),
            "ttfa_ms_from_cohort_start": first,
            "ttfa_ms": round(events.first_audio[index] * 1e3, 3) if live else None,
            # a player starting at the first audio would then wait this long for the rest
            "stall_ms": st["code2wav"]["stall_ms"],
            # in flight a request is done at its last event; a cohort's all when it ends
            "e2e_ms": round((events.last[index] if live else wall) * 1e3, 3),
            "rtf": round((events.last[index] if live else wall) / audio_s, 4) if audio_s else None,
            "vocode_ms": st["code2wav"]["vocode_ms"],
            "vocoder_windows": st["code2wav"]["windows"],
            "finish": [st["thinker"]["finish_reason"], st["talker"]["finish_reason"]],
            "cohort_size": st["talker"]["cohort_size"],
            "codes_head": np.asarray(o.codes)[:2].tolist(),
            "_codes": o.codes,
        })  # fmt: skip
    first_row = outcomes[0].entry["stages"] if rows else {}
    th, tk = first_row.get("thinker", {}), first_row.get("talker", {})
    vocode = sum(r["vocode_ms"] for r in rows)
    # the runtime reports the windows vocoded inside the talker's loop apart from talker_ms
    talker_cp = tk.get("talker_ms", 0.0) + tk.get("code_predictor_ms", 0.0)
    return {
        "wall_ms": round(wall * 1e3, 3),
        "audio_s": round(sum(r["audio_s"] for r in rows), 4),
        "errors": errors,
        # cohort-wide (one cohort when c <= the build's max batch)
        "thinker_prefill_ms": th.get("prefill_ms"),
        "thinker_decode_ms": th.get("decode_ms"),
        "thinker_ms": round(th.get("prefill_ms", 0.0) + th.get("decode_ms", 0.0), 3),
        "thinker_decode_engine_ms": th.get("decode_engine_ms"),
        "thinker_prefill_engine_ms": th.get("prefill_engine_ms"),
        "talker_ms": tk.get("talker_ms"),
        "code_predictor_ms": tk.get("code_predictor_ms"),
        # inside engine calls (the rest of talker_ms / code_predictor_ms is host work)
        "talker_engine_ms": tk.get("talker_engine_ms"),
        "code_predictor_engine_ms": tk.get("code_predictor_engine_ms"),
        # "engine": the code predictor drew its codes in its graph, its calls queued without
        # waiting (its engine ms is then the time to queue them); frames drawn on the host
        "code_predictor_draws": tk.get("code_predictor_draws"),
        "code_predictor_host_frames": tk.get("code_predictor_host_frames"),
        # steps whose first code the talker's engine drew on the device (SpeechTalker.draw)
        "first_codes_drawn_on_device": tk.get("first_codes_drawn_on_device"),
        "streamed_vocoder_ms": tk.get("streamed_vocoder_ms"),
        "code2wav_ms_sum": round(vocode, 3),
        # window lengths code2wav replays as CUDA graphs (empty: every window run as it came)
        "code2wav_fixed_lengths": first_row.get("code2wav", {}).get("fixed_lengths"),
        # comparable to transformers' talker.generate (talker + code predictor, no vocoder)
        "talker_cp_ms": round(talker_cp, 3),
        # steps whose full logits came to the host (device top-K not enough), where reported
        "full_logit_rows": {
            "thinker": th.get("full_logit_rows"),
            "talker": tk.get("full_logit_rows"),
        },
        "stage_totals": pipe.profile.as_dict()["stages"],
        "requests": rows,
    }


def run_edgeomni(engine: Path, prompts: list[tuple[list[dict], list[int]]],
                 args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    from edgeomni.runtime.engine import Engines
    from edgeomni.runtime.pipeline import Pipeline, Profile
    from edgeomni.runtime.requests import BadRequest, parse_request_file

    options = {"cuda_graphs": not args.no_cuda_graphs, "stream_stages": args.stage_streaming,
               "batching": args.batching}  # fmt: skip
    if args.moe_per_slot:  # the comparison: every MoE call on the per-slot kernels
        from edgeomni.plugins import moe_cuda

        moe_cuda.grouped = lambda *a: False  # type: ignore[assignment]
        options["moe_per_slot"] = True
    if args.host_first_draw:  # the comparison: each step's first codes drawn on the host
        from edgeomni.runtime.speech.talker import SpeechTalker

        SpeechTalker.draw = lambda *a, **k: None  # type: ignore[method-assign]
        options["host_first_draw"] = True
    if args.vocoder_beside:  # the vocoder's calls on a thread (a stream) of their own
        options["vocoder_beside"] = True
    with phase("edgeomni: open pipeline"):
        pipe = Pipeline(engine, engines=Engines(cuda_graphs=options["cuda_graphs"]),
                        stream_stages=args.stage_streaming, batching=args.batching,
                        vocoder_threads=1 if args.vocoder_beside else None)  # fmt: skip
    out: dict[str, Any] = {"pipeline_options": options, "runs": {}}
    for c in args.concurrency:
        body = request_body(prompts[:c], args)
        requests, _ = parse_request_file(body)
        bad = [r.error for r in requests if isinstance(r, BadRequest)]
        if bad:
            raise SystemExit(f"gpu_omni: the runtime rejected the requests: {bad[0]}")
        with phase(f"edgeomni c={c}: warm-up"):
            load_before = pipe.profile.load_seconds
            warm = run_batch(pipe, requests, c)
            load_s = pipe.profile.load_seconds - load_before
        batches = []
        for r in range(args.repeats):
            pipe.profile = Profile()
            with phase(f"edgeomni c={c}: timed run {r + 1}/{args.repeats}"):
                batches.append(run_batch(pipe, requests, c))
        out["runs"][str(c)] = {
            "concurrency": c,
            "warmup_wall_ms": warm["wall_ms"],
            "engine_load_s": round(load_s, 2),
            "batches": batches,
            "summary": summarize(batches, args),
        }
        print(f"[gpu_omni] edgeomni c={c}: {json.dumps(out['runs'][str(c)]['summary'])}")
    del pipe
    free_gpu()
    return out


def summarize(batches: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Pooled over the timed runs: TTFA p50/max and RTF p50 over requests; audio-s/s = all
    audio / all wall; stage times as medians over runs."""
    rows = [r for b in batches for r in b["requests"]]
    if not rows:
        return {"ok": False}
    ttfa = [r["ttfa_ms"] if r["ttfa_ms"] is not None else r["ttfa_ms_from_cohort_start"]
            for r in rows]  # fmt: skip
    wall = sum(b["wall_ms"] for b in batches) / 1e3
    audio = sum(b["audio_s"] for b in batches)
    thinker = statistics.median(b["thinker_ms"] for b in batches)
    out = {
        "ok": not any(b["errors"] for b in batches),
        "requests": len(rows),
        "ttfa_p50_ms": round(statistics.median(ttfa), 1),
        "ttfa_max_ms": round(max(ttfa), 1),
        "stall_p50_ms": round(statistics.median(r["stall_ms"] for r in rows), 1),
        "stall_max_ms": round(max(r["stall_ms"] for r in rows), 1),
        "ttfa_from": "submission" if rows[0]["ttfa_ms"] is not None else "cohort start",
        "rtf_p50": round(statistics.median(r["rtf"] for r in rows), 4),
        "audio_s_per_s": round(audio / wall, 3),
        "audio_s_per_request": round(statistics.median(r["audio_s"] for r in rows), 3),
        "wall_ms_p50": round(statistics.median(b["wall_ms"] for b in batches), 1),
        "thinker_ms": round(thinker, 1),
        "thinker_prefill_ms": round(statistics.median(b["thinker_prefill_ms"] for b in batches), 1),
        "thinker_decode_ms": round(statistics.median(b["thinker_decode_ms"] for b in batches), 1),
        "talker_cp_ms": round(statistics.median(b["talker_cp_ms"] for b in batches), 1),
        "talker_ms": round(statistics.median(b["talker_ms"] for b in batches), 1),
        "code_predictor_ms": round(statistics.median(b["code_predictor_ms"] for b in batches), 1),
        "code2wav_ms_sum": round(statistics.median(b["code2wav_ms_sum"] for b in batches), 1),
        **{
            key: round(statistics.median(b[key] or 0.0 for b in batches), 1)
            for key in (
                "thinker_decode_engine_ms",
                "thinker_prefill_engine_ms",
                "talker_engine_ms",
                "code_predictor_engine_ms",
                "streamed_vocoder_ms",
            )
        },  # fmt: skip
        "code_predictor_draws": batches[0]["code_predictor_draws"],
        "code_predictor_host_frames": max(b["code_predictor_host_frames"] or 0 for b in batches),
        "fixed_work": all(
            r["thinker_tokens"] == args.new_tokens and r["frames"] == args.frames for r in rows
        ),
    }
    if not args.stage_streaming:  # streamed, the thinker's time does not simply add up front
        engine_ms = out["thinker_prefill_engine_ms"] + out["thinker_decode_engine_ms"]
        out.update(scaled(out, rows, batches, args.thinker_layers, engine_ms))
    return out


# -- main ------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, required=True, help="writes gpu_omni.json and gpu_omni.md")
    p.add_argument("--size", choices=("real", "tiny"), default="real",
                   help="real: Qwen3-Omni-30B-A3B per-layer dimensions; tiny: make_qwen3_omni's "
                   "defaults, to exercise the script on a CPU")  # fmt: skip
    p.add_argument("--thinker-layers", type=int, default=4,
                   help=f"thinker layers (real: {REAL_THINKER_LAYERS}); fewer fit the time "
                   "limits, and the output adds a scaled estimate")  # fmt: skip
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="engine device")
    p.add_argument("--dtype", choices=("float16", "float32"),
                   help="engine dtype (default: float16 on cuda, float32 on cpu)")  # fmt: skip
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--new-tokens", type=int, default=64, help="thinker tokens per request")
    p.add_argument("--frames", type=int, default=100, help="codec frames per request (80 ms)")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--window-frames", type=int, default=25, help="edgeomni vocoder window")
    p.add_argument("--first-window-frames", type=int, help="a shorter first window (default: same)")
    p.add_argument("--code2wav-streaming", choices=("windows", "stateful"), default="windows",
                   help="edge-build's --code2wav-streaming: windows (the cuda default) or the "
                   "stateful step, each frame decoded once in chunks")  # fmt: skip
    p.add_argument("--first-chunk-frames", type=int, choices=(1, 2),
                   help="stateful: frames of the first chunk (default: the build's, 2)")
    p.add_argument("--greedy-talker", action="store_true", help="greedy talker on both sides")
    p.add_argument("--logits-topk", type=int,
                   help="engines output each row's K best logits (default: the builder's, 64 "
                   "on cuda where it has the option)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=2, help="edgeomni timed runs per concurrency")
    p.add_argument("--hf-runs", type=int, default=2, help="transformers timed runs")
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--moe-per-slot", action="store_true",
                   help="comparison only: fused MoE calls on the per-slot kernels, none grouped "
                   "by expert (as before grouping)")
    p.add_argument("--host-first-draw", action="store_true",
                   help="comparison only: the talker's first codes drawn on the host from its "
                   "top K, as before the device drew them")
    p.add_argument("--vocoder-beside", action="store_true",
                   help="edgeomni's vocoder calls on a thread of their own, its engine on a CUDA "
                   "stream of its own (edge-infer --vocoder-threads 1)")
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="edgeomni without CUDA graph replay (where the runtime has it)")  # fmt: skip
    p.add_argument("--stop-after", choices=("checkpoint", "build"),
                   help="end after this phase (to split the work over several commands; the "
                   "work dir is reused)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quantization", choices=("int4_rtn",),
                   help="build the decoders int4 (edge-build --quantization)")  # fmt: skip
    p.add_argument(
        "--batching",
        choices=("inflight", "cohort"),
        default="inflight",
        help="edgeomni's batching (edge-infer --batching)",
    )
    p.add_argument(
        "--stage-streaming",
        action="store_true",
        help="the talker streams the thinker's reply (edge-infer's flag)",
    )
    p.add_argument("--backend", choices=BACKENDS, nargs="+", default=["onnxruntime"],
                   help="edge-build's --backend: fused runs the dense code predictor on edgeomni's "
                        "CUDA kernels (the MoE thinker and talker stay on ONNX Runtime); two "
                        "(onnxruntime fused): the run once with each, in this process "
                        "(OUT/<backend>; transformers with the first only), then the two side by "
                        "side with the ratios and the fraction of the HBM bound (OUT/backends.md; "
                        "bench/backend_pair.py)")  # fmt: skip
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edgeomni-gpu-omni")
    args = p.parse_args(argv)
    if len(set(args.backend)) != len(args.backend):
        p.error("--backend: each backend once")
    args.backends, args.backend = args.backend, args.backend[0]
    if "fused" in args.backends and args.device != "cuda":
        p.error("--backend fused: on cuda only")
    if args.first_chunk_frames is not None and args.code2wav_streaming != "stateful":
        p.error("--first-chunk-frames needs --code2wav-streaming stateful")
    if args.size == "tiny":
        args.thinker_layers = 4  # make_qwen3_omni's thinker
    if args.thinker_layers < 2:
        p.error("--thinker-layers must be at least 2")
    if args.frames < 1 or args.new_tokens < 4:
        p.error("--frames must be >= 1 and --new-tokens >= 4 (the talker needs 4 text rows)")
    args.dtype = args.dtype or ("float16" if args.device == "cuda" else "float32")
    args.concurrency = sorted(set(args.concurrency))
    return args


def set_first_chunk(engine: Path, frames: int | None) -> None:
    """The stateful vocoder's first chunk in the graph's code2wav stage config (None: the
    build's)."""
    path = engine / "multistage_config.json"
    graph = json.loads(path.read_text())
    stage = next(s for s in graph["stages"] if s["runner"] == "qwen3_omni.code2wav")
    config = stage.setdefault("config", {})
    if config.get("streaming") != "stateful":
        raise SystemExit(f"{engine}: its code2wav stage does not stream stateful")
    if frames is not None:
        config["first_chunk_frames"] = frames
    path.write_text(json.dumps(graph, indent=2) + "\n")


def both_backends(args: argparse.Namespace, argv: list[str]) -> int:
    """The run once with each backend (one checkpoint; transformers with the first only), then
    the two side by side: OUT/backends.json and OUT/backends.md."""
    args.out.mkdir(parents=True, exist_ok=True)
    codes = run_backends(main, argv, args.backends, args.out, later=["--skip-transformers"])
    if args.stop_after is not None:  # nothing measured to set side by side
        return max(codes.values())
    runs, ckpt, prompt = {}, None, args.prompt_tokens
    for backend in args.backends:
        path = args.out / backend / "gpu_omni.json"
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        edge = result.get("edgeomni") or {"runs": {}}
        runs[backend] = {c: r["summary"] for c, r in edge["runs"].items()}
        ckpt, prompt = Path(result["config"]["checkpoint"]), result["config"]["prompt_tokens_p50"]
    bandwidth = copy_bandwidth_gbs() if args.device == "cuda" else None
    rows = compare(runs, lambda c: omni_traffic(ckpt, c, args.frames, args.new_tokens, prompt),
                   args.new_tokens, args.frames, bandwidth if ckpt else None)  # fmt: skip
    title = (f"Qwen3-Omni {args.size} ({args.thinker_layers} thinker layers, measured; no 48-layer "
             f"estimate here) on {args.device}, {args.new_tokens} thinker tokens and {args.frames} "
             f"frames a request, {args.code2wav_streaming} vocoder: {' and '.join(args.backends)} "
             f"in one run ({time.strftime('%Y-%m-%d %H:%M %Z')})")  # fmt: skip
    write_pair(args.out, "backends", title, rows, bandwidth, codes,
               {"command": shlex.join([sys.executable, *sys.argv]), "checkpoint": str(ckpt)})
    return max(codes.values())


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    args = parse_args(argv)
    if len(args.backends) > 1:
        return both_backends(args, list(sys.argv[1:] if argv is None else argv))
    PHASES.clear()  # a run's own phases (both_backends runs main once a backend)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("edge-build").setLevel(logging.INFO)  # the build's steps, with times
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    on_gpu = cuda_available()
    if args.device == "cuda" and not on_gpu:
        print("[gpu_omni] WARNING: --device cuda but torch sees no GPU", flush=True)
    make_on = "cuda" if on_gpu else "cpu"
    ckpt_dtype = "float32" if args.size == "tiny" else "bfloat16"
    sizes = {} if args.size == "tiny" else real_sizes(args.thinker_layers)
    tag = f"{args.size}-L{args.thinker_layers}-s{args.seed}"
    ckpt = args.work / f"ckpt-{tag}"

    if args.thinker_layers < REAL_THINKER_LAYERS:
        print(
            f"[gpu_omni] thinker REDUCED to {args.thinker_layers} of {REAL_THINKER_LAYERS} "
            f"layers (talker reads layer {accept_layer(args.thinker_layers)}); the output adds "
            f"an estimate scaled to {REAL_THINKER_LAYERS}",
            flush=True,
        )
    with phase("checkpoint"):
        made = ensure_checkpoint(ckpt, sizes, args.seed, make_on, ckpt_dtype)
    print(f"[gpu_omni] checkpoint {ckpt}: {json.dumps(made)}", flush=True)
    if args.stop_after == "checkpoint":
        return 0
    cfg_json = json.loads((ckpt / "config.json").read_text())
    accept = cfg_json["talker_config"]["accept_hidden_layer"]

    prompts = make_prompts(ckpt, max(args.concurrency), args.prompt_tokens)
    longest = max(len(ids) for _, ids in prompts)
    max_input = 64 * math.ceil(longest / 64)
    # the talker's cache holds its prefill (user rows + 9) and F + 1 steps; the thinker's the
    # prompt and N tokens; the runtime caps the talker's frames at the capacity, so keep room
    capacity = 64 * math.ceil((longest + max(args.new_tokens, args.frames + 12)) / 64)
    max_batch = max(args.concurrency)
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    extra: dict[str, Any] = {} if args.logits_topk is None else {"logits_topk": args.logits_topk}
    if args.quantization:
        extra["quantization"] = args.quantization
    if args.backend != "onnxruntime":
        extra["backend"] = args.backend
    stateful = args.code2wav_streaming == "stateful"
    if stateful:
        extra["code2wav_streaming"] = "stateful"
    build_args = BuildArgs(
        max_batch, max_input, capacity, device=args.device, dtype=args.dtype, **extra
    )
    topk = getattr(build_args, "logits_topk", None)
    engine = args.work / (
        f"engine-{tag}-{args.device}-{args.dtype}-b{max_batch}-i{max_input}-c{capacity}"
        + (f"-k{topk}" if topk is not None else "")
        + (f"-{args.quantization}" if args.quantization else "")
        + (f"-{args.backend}" if args.backend != "onnxruntime" else "")
        + ("-stateful" if stateful else "")
    )
    # no audio/vision encoders
    components = ["llm", "talker", "code_predictor", "code2wav"] + (
        ["code2wav_stream"] if stateful else [])  # fmt: skip
    reused_engine = (engine / "multistage_config.json").is_file()
    if not reused_engine:
        clear_leftovers(args.work)
        check_disk(args.work, made["bytes_on_disk"])
        with phase("build"):
            build(ckpt, engine, build_args, components)
    if stateful:
        set_first_chunk(engine, args.first_chunk_frames)
    else:
        set_window(engine, args.window_frames, args.first_window_frames)
    if args.stop_after == "build":
        return 0

    edge = run_edgeomni(engine, prompts, args)
    ref = None
    if not args.skip_transformers:
        ref = run_transformers(ckpt, prompts[0][1], args, "cuda" if on_gpu else "cpu")

    same_codes = None
    if args.greedy_talker and ref and "1" in edge["runs"]:
        ours = edge["runs"]["1"]["batches"][0]["requests"][0]["_codes"]
        same_codes = bool((ours.shape == ref["runs"][0]["_codes"].shape)
                          and (ours == ref["runs"][0]["_codes"]).all())  # fmt: skip
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine(),
        "config": {
            "size": args.size,
            "thinker_layers": args.thinker_layers,
            "thinker_layers_real": REAL_THINKER_LAYERS,
            "accept_hidden_layer": accept,
            "sizes": sizes,
            "checkpoint": str(ckpt),
            "checkpoint_info": made,
            "engine": str(engine),
            "engine_reused": reused_engine,
            "engine_device": args.device,
            "engine_dtype": args.dtype,
            "build_args": vars(build_args),
            "components": components,
            "code2wav_streaming": args.code2wav_streaming,
            "first_chunk_frames": args.first_chunk_frames,
            "window_frames": args.window_frames,
            "first_window_frames": args.first_window_frames or args.window_frames,
            "concurrency": args.concurrency,
            "new_tokens": args.new_tokens,
            "frames": args.frames,
            "prompt_tokens": [len(ids) for _, ids in prompts],
            "prompt_tokens_p50": int(statistics.median(len(ids) for _, ids in prompts)),
            "greedy_talker": args.greedy_talker,
            "seed": args.seed,
            "repeats": args.repeats,
            "hf_runs": args.hf_runs,
        },
        "phases_s": PHASES,
        "edgeomni": edge,
        "transformers": ref,
        "same_codes_greedy_c1": same_codes,
        "peers_published": PEERS,
    }
    text = markdown(result)
    (args.out / "gpu_omni.json").write_text(json.dumps(strip_private(result), indent=2) + "\n")
    (args.out / "gpu_omni.md").write_text(text)
    print("\n" + text)
    print(f"[gpu_omni] phases (s): {json.dumps(PHASES)}")
    print(f"[gpu_omni] wrote {args.out / 'gpu_omni.json'} and {args.out / 'gpu_omni.md'}")
    summaries = [r["summary"] for r in edge["runs"].values()] + ([ref["summary"]] if ref else [])
    ok = all(s.get("ok") and s.get("fixed_work") for s in summaries)
    if not ok:
        print("[gpu_omni] FAILED: a run had errors or did not do the requested work", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
