"""bench/profile_run.py, the tool that says where a run's time goes, works on a CPU engine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "profile_run.py"


def load_tool():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("profile_run", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profiles_a_run_and_names_the_engine_call(qwen3_engine, capsys) -> None:
    tool = load_tool()
    code = tool.main([str(qwen3_engine), "--prompt", "Hello", "--top", "5",
                      "--sampling", '{"max_generate_length": 4, "min_generate_length": 4}'])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert '"decode_steps": 3' in out  # the profiled run's own report
    assert "host: the 5 functions" in out and "run_with_iobinding" in out


def test_kernels_are_put_down_to_the_engine_call_they_ran_in() -> None:
    """--kernels' per-engine table, on profiler events made up here (a GPU run makes real ones):
    a kernel belongs to the engine range its start falls in, the ranges themselves (which the
    profiler also lists on the GPU) are not kernels, and one outside every range says so."""
    from types import SimpleNamespace

    import torch

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA

    def event(kind, name, start, end, us=0.0):  # noqa: ANN001, ANN202
        return SimpleNamespace(device_type=kind, name=name, device_time=us,
                               time_range=SimpleNamespace(start=start, end=end))  # fmt: skip

    events = [
        event(cpu, "engine:talker", 0, 100),
        event(cuda, "engine:talker", 5, 90, 85.0),  # the range's GPU twin: not a kernel
        event(cuda, "gemm", 10, 20, 10.0),
        event(cuda, "norm", 30, 33, 3.0),
        event(cpu, "engine:code_predictor", 200, 300),
        event(cpu, "engine:code_predictor", 400, 500),
        event(cuda, "gemm", 210, 214, 4.0),
        event(cuda, "gemm", 410, 416, 6.0),
        event(cuda, "memcpy", 350, 351, 1.0),  # between calls
    ]
    lines = load_tool().engine_table(SimpleNamespace(events=lambda: events), top=5)
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:4]}
    assert rows["talker"] == ["1", "2.0", "13.0", "0.0"]
    assert rows["code_predictor"] == ["2", "1.0", "5.0", "0.0"]
    assert rows["(outside)"][1:3] == ["1.0", "1.0"]
    assert any("5.0" in line and "1.00  gemm" in line for line in lines[4:])


def test_engine_calls_are_bracketed_by_stage_name(qwen3_engine, monkeypatch) -> None:
    """--kernels wraps every engine call in a profiler range named after the stage whose
    engine it is (the root engine's stage too), and unwraps them afterwards."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from edgeomni.runtime import engine as eng
    from edgeomni.runtime.pipeline import Pipeline

    tool = load_tool()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # no GPU here
    args = tool.argparse.Namespace(
        prompt="Hello", input_file=None,
        sampling='{"max_generate_length": 3, "min_generate_length": 3}',
    )  # fmt: skip
    requests = tool.requests_from(args)
    pipe = Pipeline(qwen3_engine)
    plain = eng.OrtBinding.run
    with tool.per_engine_calls(qwen3_engine), profile(activities=[ProfilerActivity.CPU]) as prof:
        pipe.run(requests, batch_size=1)
    assert eng.OrtBinding.run is plain
    names = [e.name for e in prof.events() if e.name.startswith("engine:")]
    assert names and set(names) == {"engine:llm"}, set(names)
