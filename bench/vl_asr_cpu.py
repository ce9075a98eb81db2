"""Qwen3-VL and Qwen3-ASR on this CPU: edgeomni against transformers, side by side, on one
random-weight checkpoint each (issue 33).

Checkpoints at Qwen3-VL-2B-Instruct's and Qwen3-ASR-0.6B's published dimensions (see the
constants below for their sources) are made from transformers' config classes by the tiny
makers (export/tiny_vl.py, export/tiny_asr.py; no download), built with edge-build (ONNX
Runtime, CPU, float32) and run by edge-infer's pipeline; transformers runs the same checkpoint
in float32 with its own processor. Measured, each side alone in the process:

- time to first token (TTFT): one request from its file on disk (the image or the WAV read,
  preprocessed, encoded, the prompt prefilled, one token drawn) with max 1 new token, against
  the compute bound (the FLOPs of that work, counted by torch's FlopCounterMode on
  transformers' side / the measured float32 GEMM rate of this CPU);
- decode: (wall of N tokens - wall of 1 token) / (N - 1), N fixed on both sides (end of
  sequence held back: ``min_generate_length`` / ``min_new_tokens``), against the memory
  bandwidth bound (bytes of weights and KV a step reads / measured read bandwidth);
- ASR real-time factor: wall of the whole transcription of a 10 s clip (N tokens) / 10 s.

Greedy tokens must be identical between the two (token ids: the tiny makers' tokenizer has
512 ids, so most of the 151936 the model can draw decode to no text), and so must the first
token's top-5 candidates (their log-probabilities are printed side by side: random weights at
these depths often repeat one token, so the top-5 is the stronger check); the script exits 1
when either differs. Times are the best of ``--repeats`` after a warm-up.

At real size the checkpoints are stored in bf16 (half the disk; both sides read the same
values as float32). The two sides run one after the other in this process, each freed before
the next loads (the 2B model is 8.5 GB in float32).

    python bench/vl_asr_cpu.py [--size real|tiny] [--models vl,asr] [--repeats 3] [--json F]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))  # tests/vl_reference.py: transformers' VL side
from llm_decode_cpu import bytes_per_step, read_bandwidth_gbs  # noqa: E402

# Qwen3-VL-2B-Instruct's config.json (the same values in several public repositories' copies
# of it, found with the search tool: text 2048 wide x 28 layers, 16/8 heads of 128, 6144 MLP,
# rope_theta 5e6, interleaved MRoPE [24, 20, 20], tied embeddings; ViT 1024 x 24 layers, 4096
# MLP, 16 heads, patch 16, DeepStack taps after layers 5, 11 and 17, out 2048)
VL_2B_TEXT = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128,
    max_position_embeddings=262144, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                     "mrope_section": [24, 20, 20], "mrope_interleaved": True},
)  # fmt: skip
VL_2B_VISION = dict(
    depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, in_channels=3,
    patch_size=16, spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=2048,
    num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17],
    hidden_act="gelu_pytorch_tanh",
)  # fmt: skip
# the release's image processor limits (preprocessor_config.json): a 512x512 image is kept
# as it is (a multiple of patch 16 x merge 2): 32 x 32 patches, 256 visual tokens
VL_IMAGE_SIZE = {"longest_edge": 16777216, "shortest_edge": 65536}
# Qwen3-ASR-0.6B's config.json thinker_config (the same values in several public
# repositories' copies: audio encoder d896 x 18 layers, 14 heads, 3584 FFN, 480 conv channels,
# output 1024, windows of n_window_infer 800 mel frames; text = Qwen3-0.6B)
ASR_06B = {
    "audio": dict(
        num_mel_bins=128, d_model=896, encoder_layers=18, encoder_attention_heads=14,
        encoder_ffn_dim=3584, output_dim=1024, downsample_hidden_size=480, n_window=50,
        n_window_infer=800, conv_chunksize=500, max_source_positions=1500,
    ),
    "text": dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=65536, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    ),
}  # fmt: skip
IMAGE_PIXELS = 512  # square side
AUDIO_SECONDS = 10.0
SAMPLE_RATE = 16000
VL_PROMPT = "Describe this image."
TOP_K = 5  # the first token's candidates compared between the sides


# -- checkpoints -----------------------------------------------------------------------------
@contextlib.contextmanager
def vision_overrides(vision: dict[str, Any]) -> Iterator[None]:
    """make_qwen3_vl overrides text_config fields only: its ViT is tiny_omni's. This swaps the
    vision config it builds (export/tiny_vl.vl_config) for one with ``vision``'s fields, and
    ties the embeddings as the 2B release does, while the maker runs."""
    from edgeomni.export import tiny_vl

    made = tiny_vl.vl_config

    def config(ids: dict[str, int], **text: Any) -> Any:
        cfg = made(ids, **text)
        for key, value in vision.items():
            setattr(cfg.vision_config, key, value)
        cfg.tie_word_embeddings = bool(text.get("tie_word_embeddings", cfg.tie_word_embeddings))
        return cfg

    tiny_vl.vl_config = config
    try:
        yield
    finally:
        tiny_vl.vl_config = made


def make_vl(path: Path, size: str, layers: int | None = None) -> None:
    from edgeomni.export.tiny_vl import make_qwen3_vl

    if size == "tiny":
        make_qwen3_vl(path)
    else:
        text = {**VL_2B_TEXT, **({"num_hidden_layers": layers} if layers else {})}
        with vision_overrides(VL_2B_VISION):
            make_qwen3_vl(path, **text)
    pre = path / "preprocessor_config.json"
    settings = json.loads(pre.read_text())
    pre.write_text(json.dumps({**settings, "size": VL_IMAGE_SIZE}, indent=2, sort_keys=True))


def make_asr(path: Path, size: str, layers: int | None = None) -> None:
    from edgeomni.export.tiny_asr import make_qwen3_asr

    if size == "tiny":
        make_qwen3_asr(path)
        return
    text = {**ASR_06B["text"], **({"num_hidden_layers": layers} if layers else {})}
    make_qwen3_asr(path, sizes={"audio": ASR_06B["audio"], "text": text})


MAKERS: dict[str, Callable[[Path, str, int | None], None]] = {"vl": make_vl, "asr": make_asr}


def store_bfloat16(path: Path) -> None:
    """Rewrite the checkpoint's float weights as bf16 (as the releases ship them): half the
    disk. Both sides read the same values back (transformers loads them as float32, edge-build
    exports them as float32), so the comparison is unchanged."""
    import torch
    from safetensors.torch import load_file, save_file

    for file in sorted(path.glob("*.safetensors")):
        tensors = {k: v.to(torch.bfloat16) if v.is_floating_point() else v
                   for k, v in load_file(file).items()}  # fmt: skip
        save_file(tensors, file.with_suffix(".tmp"), metadata={"format": "pt"})
        del tensors
        os.replace(file.with_suffix(".tmp"), file)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}, indent=2))


def ensure_checkpoint(work: Path, model: str, size: str, layers: int | None = None,
                      bf16: bool = False) -> Path:  # fmt: skip
    """The checkpoint in ``work``, made once (a stamp written last marks it complete);
    ``bf16``: its weights stored as bf16."""
    name = f"{model}-{size}" + (f"-L{layers}" if layers else "") + ("-bf16" if bf16 else "")
    path = work / name
    if not (path / "bench_stamp.json").is_file():
        if path.exists():
            shutil.rmtree(path)
        start = time.perf_counter()
        MAKERS[model](path, size, layers)
        if bf16:
            store_bfloat16(path)
        stamp = {"made_s": round(time.perf_counter() - start, 1)}
        (path / "bench_stamp.json").write_text(json.dumps(stamp) + "\n")
    return path


def ensure_engine(
    ckpt: Path, engine: Path, args: Any, components: list[str] | None = None
) -> float:
    """edge-build's engine dir (reused when complete); the build's seconds (0 when reused)."""
    from edgeomni.builder.build import build

    if (engine / "multistage_config.json").is_file():
        return 0.0
    start = time.perf_counter()
    build(ckpt, engine, args, components)
    return time.perf_counter() - start


# -- media -----------------------------------------------------------------------------------
def write_image(path: Path, side: int = IMAGE_PIXELS, seed: int = 0) -> Path:
    """A PNG with structure (gradients, a disc, noise), so patches differ."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side] / side
    disc = ((x - 0.3 - 0.1 * seed % 0.4) ** 2 + (y - 0.6) ** 2 < 0.05).astype(np.float64)
    rgb = np.stack([x, y, 0.5 * (x + y) + 0.5 * disc], -1) * 200
    rgb += rng.normal(0, 20, rgb.shape)
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(path)
    return path


