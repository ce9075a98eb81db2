"""The CUDA path: engines on ONNX Runtime's CUDA provider, KV caches in device memory.

Skipped, with the reason, where no CUDA provider or GPU is present (every CI machine); run on
the GPU machine with ``pytest -m gpu``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeomni.runtime import cli
from edgeomni.runtime.engine import Engines

sys.path.insert(0, str(Path(__file__).parent))


def _cuda_reason() -> str | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return "onnxruntime has no CUDAExecutionProvider here (needs onnxruntime-gpu and a GPU)"
    try:
        from edgeomni.runtime.memory import DeviceArray

        DeviceArray.zeros((1,), np.float32)
    except Exception as e:  # no driver, no device, no cuda-python
        return f"no usable CUDA device: {e}"
    return None


REASON = _cuda_reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


@pytest.fixture(scope="module")
def cuda_engine(qwen3_ckpt: Path, tmp_path_factory) -> Path:
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    eng = tmp_path_factory.mktemp("cuda") / "eng"
    args = BuildArgs(3, 64, 128, device="cuda", dtype="float16")
    assert build(qwen3_ckpt, eng, args) is not None
    return eng


def greedy(engine: Path, tmp: Path, prompts: list[str]) -> list[list[int]]:
    body = {"temperature": 0, "max_generate_length": 16,
            "requests": [{"messages": [{"role": "user", "content": p}]} for p in prompts]}  # fmt: skip
    (tmp / "r.json").write_text(json.dumps(body))
    code = cli.main(["--config", str(engine), "--input-file", str(tmp / "r.json"),
                     "--output-file", str(tmp / "p.json"), "--batch-size", "3"])  # fmt: skip
    assert code == cli.EXIT_OK
    entries = json.loads((tmp / "p.json").read_text())["responses"]
    return [e["stages"]["llm"]["output_tokens"] for e in entries]


def prefill_logits(engine: Path, prompt: str) -> np.ndarray:
    """The last-position logits of one prompt's prefill, through the runner's own pieces."""
    from edgeomni.runtime.decoder import DecoderSession, text_positions
    from edgeomni.runtime.pipeline import Pipeline

    runner = Pipeline(engine).runner("llm")
    ids = np.asarray(runner.tokenizer.encode(prompt), np.int64)[None]
    session = DecoderSession(runner.engine, runner.state, 1, {"logits": (runner.vocab_size,)})
    zero, n = np.zeros(1, np.int32), np.array([ids.shape[1]], np.int32)
    out = session.run(
        runner.embedding[ids], text_positions(zero, ids.shape[1], False), zero, n, n - 1
    )
    return np.asarray(out["logits"][0], np.float32)


def test_cuda_engine_matches_cpu(cuda_engine, qwen3_engine, tmp_path) -> None:
    """float16 on the CUDA provider against float32 on the CPU: prefill logits within 1% of their
    range, and the same greedy tokens for every prompt."""
    prompts = ["Hello! How are you today?", "Hi", "What is the capital of France?"]
    for prompt in prompts:
        gpu, cpu = prefill_logits(cuda_engine, prompt), prefill_logits(qwen3_engine, prompt)
        assert np.abs(gpu - cpu).max() <= 1e-2 * np.abs(cpu).max(), prompt
        assert gpu.argmax() == cpu.argmax()
    for sub in ("g", "c"):
        (tmp_path / sub).mkdir()
    gpu_tokens = greedy(cuda_engine, tmp_path / "g", prompts)
    cpu_tokens = greedy(qwen3_engine, tmp_path / "c", prompts)
    assert gpu_tokens == cpu_tokens


def test_inflight_batching_on_the_gpu(cuda_engine, qwen3_engine) -> None:
    """Six requests of different lengths through three rows on the GPU (graphed decode steps
    of every width, rows admitted mid-run and moved down while the batch drains): the tokens
    of fixed cohorts on the GPU and of the CPU engine."""
    prompts = [
        "Hello! How are you today?",
        "Hi",
        "What is the capital of France?",
        "Count to ten.",
        "The quick brown fox.",
        "Why is the sky blue?",
    ]
    body = {"temperature": 0, "requests": [
        {"messages": [{"role": "user", "content": p}], "max_generate_length": n}
        for p, n in zip(prompts, (3, 20, 7, 14, 2, 11), strict=True)]}  # fmt: skip

    def tokens(outcomes: list) -> list[list[int]]:
        assert all(o.entry["ok"] for o in outcomes), [o.entry["error"] for o in outcomes]
        return [o.entry["stages"]["llm"]["output_tokens"] for o in outcomes]

    inflight = tokens(run_pipeline(cuda_engine, body, 3))
    assert inflight == tokens(run_pipeline(cuda_engine, body, 3, batching="cohort"))
    assert inflight == tokens(run_pipeline(qwen3_engine, body, 3))


def test_kv_cache_lives_on_the_device(cuda_engine) -> None:
    from edgeomni.runtime.memory import DeviceArray
    from edgeomni.runtime.pipeline import Pipeline

    runner = Pipeline(cuda_engine).runner("llm")
    assert runner.engine.device == "cuda"
    kv = runner.state.of_kind("kv")
    assert kv and all(isinstance(k, DeviceArray) for k in kv)
    assert kv[0].dtype == np.float16


def run_pipeline(engine: Path, body: dict, batch: int, **options) -> list:
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    requests, _ = parse_request_file(body)
    return Pipeline(engine, **options).run(requests, batch_size=batch)


def test_cuda_graphs_replay_the_same_tokens(cuda_engine) -> None:
    """Decode steps replayed from captured CUDA graphs give the tokens plain runs give, for a
    ragged batch and for a later cohort of another size (graphs are kept per shape)."""
    from edgeomni.runtime.pipeline import Pipeline

    prompts = ["Hello! How are you today?", "Hi", "What is the capital of France?"]
    body = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 1, "max_generate_length": 24,
            "requests": [{"messages": [{"role": "user", "content": p}]} for p in prompts]}  # fmt: skip
    assert Pipeline(cuda_engine).runner("llm").engine.cuda_graphs
    for batch in (3, 2, 3):
        graphed = run_pipeline(cuda_engine, body, batch)
        plain = run_pipeline(cuda_engine, body, batch, engines=Engines(cuda_graphs=False))
        for a, b in zip(graphed, plain, strict=True):
            assert (
                a.entry["stages"]["llm"]["output_tokens"]
                == (b.entry["stages"]["llm"]["output_tokens"])
            )


def test_a_config_names_its_gpu(cuda_engine) -> None:
    """A config's device "cuda:0" opens the engine on that GPU: its buffers live there and it
    gives the logits "cuda" gives."""
    from edgeomni.runtime.engine import open_engine

    cfg = json.loads((cuda_engine / "config.json").read_text())
    engine = open_engine(cuda_engine, {**cfg, "device": "cuda:0"})
    assert (engine.device, engine.device_id, engine.buffers.device) == ("cuda", 0, 0)
    assert engine.buffers.zeros((2,), np.float32).device == 0
    named = cuda_engine.parent / "cuda0"
    named.mkdir(exist_ok=True)
    for item in cuda_engine.iterdir():  # the same engine, its config naming the GPU
        if item.is_file() and not (named / item.name).exists():
            (named / item.name).symlink_to(item)
    (named / "config.json").unlink()
    (named / "config.json").write_text(json.dumps({**cfg, "device": "cuda:0"}))
    np.testing.assert_array_equal(engine_logits(named), engine_logits(cuda_engine))


def test_buffers_move_between_gpus() -> None:
    """A device-to-device copy between two GPUs' buffers, ordered on both streams (skipped on a
    machine with one GPU)."""
    from edgeomni.plugins.backends import cuda_device_problem
    from edgeomni.runtime.memory import DeviceArray

    if cuda_device_problem(1):
        pytest.skip(str(cuda_device_problem(1)))
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    a, b = DeviceArray.zeros(x.shape, x.dtype, device=0), DeviceArray.zeros(x.shape, x.dtype, 1)
    a.upload(x)
    b.copy_from(a)
    np.testing.assert_array_equal(b.download(), x)
    b.upload(x * 2)
    a.rows(2, 1).copy_from(b.rows(2, 2))
    np.testing.assert_array_equal(a.download(), np.concatenate([x[:1], 2 * x[2:], x[3:]]))


@pytest.fixture(scope="module")
def omni_cuda_engine(omni_ckpt: Path, tmp_path_factory) -> Path:
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    eng = tmp_path_factory.mktemp("omni-cuda") / "eng"
    args = BuildArgs(3, 128, 256, device="cuda", dtype="float16")
    assert build(omni_ckpt, eng, args, ["llm", "talker", "code_predictor", "code2wav"])
    return eng


def engine_logits(folder: Path, seed: int = 0, steps: int = 3, capacity: int = 16) -> np.ndarray:
    """A 5-token prefill and ``steps`` one-token decode calls of a decoder engine on fixed
    random inputs, over a KV cache of ``capacity``: each call's logits [1 + steps, V]."""
    from edgeomni.runtime.decoder import DecoderSession, text_positions
    from edgeomni.runtime.engine import open_engine
    from edgeomni.runtime.row_state import RowState

    cfg = json.loads((folder / "config.json").read_text())
    engine = open_engine(folder, cfg)
    kv = RowState.for_engine(cfg, 2, engine, capacity)
    session = DecoderSession(engine, kv, 1, {"logits": (cfg["vocab_size"],)})
    rng = np.random.default_rng(seed)
    extra = {"lm_head_index": np.array([2])} if "lm_head_index" in engine.input_names else {}
    if "sample_uniform" in engine.input_names:  # the code predictor draws too; greedy here
        extra.update(sample_uniform=np.zeros(1), sample_temperature=np.ones(1),
                     sample_top_k=np.ones(1, np.int64), sample_top_p=np.ones(1))  # fmt: skip
    mrope = bool(cfg.get("mrope_section"))
    logits = []
    for past, new in [(0, 5)] + [(5 + i, 1) for i in range(steps)]:
        x = rng.standard_normal((1, new, cfg["hidden_size"])) * 0.5
        if "deepstack_embeds" in engine.input_names:
            extra["deepstack_embeds"] = np.zeros((cfg["deepstack_layers"], 1, new, x.shape[-1]))
        p, n = np.full(1, past, np.int32), np.full(1, new, np.int32)
        positions = text_positions(p, new, mrope)
        out = session.run(x.astype(np.float32), positions, p, n, n - 1, **extra)
        # a copy: a CPU engine's host output buffer is the same array at every call
        logits.append(np.array(out["logits"], np.float32)[0])
    return np.stack(logits)


