"""bench/timeline.py's arithmetic (profile_run.py --timeline): busy time as the union of a
stream's kernel intervals, the overlap of streams, the time no kernel ran, kernel families."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import timeline  # noqa: E402


def kernel(name: str, ts: float, dur: float, stream: int) -> dict:
    return {"name": name, "ts": ts, "dur": dur, "args": {"stream": stream}}


def test_union_counts_overlapping_intervals_once() -> None:
    assert timeline.union([]) == 0
    assert timeline.union([(0, 10), (5, 15), (20, 25), (21, 22)]) == 20


def test_two_streams_busy_overlap_and_idle() -> None:
    """The decoders' stream busy 0-40 us and 60-100 us, the vocoder's 30-70 us; a kernel
    before the run does not count."""
    kernels = [kernel("linear_h1", 0, 25, 7), kernel("linear_h1s", 20, 20, 7),
               kernel("edgeomni_cached_attention", 60, 40, 7),
               kernel("void cudnn::implicit_convolve_sgemm<float>", 30, 40, 13),
               kernel("linear_h1", -50, 10, 7)]  # fmt: skip
    s = timeline.summarize(kernels, 0.0, 200.0, 2)
    first, second = s["streams"]
    assert (first["stream"], first["kernels"], first["busy_ms"]) == (7, 3, 0.08)
    assert first["families_ms"] == {"fused linear": 0.045, "fused edgeomni_cached_attention": 0.04}
    assert second["families_ms"] == {"onnxruntime convolution": 0.04}
    assert s["gpu_busy_ms"] == 0.1  # 0-100 us
    assert s["overlap_ms"] == pytest.approx(0.02)  # 30-40 and 60-70 us
    assert s["no_kernel_ms"] == 0.1 and s["no_kernel_ms_per_step"] == 0.05
    assert s["gpu_busy_fraction"] == 0.5
    assert timeline.lines(s)[0].startswith("run: 0.2 ms over 2 steps")


def test_gaps_name_the_kernels_around_them() -> None:
    """Idle times of at least min_us, summed by the kernel that ended last before each (a
    longer one on another stream counts, not the last to start) and the one after it."""
    kernels = [kernel("topk_one", 0, 10, 7), kernel("first_draw", 60, 5, 7),
               kernel("memcpy32_post", 100, 5, 7), kernel("topk_one", 200, 10, 7),
               kernel("first_draw", 250, 5, 7), kernel("conv", 255, 100, 9),
               kernel("frame_sum", 260, 5, 7), kernel("memcpy32_post", 400, 5, 7)]  # fmt: skip
    rows = timeline.gaps(kernels, min_us=30)
    assert rows == [
        {"after": "memcpy32_post", "before": "topk_one", "count": 1, "idle_ms": 0.095},
        {"after": "topk_one", "before": "first_draw", "count": 2, "idle_ms": 0.09},  # 50 + 40
        {"after": "conv", "before": "memcpy32_post", "count": 1, "idle_ms": 0.045},
        {"after": "first_draw", "before": "memcpy32_post", "count": 1, "idle_ms": 0.035}]
    assert timeline.summarize(kernels, 0.0, 500.0, 2)["gaps"] == rows
    assert timeline.gaps([]) == []


def test_families() -> None:
    assert timeline.family("moe_gate_up_grouped") == "fused moe"
    assert timeline.family("topk_chunks") == "fused topk"
    assert timeline.family("first_draw") == "fused first_draw"
    assert timeline.family("delta_rule") == "fused delta_rule"
    assert timeline.family("sm90_xmma_gemm_f16f16_f32") == "onnxruntime gemm"
    assert timeline.family("void onnxruntime::cuda::_UnaryElementWise<float>") == (
        "onnxruntime other")


def test_steps_of_the_outcomes() -> None:
    """The most steps a stage reports, by the first key it has; None where a request failed."""
    from types import SimpleNamespace

    def outcome(ok: bool = True, **stages: dict) -> SimpleNamespace:
        return SimpleNamespace(entry={"ok": ok, "stages": stages, "request_idx": 0,
                                      "error": "x"})  # fmt: skip

    got = [outcome(talker={"frames": 50, "decode_steps": 51}, code2wav={}),
           outcome(talker={"frames": 12})]  # fmt: skip
    assert timeline.steps_of(got, ("frames", "decode_steps")) == 50
    assert timeline.steps_of(got, ("decode_steps",)) == 51
    assert timeline.steps_of([outcome(ok=False)], ("frames",)) is None
