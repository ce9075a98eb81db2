"""bench/tensorrt_compare.py, the call-by-call comparison of two engine dirs through polygraphy.

Here both sides are ONNX Runtime builds (TensorRT engines run on no machine of this project):
the recording, the per-component grouping, polygraphy's runners and Comparator, and the verdict
are the tool's own; only the TrtRunner side waits for a GPU that runs TensorRT engines.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import references

BENCH = Path(__file__).resolve().parents[1] / "bench" / "tensorrt_compare.py"
BODY = {"top_k": 1, "max_generate_length": 4,
        "requests": [{"messages": [{"role": "user", "content": p}]} for p in ("Hi", "Hello!")]}  # fmt: skip


def load_tool() -> Any:
    spec = importlib.util.spec_from_file_location("tensorrt_compare", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(ckpt: Path, out: Path) -> Path:
    from edgeomni.builder.build import build
    from edgeomni.export.family import BuildArgs

    build(ckpt, out, BuildArgs(max_batch_size=3, max_input_len=64, max_kv_cache_capacity=128))
    return out


@pytest.fixture(scope="module")
def polygraphy() -> None:
    """The comparison's runners are polygraphy's (a reference outside the product)."""
    references.require_module("polygraphy", "polygraphy")


@pytest.fixture(scope="module")
def requests_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compare") / "requests.json"
    path.write_text(json.dumps(BODY))
    return path


def test_records_each_call_with_the_cache_as_it_was(qwen3_engine: Path) -> None:
    calls = load_tool().record(qwen3_engine, BODY, limit=3, batch=1)
    assert list(calls) == ["."]  # the one component, at the engine dir's root
    first, second, third = calls["."]
    assert first["inputs_embeds"].shape[1] > 1 and second["inputs_embeds"].shape[1] == 1
    # a cache is copied before the call writes it: the prefill's cache is still empty
    assert not np.any(first["past_key_0"]) and np.any(second["past_key_0"])
    assert not np.array_equal(second["past_key_0"], third["past_key_0"])


@pytest.mark.usefixtures("polygraphy")
def test_two_builds_of_one_checkpoint_agree(
    qwen3_ckpt: Path, qwen3_engine: Path, requests_file: Path, tmp_path: Path, capsys
) -> None:
    other = _build(qwen3_ckpt, tmp_path / "again")
    code = load_tool().main(["--trt", str(other), "--ort", str(qwen3_engine), "--requests",
                             str(requests_file), "--calls", "4", "--out", str(tmp_path / "r.json")])  # fmt: skip
    report = json.loads((tmp_path / "r.json").read_text())
    assert code == 0, capsys.readouterr()
    assert report == {".": {"calls": 4, "profiles": [0], "passed": True}}


@pytest.mark.usefixtures("polygraphy")
def test_another_checkpoint_is_found_out(
    qwen3_engine: Path, requests_file: Path, tmp_path: Path, capsys
) -> None:
    from edgeomni.export.tiny import make_qwen3

    other = _build(make_qwen3(tmp_path / "ckpt", seed=1), tmp_path / "other")
    code = load_tool().main(["--trt", str(other), "--ort", str(qwen3_engine), "--requests",
                             str(requests_file), "--calls", "2"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1
    assert json.loads(out[out.index("{") :])["."]["passed"] is False


def test_calls_go_to_the_profile_the_runtime_would_take() -> None:
    cfg = {"tensorrt": {"profiles": {
        "decode": {"x": [[1, 1], [4, 1], [4, 1]]},
        "prefill": {"x": [[1, 1], [1, 32], [4, 32]]}}}}  # fmt: skip
    feeds = [{"x": np.zeros(s)} for s in ((2, 1), (1, 7), (3, 1), (4, 32))]
    groups = load_tool().by_profile(cfg, feeds)
    assert {p: [f["x"].shape for f in g] for p, g in groups.items()} == {
        0: [(2, 1), (3, 1)], 1: [(1, 7), (4, 32)]}  # fmt: skip


def test_a_missing_engine_dir_is_a_bad_input(requests_file: Path, tmp_path: Path, capsys) -> None:
    code = load_tool().main(["--trt", str(tmp_path / "no"), "--ort", str(tmp_path),
                             "--requests", str(requests_file)])  # fmt: skip
    assert code == 2 and "is not an engine dir" in capsys.readouterr().err