@pytest.mark.parametrize("stage", ["thinker", "talker", "code_predictor"])
def test_omni_decoders_match_cpu(omni_cuda_engine, omni_engine, stage) -> None:
    """float16 on the CUDA provider (MoE and attention as contrib ops; the code predictor's q/k
    norms and rotary inside GroupQueryAttention) against the float32 CPU engines: prefill logits
    within 2% of their range on the same inputs, the same best code."""
    sub = "." if stage == "thinker" else stage
    gpu, cpu = (engine_logits(e / sub, steps=0) for e in (omni_cuda_engine, omni_engine))
    assert np.abs(gpu - cpu).max() <= 2e-2 * np.abs(cpu).max()
    assert (gpu.argmax(-1) == cpu.argmax(-1)).all()


@pytest.mark.parametrize("capacity", [16, 128])
@pytest.mark.parametrize("stage", ["llm", "thinker", "talker", "code_predictor"])
def test_decode_steps_match_cpu(cuda_engine, qwen3_engine, omni_cuda_engine, omni_engine,
                                stage, capacity) -> None:  # fmt: skip
    """Three one-token decode calls after a prefill, on the CUDA engines and the CPU ones, over
    two cache sizes. (Its first GPU run failed for the omni decoders because the CPU side's
    decode rows were views of one output buffer, all holding the last step: fixed since.)"""
    if stage == "llm":
        engines = (cuda_engine, qwen3_engine)
    else:
        sub = "." if stage == "thinker" else stage
        engines = (omni_cuda_engine / sub, omni_engine / sub)
    gpu, cpu = (engine_logits(e, capacity=capacity) for e in engines)
    assert np.abs(gpu - cpu).max() <= 2e-2 * np.abs(cpu).max()
    assert (gpu.argmax(-1) == cpu.argmax(-1)).all()


