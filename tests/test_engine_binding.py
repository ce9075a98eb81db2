"""OrtBinding's run options: every run names its CUDA graph (-1: none), and a queued run asks
ONNX Runtime not to synchronise its providers at the end."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

from edgeomni.runtime.engine import OrtBinding  # noqa: E402


class _Session:
    def __init__(self) -> None:
        self.options: list[Any] = []

    def io_binding(self) -> Any:
        class _IO:
            def bind_cpu_input(self, name: str, array: np.ndarray) -> None:
                pass

        return _IO()

    def run_with_iobinding(self, io: Any, options: Any = None) -> None:
        self.options.append(options)


def _entry(options: Any, key: str) -> str | None:
    try:
        return options.get_run_config_entry(key) or None
    except RuntimeError:  # onnxruntime raises for a key never set
        return None


@pytest.mark.parametrize("graphs", [False, True])
def test_runs_name_their_graph_and_queued_runs_skip_the_final_sync(graphs: bool) -> None:
    session = _Session()
    binding = OrtBinding(session, cuda_graphs=graphs)
    binding.run({"x": np.zeros(1)})
    binding.run({}, graph=3)
    binding.run({}, graph=3, wait=False)
    plain, graphed, queued = session.options
    # a missing gpu_graph_id makes onnxruntime's Python wrapper raise and catch an exception on
    # every run (50 us, against 2.5 us): it is always set
    assert _entry(plain, "gpu_graph_id") == "-1"
    assert _entry(graphed, "gpu_graph_id") == ("3" if graphs else "-1")
    assert _entry(queued, "gpu_graph_id") == _entry(graphed, "gpu_graph_id")
    assert _entry(plain, "disable_synchronize_execution_providers") is None
    assert _entry(queued, "disable_synchronize_execution_providers") == "1"
    binding.run({})
    assert session.options[-1] is plain  # options are made once per kind of run