def write_clip(path: Path, seconds: float = AUDIO_SECONDS, seed: int = 0) -> Path:
    """A 16 kHz WAV: a chirp over noise (the mel differs frame to frame)."""
    from edgeomni.runtime.audio import write_wav

    n = int(SAMPLE_RATE * seconds)
    t = np.arange(n) / SAMPLE_RATE
    rng = np.random.default_rng(seed)
    x = 0.3 * np.sin(2 * np.pi * (200 + 50 * seed) * t * (1 + 0.1 * t))
    write_wav(path, (x + 0.05 * rng.standard_normal(n)).astype(np.float32), SAMPLE_RATE)
    return path


def messages(model: str, media: Path) -> list[dict[str, Any]]:
    """One user turn as edge-infer's request file gives it."""
    if model == "vl":
        content = [{"type": "image", "image": str(media)}, {"type": "text", "text": VL_PROMPT}]
    else:
        content = [{"type": "audio", "audio": str(media)}]
    return [{"role": "user", "content": content}]


# -- transformers ----------------------------------------------------------------------------
class Reference:
    """transformers' side of one model: ``inputs(paths)`` reads the files and runs its
    processor (a batch: the same prompt for each, equal lengths); ``generate`` is greedy."""

    def __init__(self, model: str, ckpt: Path, device: str = "cpu", dtype: str = "float32") -> None:
        import torch

        self.kind, self.device = model, device
        torch_dtype = getattr(torch, dtype)
        if model == "vl":
            import vl_reference

            self.bundle = vl_reference.load_bundle(ckpt)  # float32, sdpa attention
            self.model = self.bundle.model.to(device=device, dtype=torch_dtype)
        else:
            from transformers import Qwen3ASRForConditionalGeneration, Qwen3ASRProcessor

            self.model = Qwen3ASRForConditionalGeneration.from_pretrained(ckpt, dtype=torch_dtype)
            self.model = self.model.to(device).eval()
            self.processor = Qwen3ASRProcessor.from_pretrained(ckpt)
        self.dtype = torch_dtype

    def inputs(self, paths: list[Path]) -> dict[str, Any]:
        if self.kind == "vl":
            import vl_reference
            from PIL import Image

            images = [np.asarray(Image.open(p).convert("RGB")) for p in paths]
            if len(images) == 1:
                out = vl_reference.build_inputs(self.bundle, [images[0], VL_PROMPT])
            else:  # one prompt per image, as the processor batches them
                out = self._vl_batch(images)
        else:
            from edgeomni.runtime.audio import read_wav

            clips = [read_wav(p)[0] for p in paths]
            out = dict(self.processor.apply_transcription_request(audio=clips))
        return {k: (v.to(self.device) if hasattr(v, "to") else v) for k, v in out.items()}

    def _vl_batch(self, images: list[np.ndarray]) -> dict[str, Any]:
        from PIL import Image

        proc = self.bundle.processor
        turn = [{"role": "user", "content": [{"type": "image", "image": "<pixels>"},
                                             {"type": "text", "text": VL_PROMPT}]}]  # fmt: skip
        text = proc.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
        pil = [Image.fromarray(i) for i in images]
        return dict(proc(text=[text] * len(images), images=pil, return_tensors="pt"))

    def generate(self, inputs: dict[str, Any], new_tokens: int) -> list[list[int]]:
        import torch

        for key in ("pixel_values", "input_features"):
            if key in inputs and inputs[key].is_floating_point():
                inputs[key] = inputs[key].to(self.dtype)
        with torch.no_grad():
            out = self.model.generate(**inputs, max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=False)  # fmt: skip
        return out[:, inputs["input_ids"].shape[1] :].tolist()

    def first_step(self, inputs: dict[str, Any], k: int = TOP_K) -> tuple[float, list]:
        """Untimed: the FLOPs of the work up to the first token (encoder, prefill, the last
        row's head; torch's FlopCounterMode), and the first token's top-k (id, logprob)."""
        import torch
        from torch.utils.flop_counter import FlopCounterMode

        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            out = self.model.generate(**inputs, max_new_tokens=1, do_sample=False,
                                      output_logits=True, return_dict_in_generate=True)  # fmt: skip
        logprobs = torch.log_softmax(out.logits[0][0].float(), -1)
        values, ids = logprobs.topk(k)
        return float(counter.get_total_flops()), list(
            zip(ids.tolist(), values.tolist(), strict=True)
        )

    def close(self) -> None:
        self.model = self.bundle = self.processor = None
        gc.collect()