def test_omni_thinker_text_matches_cpu(omni_cuda_engine, omni_engine) -> None:
    """The pipeline's own thinker decode on the GPU (MRoPE, DeepStack inputs, CUDA graphs):
    greedy text tokens equal to the CPU build's for each prompt, as the LLM's are."""
    body = {"max_generate_length": 12, "top_k": 1,
            "requests": [{"messages": [{"role": "user", "content": [{"type": "text", "text": p}]}]}
                         for p in ("Hello there", "What is the capital of France?", "Why?")]}  # fmt: skip
    gpu, cpu = (text_only(e, body, 3) for e in (omni_cuda_engine, omni_engine))
    for a, b in zip(gpu, cpu, strict=True):
        assert a.entry["ok"] and b.entry["ok"], (a.entry, b.entry)
        tokens = a.entry["stages"]["thinker"]["output_tokens"]
        assert tokens == b.entry["stages"]["thinker"]["output_tokens"]


def text_only(engine: Path, body: dict, batch: int) -> list:
    """A pipeline run that stops at the text (no talker, no audio)."""
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    requests, _ = parse_request_file(body)
    pipe = Pipeline(engine)
    return pipe.run(requests, batch_size=batch, requested=pipe.text_terminals())


def test_omni_text_to_speech_on_the_gpu(omni_cuda_engine) -> None:
    """The whole speech path on the GPU: codes the same with and without CUDA graphs, audio of
    the right length, and the in-graph top-K deciding the talker's draws."""
    body = {"max_generate_length": 8, "top_k": 1, "talker_top_k": 10, "talker_seed": 3,
            "talker_max_new_tokens": 21, "talker_min_new_tokens": 21,
            "requests": [{"messages": [{"role": "user", "content": [{"type": "text", "text": p}]}]}
                         for p in ("Hello there", "What is the capital of France?")]}  # fmt: skip
    graphed = run_pipeline(omni_cuda_engine, body, 2)
    plain = run_pipeline(omni_cuda_engine, body, 2, engines=Engines(cuda_graphs=False))
    for a, b in zip(graphed, plain, strict=True):
        assert a.entry["ok"], a.entry
        assert a.codes.shape == (20, 16)
        np.testing.assert_array_equal(a.codes, b.codes)
        assert a.audio.size == 20 * 1920 - 555 and np.isfinite(a.audio).all()
        assert a.entry["stages"]["talker"]["full_logit_rows"] < 2 * 21


