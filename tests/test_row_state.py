"""The declared row state (graph_schema/state.py) and its allocator (runtime/row_state.py):
the declaration parsed and checked against an engine's inputs and outputs, rows bound by
name with the declared capacity, moved, reset, snapshotted and gathered by kind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeomni.graph_schema import GraphError
from edgeomni.graph_schema.state import StateTensor, check_io, kv_tensors, parse_state
from edgeomni.runtime.artifacts import ArtifactError
from edgeomni.runtime.row_state import RowPool, RowState, declared

KV = StateTensor("key_0", "kv", "past_key_0", "present_key_0", (2, "capacity", 3), "float32",
                 ("past_lens", "query_lens"))  # fmt: skip
REC = StateTensor("recurrent_1", "recurrent", "past_recurrent_1", "present_recurrent_1",
                  (2, 3, 3), "float32", ("query_lens",))  # fmt: skip
CONV = StateTensor("conv_1", "conv", "past_conv_1", "present_conv_1", (5, 3), "float32")


class Recorder:
    """A binding that records what is bound in place and with which capacity."""

    def __init__(self) -> None:
        self.bound: dict[str, tuple[str, Any, int | None]] = {}

    def bind_in_place(self, input_name: str, output_name: str, array: Any,
                      capacity: int | None = None) -> None:  # fmt: skip
        self.bound[input_name] = (output_name, array, capacity)


def test_a_declaration_round_trips_and_counts_its_bytes() -> None:
    state = parse_state(json.loads(json.dumps([t.describe() for t in (KV, REC, CONV)])))
    assert state == (KV, REC, CONV)
    assert KV.row_shape(8) == (2, 8, 3) and KV.capacity_axis == 1
    assert KV.row_bytes(8) == 2 * 8 * 3 * 4 and REC.row_bytes() == 2 * 3 * 3 * 4
    with pytest.raises(ValueError, match="needs a capacity"):
        KV.row_shape()
    assert [t.input for t in kv_tensors(2, 1, 4, "float16")] == [
        "past_key_0", "past_value_0", "past_key_1", "past_value_1"]  # fmt: skip


@pytest.mark.parametrize(
    ("edit", "path", "message"),
    [
        (lambda e: e.update(kind="ssm"), "$.state[1].kind", "'ssm' is not one of"),
        (lambda e: e.update(shape=[2, 3]), "$.state[0].shape", "one 'capacity' axis"),
        (lambda e: e.update(shape=[2, "capacity", "capacity"]), "$.state[0].shape", "only one"),
        (lambda e: e.update(dtype="float64"), "$.state[1].dtype", "one of"),
        (lambda e: e.update(shape=[2, 0, 3]), "$.state[1].shape", "positive sizes"),
        (lambda e: e.pop("output"), "$.state[1]", r"missing \['output'\]"),
        (lambda e: e.update(extra=1), "$.state[0]", r"unknown keys \['extra'\]"),
        (lambda e: e.update(name="key_0"), "$.state[1].name", "declared twice"),
    ],
)
def test_a_bad_declaration_names_the_entry(edit, path, message) -> None:
    entries = [KV.describe(), REC.describe()]
    index = int(path[len("$.state[")])
    edit(entries[index])
    with pytest.raises(GraphError, match=message) as e:
        parse_state(entries)
    assert e.value.path == path


def test_the_declaration_is_checked_against_the_engine() -> None:
    inputs = {"past_key_0": ("float32", ("b", 2, "c", 3)), "past_lens": ("int32", ("b",)),
              "query_lens": ("int32", ("b",))}  # fmt: skip
    outputs = {"present_key_0": ("float32", ("b", 2, "c", 3))}
    check_io([KV], inputs, outputs)
    check_io([KV], {**inputs, "past_key_0": (None, None)}, outputs)  # unsaid: not checked
    cases = [
        ({**inputs, "past_key_0": ("float16", ("b", 2, "c", 3))}, outputs, "dtype", "float16"),
        ({**inputs, "past_key_0": ("float32", ("b", 4, "c", 3))}, outputs, "shape[0]", "has 4"),
        ({**inputs, "past_key_0": ("float32", ("b", 2, 3))}, outputs, "shape", "has 3"),
        (inputs, {}, "output", "no output 'present_key_0'"),
        ({k: v for k, v in inputs.items() if k != "query_lens"}, outputs, "lengths", "query_lens"),
    ]
    for ins, outs, where, message in cases:
        with pytest.raises(GraphError, match=message) as e:
            check_io([KV], ins, outs)
        assert e.value.path == f"$.state[0].{where}"


def test_a_config_without_state_asks_for_a_rebuild() -> None:
    with pytest.raises(ArtifactError, match="declares no state.*rebuild"):
        declared({"component": "llm"})
    with pytest.raises(ArtifactError, match=r"\$.state\[0\].kind"):
        declared({"state": [{**KV.describe(), "kind": "ssm"}]})


def test_rows_bind_by_name_with_the_declared_capacity() -> None:
    """No shape is sniffed: a 4-D recurrent state binds without a capacity, a kv tensor with
    the declared one; rows start..start+n are views of the allocation."""
    four_d = StateTensor("rec", "recurrent", "past_rec", "present_rec", (2, 3, 4), "float32")
    state = RowState([KV, four_d, CONV], rows=4, capacity=8)
    binding = Recorder()
    state.bind(binding, rows=2, start=1)  # type: ignore[arg-type]
    assert {k: (o, c) for k, (o, _, c) in binding.bound.items()} == {
        "past_key_0": ("present_key_0", 8), "past_rec": ("present_rec", None),
        "past_conv_1": ("present_conv_1", None)}  # fmt: skip
    view = binding.bound["past_key_0"][1]
    assert view.shape == (2, 2, 8, 3) and np.shares_memory(view, state.arrays["key_0"][1:3])
    assert state.nbytes() == 4 * (2 * 8 * 3 + 2 * 3 * 4 + 5 * 3) * 4
    with pytest.raises(ValueError, match="exceed"):
        state.bind(binding, rows=2, start=3)  # type: ignore[arg-type]


def test_rows_move_reset_and_snapshot_by_kind() -> None:
    state = RowState([KV, REC, CONV], rows=3, capacity=6)
    rng = np.random.default_rng(0)
    for a in state.arrays.values():
        a[...] = rng.standard_normal(a.shape)
    before = {k: v.copy() for k, v in state.arrays.items()}
    state.move_row(2, 0, length=4)
    kv = state.arrays["key_0"]
    np.testing.assert_array_equal(kv[0, :, :4], before["key_0"][2, :, :4])
    np.testing.assert_array_equal(kv[0, :, 4:], before["key_0"][0, :, 4:])  # past the length
    for name in ("recurrent_1", "conv_1"):  # whole
        np.testing.assert_array_equal(state.arrays[name][0], before[name][2])
    snap = state.snapshot(0)
    state.reset_rows(0, 2)  # a new request: its recurrent and conv rows zeroed, kv left
    assert not state.arrays["recurrent_1"][:2].any() and not state.arrays["conv_1"][:2].any()
    np.testing.assert_array_equal(state.arrays["recurrent_1"][2], before["recurrent_1"][2])
    np.testing.assert_array_equal(kv[1], before["key_0"][1])
    state.restore(1, snap)
    np.testing.assert_array_equal(state.arrays["recurrent_1"][1], before["recurrent_1"][2])
    np.testing.assert_array_equal(kv[1, :, :4], before["key_0"][2, :, :4])


def test_rows_in_any_order_are_gathered_and_scattered() -> None:
    state = RowState([CONV], rows=4)
    state.arrays["conv_1"][...] = np.arange(4)[:, None, None]
    run = state.gather("conv_1", [1, 2])
    assert np.shares_memory(run, state.arrays["conv_1"])  # one run: read where it is
    picked = state.gather("conv_1", [3, 0])
    assert not np.shares_memory(picked, state.arrays["conv_1"])
    assert picked[:, 0, 0].tolist() == [3, 0]
    state.scatter("conv_1", [3, 0], picked + 10)
    assert state.arrays["conv_1"][:, 0, 0].tolist() == [10, 1, 2, 13]


def test_a_pool_hands_out_zeroed_rows_and_grows() -> None:
    pool = RowPool([REC], buffers=RowState([REC], 1).buffers, rows=2)
    a, b = pool.take(), pool.take()
    assert (a, b) == (0, 1)
    pool.state.arrays["recurrent_1"][...] = 7
    pool.release(0)
    with pytest.raises(ValueError, match="not taken"):
        pool.release(0)
    assert pool.take() == 0 and not pool.state.arrays["recurrent_1"][0].any()  # zeroed
    views = pool.views(1)
    c = pool.take()  # all taken: the pool doubles, the rows held keep their state
    assert (c, pool.state.max_batch, pool.generation) == (2, 4, 1)
    assert (pool.views(1)[0] == 7).all() and not np.shares_memory(views[0], pool.views(1)[0])


def test_validate_config_checks_the_declared_state(qwen3_engine: Path, tmp_path: Path,
                                                   capsys) -> None:  # fmt: skip
    """edge-infer --validate-config reads the model's inputs and outputs from the file (no
    engine opened) and names the state entry that does not match them."""
    from edgeomni.runtime import cli
    from edgeomni.runtime.onnx_header import read_io

    cfg = json.loads((qwen3_engine / "config.json").read_text())
    inputs, outputs = read_io(qwen3_engine / cfg["engine"])
    assert inputs["past_key_0"][0] == "float32" and len(inputs["past_key_0"][1]) == 4
    assert outputs["logits"][0] == "float32"
    check_io(parse_state(cfg["state"]), inputs, outputs)
    eng = tmp_path / "eng"
    shutil.copytree(qwen3_engine, eng)
    assert cli.main(["--config", str(eng), "--validate-config"]) == cli.EXIT_OK
    cfg["state"][1]["shape"][0] += 1
    (eng / "config.json").write_text(json.dumps(cfg))
    assert cli.main(["--config", str(eng), "--validate-config"]) != cli.EXIT_OK
    err = capsys.readouterr().err
    assert "$.state[1].shape[0]" in err and "past_value_0" in err, err


def test_an_engine_built_before_declared_state_asks_for_a_rebuild(qwen3_engine: Path,
                                                                  tmp_path: Path,
                                                                  capsys) -> None:  # fmt: skip
    """A config.json without ``state`` (an engine dir an earlier edgeomni built) is refused by
    --validate-config, naming the key and what to do."""
    from edgeomni.runtime import cli

    eng = tmp_path / "eng"
    shutil.copytree(qwen3_engine, eng)
    cfg = json.loads((eng / "config.json").read_text())
    del cfg["state"]
    (eng / "config.json").write_text(json.dumps(cfg))
    assert cli.main(["--config", str(eng), "--validate-config"]) != cli.EXIT_OK
    err = capsys.readouterr().err
    assert "missing 'state'" in err and "rebuild it with edge-build" in err, err
