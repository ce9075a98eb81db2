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