def test_code_predictor_draws_on_the_gpu_as_the_host_does(omni_cuda_engine, monkeypatch) -> None:
    """Each code predictor call on the GPU, queued back to back with the frame's others, draws
    in its graph the code the host's sampler draws from that call's top-K and uniform number,
    graphed and not. Whole runs are not compared: the float16 code predictor's logits can
    differ by one float16 step between pipeline instances on the H200 (docs/history/benchmarks-2026-11-29-a.md),
    and a sampled draw that sits at such a near-tie then goes the other way."""
    import draw_check

    for graphs in (True, False):
        compared = draw_check.engine_draws_match_host(
            omni_cuda_engine, monkeypatch, engines=Engines(cuda_graphs=graphs),
            bodies=(draw_check.BODY, draw_check.OTHER),  # the second replays the first's graphs
        )  # fmt: skip
        assert compared >= 2 * 3 * 15 * 12, compared  # most of 16 frames x 15 steps x 3 rows


def test_every_omni_engine_stays_on_the_gpu(omni_cuda_engine) -> None:
    """After a whole speech request each engine still runs on the CUDA provider: onnxruntime's
    Python session would otherwise move itself to the CPU provider when a GPU kernel fails
    (as a float16 dilated convolution under cuDNN's heuristic search did on the H200)."""
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    body = {"max_generate_length": 4, "talker_max_new_tokens": 12, "talker_min_new_tokens": 12,
            "requests": [{"messages": [{"role": "user", "content": [{"type": "text",
                                                                     "text": "Hi"}]}]}]}  # fmt: skip
    requests, _ = parse_request_file(body)
    pipe = Pipeline(omni_cuda_engine)
    (outcome,) = pipe.run(requests, batch_size=1)
    assert outcome.entry["ok"], outcome.entry
    for stage in ("thinker", "talker", "code2wav"):
        runner = pipe.runner(stage)
        engines = [runner.engine] + ([runner.cp.engine] if stage == "talker" else [])
        for engine in engines:
            assert engine.session.get_providers()[0] == "CUDAExecutionProvider", stage