def time_transformers(model: str, ckpt: Path, media: Path, new_tokens: int, repeats: int) -> dict:
    ref = Reference(model, ckpt)

    def once(n: int) -> tuple[float, list[int], int]:
        start = time.perf_counter()
        inputs = ref.inputs([media])
        (tokens,) = ref.generate(inputs, n)
        return time.perf_counter() - start, tokens, int(inputs["input_ids"].shape[1])

    once(2)  # warm-up
    ttft, full, tokens, prompt = [], [], [], 0
    for _ in range(repeats):
        ttft.append(once(1)[0])
        wall, tokens, prompt = once(new_tokens)
        full.append(wall)
    flops, top = ref.first_step(ref.inputs([media]))
    ref.close()
    return {"ttft_s": ttft, "full_s": full, "tokens": tokens, "prompt_tokens": prompt,
            "ttft_flops": flops, "top": top}  # fmt: skip


# -- edgeomni --------------------------------------------------------------------------------
def request_body(model: str, media: list[Path], new_tokens: int) -> dict[str, Any]:
    """Greedy, exactly ``new_tokens`` tokens a request (end of sequence held back)."""
    return {
        "top_k": 1,
        "max_generate_length": new_tokens,
        "min_generate_length": new_tokens,
        "requests": [{"messages": messages(model, m)} for m in media],
    }


