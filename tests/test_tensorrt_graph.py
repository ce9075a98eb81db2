"""The graph edits edge-build makes for TensorRT's builder (builder/tensorrt_graph.py) keep the
values: ONNX Runtime runs each graph before and after. That TensorRT-RTX builds code2wav only
with them is an H200 result (docs/benchmarks.md); tests/test_tensorrt_engine.py builds it where
TensorRT imports.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from export_store import ExportStore
from onnx import TensorProto, helper, numpy_helper

from edgeomni.builder.tensorrt_graph import CONV2D_AXIS, conv1d_as_conv2d


def _run(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def _convs() -> onnx.ModelProto:
    """x [N, 4, L] -> a strided, dilated, grouped, padded conv with bias -> Clip -> two convs
    sharing one weight -> Add; the shared weight is also read by a Mul (a second output)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((6, 2, 3), np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((6, 6, 1), np.float32), "w2")
    lo = numpy_helper.from_array(np.array(-0.5, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(0.5, np.float32), "hi")
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "w1", "b1"],
            ["c1"],
            group=2,
            kernel_shape=[3],
            strides=[2],
            dilations=[2],
            pads=[3, 1],
        ),  # fmt: skip
        helper.make_node("Clip", ["c1", "lo", "hi"], ["c1c"]),
        helper.make_node("Conv", ["c1c", "w2"], ["c2"]),
        helper.make_node("Conv", ["c1", "w2"], ["c3"], auto_pad="SAME_UPPER"),
        helper.make_node("Add", ["c2", "c3"], ["y"]),
        helper.make_node("Mul", ["w2", "w2"], ["w2sq"]),
    ]
    graph = helper.make_graph(
        nodes, "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, "l"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6, None]),
         helper.make_tensor_value_info("w2sq", TensorProto.FLOAT, [6, 6, 1])],
        [w1, b1, w2, lo, hi],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_1d_convs_become_2d_with_the_same_values() -> None:
    model = _convs()
    x = np.random.default_rng(1).standard_normal((2, 4, 17)).astype(np.float32)
    before = _run(model, {"x": x})
    assert conv1d_as_conv2d(model) == 3
    onnx.checker.check_model(model, full_check=True)
    after = _run(model, {"x": x})
    np.testing.assert_allclose(after[0], before[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(after[1], before[1])  # the Mul still reads the 1-D weight
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert all(len(weights[n.input[1]]) == 4 for n in convs)
    assert weights["w1"] == [6, 2, 1, 3] and weights["w2"] == [6, 6, 1]  # w2 copied, not changed
    assert weights["w2_trt_2d"] == [6, 6, 1, 1]
    assert sum(n.input[1] == "w2_trt_2d" for n in convs) == 2  # one copy for both convs
    assert conv1d_as_conv2d(model) == 0  # nothing 1-D is left


def test_external_weights_are_reshaped_without_reading_or_copying_their_data(
    tmp_path: Path,
) -> None:
    """edge-build loads a large component without its data file; the edit changes dims only."""
    model = _convs()
    x = np.random.default_rng(2).standard_normal((1, 4, 9)).astype(np.float32)
    before = _run(model, {"x": x})
    onnx.save(model, str(tmp_path / "raw.onnx"), save_as_external_data=True,
              location="raw.onnx.data", size_threshold=0)  # fmt: skip
    data = tmp_path / "raw.onnx.data"
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    lowered = onnx.load(str(tmp_path / "raw.onnx"), load_external_data=False)
    assert conv1d_as_conv2d(lowered) == 3
    onnx.save(lowered, str(tmp_path / "lowered.onnx"))
    assert hashlib.sha256(data.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "lowered.onnx",
        "raw.onnx",
        "raw.onnx.data",
    ]
    np.testing.assert_allclose(_run(tmp_path / "lowered.onnx", {"x": x})[0], before[0],
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_a_graph_without_1d_convs_is_left_as_it_is() -> None:
    model = _convs()
    del model.graph.node[:3]
    model.graph.node[0].input[0] = "x"
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    w2 = next(t for t in model.graph.initializer if t.name == "w2")
    w2.CopyFrom(numpy_helper.from_array(np.ones((6, 4, 1, 1), np.float32), "w2"))  # 2-D already
    copy.graph.initializer[2].CopyFrom(w2)
    assert conv1d_as_conv2d(model) == 0
    assert model == copy and CONV2D_AXIS not in {t.name for t in model.graph.initializer}


def test_tiny_omni_code2wav_gives_the_same_waveform(
    omni_ckpt: Path, tmp_path: Path, exports: ExportStore
) -> None:
    """The graph TensorRT gets (attention lowered to opset-23 Attention and TensorScatter, which
    ONNX Runtime runs too), before and after its 1-D convs become 2-D. (The raw export is the
    session's where a cuda build of code2wav exported it already: export_store.py.)"""
    from edgeomni.builder.build import dim_ranges
    from edgeomni.builder.tensorrt import fix_static_dims
    from edgeomni.export.common.checkpoint import open_checkpoint
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.registry import family_for
    from edgeomni.plugins import lower_model

    ckpt = open_checkpoint(omni_ckpt)
    hooks = family_for(ckpt.model_type).hooks()
    comp = next(c for c in hooks.components(ckpt) if c.name == "code2wav")
    args = BuildArgs(2, 16, 64, backend="tensorrt-rtx", device="cuda")
    model = onnx.load(str(exports.export(hooks.export_component, ckpt, comp, tmp_path, args)))
    lower_model(model, "tensorrt", {"attention": "native"})
    fix_static_dims(model, dim_ranges(hooks, ckpt, comp, args))
    quantizers = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    codes = np.random.default_rng(3).integers(0, 16, (2, quantizers, 6)).astype(np.int64)
    before = _run(model, {"codes": codes})[0]
    convs = sum(n.op_type == "Conv" for n in model.graph.node)
    assert conv1d_as_conv2d(model) == convs > 0
    np.testing.assert_allclose(_run(model, {"codes": codes})[0], before, rtol=0, atol=1e-5)


@pytest.mark.parametrize("seeded", [[], ["prev"], ["prev", "earlier"], ["bad", "prev", "empty"]])
def test_timing_caches_seed_the_build_and_a_bad_one_is_left_out(
    tmp_path: Path, seeded: list[str]
) -> None:
    """seed_timing_cache against a stand-in of TensorRT's builder config: every readable cache
    made for this GPU and version is combined in; a damaged one or another GPU's is skipped."""
    from edgeomni.builder.tensorrt import TIMING_CACHE, seed_timing_cache

    class Cache:
        def __init__(self, blob: bytes) -> None:
            if blob.startswith(b"junk"):
                raise RuntimeError("invalid timing cache")
            self.entries = set(blob.split()) - {b"other-gpu"}
            self.foreign = b"other-gpu" in blob

        def combine(self, other: Cache, ignore_mismatch: bool) -> bool:
            assert ignore_mismatch is False
            if other.foreign:
                return False
            self.entries |= other.entries
            return True

    class Config:
        cache: Cache | None = None

        def create_timing_cache(self, blob: bytes) -> Cache:
            return Cache(bytes(blob))

        def set_timing_cache(self, cache: Cache, ignore_mismatch: bool) -> bool:
            self.cache = cache
            return True

    blobs = {"prev": b"conv-a conv-b", "earlier": b"gemm-c", "bad": b"junk", "empty": None,
             "foreign": b"other-gpu conv-z"}  # fmt: skip
    folders = []
    for name in [*seeded, "foreign"]:
        folder = tmp_path / name
        folder.mkdir()
        if blobs[name] is not None:
            (folder / TIMING_CACHE).write_bytes(blobs[name])
        folders.append(folder)
    config = Config()
    taken = seed_timing_cache(config, [*folders, folders[0]] if seeded else folders)
    want = {e for n in seeded if blobs[n] and not blobs[n].startswith(b"junk")
            for e in blobs[n].split()}  # fmt: skip
    assert config.cache is not None and config.cache.entries == want
    assert taken == sum(n in ("prev", "earlier") for n in seeded)