def test_code2wav_windows_replay_fixed_length_graphs(omni_cuda_engine, omni_engine) -> None:
    """code2wav on the GPU runs its windows padded to fixed lengths, replayed from CUDA graphs
    (the engine has no host-computed value feeding the device, so onnxruntime captures it): the
    audio equals the CPU engine's, and the GPU's uncaptured calls', within float32 error; the
    graphs are kept per batch size and length and replayed by later requests."""
    from edgeomni.graph_schema import Emit, Input, Stage
    from edgeomni.runtime.speech.code2wav import Code2Wav
    from edgeomni.runtime.stage import RequestState

    stage = Stage(id="code2wav", runner="qwen3_omni.code2wav", artifact="code2wav",
                  kind="iterative", inputs=(Input("codes", "talker:codes"),),
                  emits=(Emit("audio", "audio", terminal=True),),
                  config={"window_frames": 8, "first_window_frames": 3})  # fmt: skip
    rng = np.random.default_rng(5)
    codes = [rng.integers(0, 64, (n, 16)) for n in (40, 40, 7)]

    from types import SimpleNamespace

    from edgeomni.runtime.scheduler import run_graph

    def audio(folder: Path, **options) -> tuple[Code2Wav, list[np.ndarray]]:
        runner = Code2Wav(stage, folder / "code2wav", **options)
        out = []
        for _ in range(2):  # the second pass replays what the first captured
            states = [RequestState(index=i, request=None, plan=SimpleNamespace(stages=("code2wav",)),
                                   outputs={"talker:codes": c}) for i, c in enumerate(codes)]  # fmt: skip
            run_graph({"code2wav": runner.slot_stage()}, states, {"code2wav": len(states)})
            out = [s.outputs["code2wav:audio"] for s in states]
        return runner, out

    graphed, gpu = audio(omni_cuda_engine)
    # windows of 3, 6, then 8 frames, with the left context they have: 0, 3, 9, 17, then 25
    lengths = (3, 9, 17, 25, 33)
    assert graphed.engine.cuda_graphs and graphed.fixed_lengths == lengths
    assert set(graphed._fixed) == {(1, n) for n in lengths}
    uncaptured, plain = audio(omni_cuda_engine, engines=Engines(cuda_graphs=False))
    assert not uncaptured.engine.cuda_graphs and uncaptured.fixed_lengths == lengths
    _, cpu = audio(omni_engine)
    for g, p, c in zip(gpu, plain, cpu, strict=True):
        assert g.shape == c.shape == p.shape
        # the GPU's float32 convolutions run on TF32 tensor cores: ~1% of the peak off the CPU
        assert np.abs(g - p).max() < 1e-4 and np.abs(g - c).max() < 2e-2 * np.abs(c).max()