def parse(body: dict[str, Any]) -> list[Any]:
    from edgeomni.runtime.requests import BadRequest, parse_request_file

    requests, _ = parse_request_file(body)
    bad = [r.error for r in requests if isinstance(r, BadRequest)]
    if bad:
        raise SystemExit(f"vl_asr: the runtime rejected the request: {bad[0]}")
    return requests


def time_edgeomni(model: str, engine: Path, media: Path, new_tokens: int, repeats: int) -> dict:
    from edgeomni.runtime.pipeline import Pipeline

    pipe = Pipeline(engine)
    first = parse(request_body(model, [media], 1))
    full = parse(request_body(model, [media], new_tokens))

    def once(requests: list[Any]) -> tuple[float, dict[str, Any]]:
        start = time.perf_counter()
        (outcome,) = pipe.run(requests, batch_size=1)
        wall = time.perf_counter() - start
        if not outcome.entry["ok"]:
            raise SystemExit(f"vl_asr: edgeomni failed: {outcome.entry.get('error')}")
        return wall, outcome.entry["stages"]["llm"]

    once(first)  # warm-up: loads the engines
    once(full)
    checked = parse({**request_body(model, [media], 1), "num_logprobs": TOP_K})
    (outcome,) = pipe.run(checked, batch_size=1)
    top = [(c["token_id"], c["logprob"]) for c in outcome.entry["logprobs"][0]]
    ttft, walls, detail = [], [], {}
    for _ in range(repeats):
        ttft.append(once(first)[0])
        wall, detail = once(full)
        walls.append(wall)
    pipe = None  # free the engines before the other side loads its model
    gc.collect()
    return {
        "ttft_s": ttft,
        "full_s": walls,
        "tokens": detail["output_tokens"],
        "prompt_tokens": detail["prompt_tokens"],
        # the runner's own split of the last full run
        "prefill_ms": detail["prefill_ms"],
        "decode_ms_per_step": round(detail["decode_ms"] / max(1, detail["decode_steps"]), 2),
        "top": top,
    }