@pytest.mark.parametrize("stage", ["llm", "thinker", "talker"])
def test_right_padded_prefill_on_the_gpu(cuda_engine, omni_cuda_engine, stage) -> None:
    """The CUDA provider's GroupQueryAttention without per-row query lengths (onnxruntime-gpu
    1.31): one right-padded prefill of rows of different lengths from an empty cache gives the
    logits, and the cache for the next decode step, of prefilling each row alone. The LLM
    runner (the thinker's) and the talker prefill a cohort so; row by row cost the thinker ~4 ms
    a row at real dimensions (docs/history/, sixth and seventh slices)."""
    import prefill_check

    folder = {"llm": cuda_engine, "thinker": omni_cuda_engine,
              "talker": omni_cuda_engine / "talker"}[stage]  # fmt: skip
    batched, rowwise = prefill_check.batched_and_rowwise(folder)
    assert np.abs(batched - rowwise).max() <= 2e-2 * np.abs(rowwise).max()
    assert (batched.argmax(-1) == rowwise.argmax(-1)).all()


def test_positions_copy_on_the_device() -> None:
    """DeviceBuffers.copy_positions (one cudaMemcpy2DAsync: a KV row's positions to and from a
    context-cache block) moves what numpy's slicing moves."""
    from edgeomni.runtime.buffers import DeviceBuffers, HostBuffers

    rng = np.random.default_rng(0)
    row = rng.standard_normal((1, 3, 20, 4)).astype(np.float16)
    block = np.zeros((1, 3, 8, 4), np.float16)
    dev = DeviceBuffers()
    d_row, d_block = dev.zeros(row.shape, row.dtype), dev.zeros(block.shape, block.dtype)
    dev.upload(d_row, row)
    dev.copy_positions(d_block, d_row, 2, 8, src_start=5)
    HostBuffers().copy_positions(block, row, 2, 8, src_start=5)
    np.testing.assert_array_equal(dev.download(d_block), block)
    back = np.zeros_like(row)
    d_back = dev.zeros(row.shape, row.dtype)
    dev.copy_positions(d_back, d_block, 2, 8, dst_start=12)
    HostBuffers().copy_positions(back, block, 2, 8, dst_start=12)
    np.testing.assert_array_equal(dev.download(d_back), back)


def test_context_reuse_on_the_gpu(cuda_engine) -> None:
    """The context cache with device rows: its blocks kept in device memory, and the tokens
    with it those without it, requests joining and leaving."""
    from edgeomni.runtime.memory import DeviceArray

    system = {"role": "system", "content": "Be brief and kind."}
    body = {"temperature": 0, "requests": [
        {"messages": [system, {"role": "user", "content": q}], "max_generate_length": n}
        for q, n in (("Two plus two?", 6), ("A colour?", 3), ("Two plus two?", 6),
                     ("Hi.", 9), ("Why blue?", 4))]}  # fmt: skip

    def tokens(outcomes: list) -> list[list[int]]:
        assert all(o.entry["ok"] for o in outcomes), [o.entry["error"] for o in outcomes]
        return [o.entry["stages"]["llm"]["output_tokens"] for o in outcomes]

    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    requests, _ = parse_request_file(body)
    pipe = Pipeline(cuda_engine, context_cache_mb=16)
    on = pipe.run(requests, batch_size=2)
    assert tokens(on) == tokens(run_pipeline(cuda_engine, body, 2, context_cache_mb=0))
    assert sum(o.entry["stages"]["llm"]["cached_tokens"] for o in on) > 0
    cache = pipe.context_cache
    assert cache is not None
    blocks = [e.value for e in cache._entries.values() if isinstance(e.value, dict)]
    assert blocks and all(isinstance(a, DeviceArray) for b in blocks for a in b.values())