# -- summary ---------------------------------------------------------------------------------
def summarize(side: dict[str, Any], new_tokens: int) -> dict[str, Any]:
    """Best of the repeats: TTFT, the full run, the decode step from their difference."""
    ttft, full = min(side["ttft_s"]), min(side["full_s"])
    step = (full - ttft) / (new_tokens - 1)
    return {
        "ttft_ms": round(ttft * 1e3, 1),
        "full_ms": round(full * 1e3, 1),
        "decode_ms_per_token": round(step * 1e3, 2),
        "decode_tok_s": round(1 / step, 2),
        "ttft_ms_runs": [round(t * 1e3, 1) for t in side["ttft_s"]],
        "full_ms_runs": [round(t * 1e3, 1) for t in side["full_s"]],
        "prompt_tokens": side["prompt_tokens"],
    }


def gemm_gflops(n: int = 2048, repeats: int = 5) -> dict[str, float]:
    """Sustained float32 GEMM rate of this CPU, all cores: an [n, n] x [n, n] MatMul in ONNX
    Runtime and in torch, best of ``repeats`` (the compute bound of prefill and encoders)."""
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
        [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ones((n, n), np.float32)
    a, b = torch.from_numpy(x), torch.from_numpy(w)
    flop = 2 * n**3
    out = {}
    for name, fn in (("ort", lambda: sess.run(None, {"x": x})), ("torch", lambda: a @ b)):
        fn()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
        out[name] = flop / best / 1e9
    return out


def text_config(ckpt: Path) -> dict[str, Any]:
    cfg = json.loads((ckpt / "config.json").read_text())
    return cfg["text_config"]


def compare(model: str, ckpt: Path, ours: dict, ref: dict, new_tokens: int, bw_gbs: float,
            gflops: float) -> dict:  # fmt: skip
    o, r = summarize(ours, new_tokens), summarize(ref, new_tokens)
    flop_ms = ref["ttft_flops"] / (gflops * 1e9) * 1e3
    c = text_config(ckpt)
    context = o["prompt_tokens"] + new_tokens // 2
    traffic = bytes_per_step(c["num_hidden_layers"], context, c)
    bound_ms = traffic["total"] / (bw_gbs * 1e9) * 1e3
    out = {
        "prompt_tokens": o["prompt_tokens"],
        "new_tokens": new_tokens,
        "edgeomni": {
            **o,
            "prefill_ms": ours["prefill_ms"],
            "runner_decode_ms_per_step": ours["decode_ms_per_step"],
        },
        "transformers": r,
        "ttft_speedup": round(r["ttft_ms"] / o["ttft_ms"], 2),
        "decode_speedup": round(r["decode_ms_per_token"] / o["decode_ms_per_token"], 2),
        "bytes_per_step_gb": round(traffic["total"] / 1e9, 3),
        "bound_ms_per_token": round(bound_ms, 2),
        "edgeomni_fraction_of_bound": round(bound_ms / o["decode_ms_per_token"], 3),
        "transformers_fraction_of_bound": round(bound_ms / r["decode_ms_per_token"], 3),
        "ttft_gflop": round(ref["ttft_flops"] / 1e9, 1),
        "ttft_compute_bound_ms": round(flop_ms, 1),
        "edgeomni_ttft_fraction_of_compute_bound": round(flop_ms / o["ttft_ms"], 3),
        "transformers_ttft_fraction_of_compute_bound": round(flop_ms / r["ttft_ms"], 3),
        "same_tokens": ours["tokens"] == ref["tokens"],
        "first_token_top": {"edgeomni": ours["top"], "transformers": ref["top"]},
        "same_top_ids": [i for i, _ in ours["top"]] == [i for i, _ in ref["top"]],
        "top_logprob_max_diff": max(
            abs(a[1] - b[1]) for a, b in zip(ours["top"], ref["top"], strict=True)
        ),
        "edgeomni_tokens": ours["tokens"],
        "transformers_tokens": ref["tokens"],
    }
    if model == "asr":
        out["audio_s"] = AUDIO_SECONDS
        out["edgeomni"]["rtf"] = round(o["full_ms"] / 1e3 / AUDIO_SECONDS, 4)
        out["transformers"]["rtf"] = round(r["full_ms"] / 1e3 / AUDIO_SECONDS, 4)
        out["rtf_speedup"] = round(out["transformers"]["rtf"] / out["edgeomni"]["rtf"], 2)
    return out


def table(results: dict[str, dict]) -> str:
    rows = [("", "edgeomni", "transformers", "ratio")]
    for model, r in results.items():
        o, t = r["edgeomni"], r["transformers"]
        what = (f"1 image {IMAGE_PIXELS}x{IMAGE_PIXELS}" if model == "vl"
                else f"{AUDIO_SECONDS:g} s audio")  # fmt: skip
        rows += [
            (f"{model} TTFT ({what}, {r['prompt_tokens']} prompt tokens)",
             f"{o['ttft_ms']:.0f} ms", f"{t['ttft_ms']:.0f} ms", f"{r['ttft_speedup']}x"),
            (f"{model} TTFT / compute bound ({r['ttft_gflop']} GFLOP: {r['ttft_compute_bound_ms']} ms)",
             f"{100 * r['edgeomni_ttft_fraction_of_compute_bound']:.0f}%",
             f"{100 * r['transformers_ttft_fraction_of_compute_bound']:.0f}%", ""),
            (f"{model} decode", f"{o['decode_tok_s']} tok/s", f"{t['decode_tok_s']} tok/s",
             f"{r['decode_speedup']}x"),
            (f"{model} decode / bandwidth bound ({r['bound_ms_per_token']} ms)",
             f"{100 * r['edgeomni_fraction_of_bound']:.0f}%",
             f"{100 * r['transformers_fraction_of_bound']:.0f}%", ""),
        ]  # fmt: skip
        if model == "asr":
            rows.append((f"asr RTF ({r['new_tokens']} tokens)", f"{o['rtf']}", f"{t['rtf']}",
                         f"{r['rtf_speedup']}x"))  # fmt: skip
        rows.append((f"{model} same greedy tokens; same first-token top-{TOP_K}",
                     str(r["same_tokens"]), str(r["same_top_ids"]),
                     f"logprobs within {r['top_logprob_max_diff']:.1e}"))  # fmt: skip
    width = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, width, strict=True)) for row in rows)


# -- main ------------------------------------------------------------------------------------
BUILD = {  # (max_input_len, max_kv_cache_capacity): the prompt (256 image or 130 audio tokens)
    "vl": (384, 512),
    "asr": (256, 384),
}
NEW_TOKENS = {"vl": 32, "asr": 48}  # asr: about a 10 s utterance's transcript


def machine() -> dict[str, Any]:
    import onnxruntime
    import torch
    import transformers

    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--size", choices=("real", "tiny"), default="real")
    p.add_argument("--models", default="vl,asr")
    p.add_argument("--vl-layers", type=int, help="fewer LLM layers than the 2B's 28")
    p.add_argument("--asr-layers", type=int, help="fewer LLM layers than the 0.6B's 28")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bandwidth-probes", type=int, default=3, help="before and after the runs")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "edgeomni-vl-asr")
    p.add_argument("--json", type=Path)
    p.add_argument("--stop-after", choices=("build",), help="make and build, time nothing")
    args = p.parse_args()

    from edgeomni.export.family import BuildArgs

    args.work.mkdir(parents=True, exist_ok=True)
    models = [m for m in args.models.split(",") if m]
    load = {"before": os.getloadavg()}
    media = {"vl": write_image(args.work / "image.png"), "asr": write_clip(args.work / "clip.wav")}
    built, ckpts, engines = {}, {}, {}
    for model in models:
        layers = args.vl_layers if model == "vl" else args.asr_layers
        ckpts[model] = ensure_checkpoint(args.work, model, args.size, layers,
                                         bf16=args.size == "real")  # fmt: skip
        engines[model] = Path(f"{ckpts[model]}-engine")
        built[model] = round(ensure_engine(ckpts[model], engines[model],
                                           BuildArgs(1, *BUILD[model])), 1)  # fmt: skip
        print(f"[vl_asr] {model}: {ckpts[model]} built in {built[model]} s", flush=True)
    if args.stop_after == "build":
        return 0
    probes = [read_bandwidth_gbs() for _ in range(args.bandwidth_probes)]
    gemm = [gemm_gflops() for _ in range(args.bandwidth_probes)]
    results, raw = {}, {}
    for model in models:
        n = NEW_TOKENS[model]
        print(f"[vl_asr] {model}: edgeomni ...", flush=True)
        start = os.getloadavg()[0]
        ours = time_edgeomni(model, engines[model], media[model], n, args.repeats)
        print(f"[vl_asr] {model}: transformers ...", flush=True)
        middle = os.getloadavg()[0]
        ref = time_transformers(model, ckpts[model], media[model], n, args.repeats)
        raw[model] = (ours, ref)
        # 1-minute load averages around each side (2 cores: above ~2, another process ran)
        load[model] = {"edgeomni": (start, middle), "transformers": (middle, os.getloadavg()[0])}
    probes += [read_bandwidth_gbs() for _ in range(args.bandwidth_probes)]
    gemm += [gemm_gflops() for _ in range(args.bandwidth_probes)]
    bw = max(max(probe.values()) for probe in probes)
    peak = max(max(probe.values()) for probe in gemm)
    for model, (ours, ref) in raw.items():
        results[model] = compare(model, ckpts[model], ours, ref, NEW_TOKENS[model], bw, peak)
    load["after"] = os.getloadavg()
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        **machine(),
        "load_average": load,
        "size": args.size,
        "layers": {"vl": args.vl_layers, "asr": args.asr_layers},
        "image": f"{IMAGE_PIXELS}x{IMAGE_PIXELS} PNG",
        "audio_s": AUDIO_SECONDS,
        "build_s": built,
        "bandwidth_gbs_best": round(bw, 2),
        "gemm_gflops_best": round(peak, 1),
        "probes": {"bandwidth_gbs": probes, "gemm_gflops": gemm},
        "repeats": args.repeats,
        "results": results,
    }
    print(json.dumps(result, indent=2))
    print("\n" + table(results))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    same = all(r["same_tokens"] and r["same_top_ids"] for r in results.values())
    if not same:
        print("[vl_asr] FAILED: edgeomni's and transformers' greedy tokens differ", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
