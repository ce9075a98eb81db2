"""plugins/attention_trt_v3.py, the Python IPluginV3 for TensorRT 10.3-10.8, against a stand-in
of the TensorRT plugin API it uses (base classes, plugin fields, the registry), and the builder
and runtime paths that choose and register it.

Under a real TensorRT only its registration and create_plugin have run (TensorRT-RTX 1.7 on the
H200, which has no plugin layers: bench/probes/tensorrt_python_plugin.py); TensorRT's builder and
runtime have not run it (docs/design.md, "TensorRT: what ran where"). The kernel it launches is
checked against the op's reference in tests/test_attention_cuda.py.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest
from onnx import helper

from edgeomni.builder import tensorrt as trt_builder
from edgeomni.plugins import attention, attention_cuda, attention_trt_v3


class Base:
    def __init__(self, *args: Any) -> None:
        pass


def fake_trt(with_aliasing: bool = True) -> Any:
    registry: list[tuple[Any, str]] = []
    trt = types.SimpleNamespace(
        __name__=f"fake_trt_{with_aliasing}", __version__="10.3.0.30",
        IPluginV3=type("IPluginV3", (Base,), {}),
        IPluginV3OneCore=type("IPluginV3OneCore", (Base,), {}),
        IPluginV3OneRuntime=type("IPluginV3OneRuntime", (Base,), {}),
        IPluginCreatorV3One=type("IPluginCreatorV3One", (Base,), {}),
        PluginField=lambda name, data, kind: types.SimpleNamespace(name=name, data=data, type=kind),
        PluginFieldCollection=list,
        PluginFieldType=types.SimpleNamespace(INT32="i32", FLOAT32="f32"),
        DataType=types.SimpleNamespace(HALF="half", FLOAT="float", INT32="int32", BF16="bf16"),
        TensorFormat=types.SimpleNamespace(LINEAR="linear", CHW32="chw32"),
        DimsExprs=tuple,
        INetworkDefinition=type("INetworkDefinition", (), {"add_plugin_v3": None}),
        get_plugin_registry=lambda: types.SimpleNamespace(
            register_creator=lambda creator, ns: registry.append((creator, ns)) or True),
        registry=registry,
    )  # fmt: skip
    if with_aliasing:
        trt.IPluginV3OneBuildV2 = type("IPluginV3OneBuildV2", (Base,), {})
    return trt


@pytest.fixture
def trt(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(attention_trt_v3, "_registered", {})
    monkeypatch.setattr(attention_trt_v3, "_classes", {})
    monkeypatch.setattr(attention_trt_v3, "_kernels", {})
    return fake_trt()


def field(name: str, value: Any, dtype: Any) -> Any:
    return types.SimpleNamespace(name=name, data=np.array([value], dtype))


# as TensorRT's ONNX parser gives a node's attributes: ints as int32, floats as float32
PARSED = [field("num_heads", 16, np.int32), field("kv_num_heads", 2, np.int32),
          field("scale", 0.125, np.float32), field("window", 0, np.int32),
          field("causal", 1, np.int32)]  # fmt: skip


def test_the_creator_answers_to_the_lowered_node(trt: Any) -> None:
    """The parser finds a creator by the node's op type, plugin_namespace and version ("1" when
    the node names none); the lowered node carries no ``aot`` flag (that selects the AOT one)."""
    from edgeomni.plugins.attention_trt_plugin import lower_tensorrt_plugin

    raw = helper.make_node(attention.OP_TYPE, [f"i{i}" for i in range(7)], ["o", "k", "v"],
                           domain=attention.DOMAIN, num_heads=16, kv_num_heads=2)  # fmt: skip
    (node,) = lower_tensorrt_plugin(raw, None, aot=False)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert "aot" not in attrs and "plugin_version" not in attrs
    attention_trt_v3.register(trt)
    attention_trt_v3.register(trt)  # once per module
    ((creator, namespace),) = trt.registry
    assert (creator.name, creator.plugin_namespace, creator.plugin_version) == (
        node.op_type,
        attrs["plugin_namespace"].decode(),
        "1",
    )
    assert namespace == attention.DOMAIN
    assert [f.name for f in creator.field_names] == ["num_heads", "kv_num_heads", "window",
                                                     "causal", "scale"]  # fmt: skip


def test_fields_from_the_parser_survive_serialization(trt: Any) -> None:
    _, creator_cls = attention_trt_v3.classes(trt)
    plugin = creator_cls().create_plugin("attn", PARSED + [field("other", 7, np.int64)], "build")
    want = {"num_heads": 16, "kv_num_heads": 2, "scale": 0.125, "window": 0, "causal": 1}
    assert plugin.attrs == want
    again = creator_cls().create_plugin("attn", plugin.get_fields_to_serialize(), "runtime")
    assert again.attrs == want and again.clone().attrs == want
    with pytest.raises(ValueError, match="no kv_num_heads field"):
        creator_cls().create_plugin("attn", PARSED[:1], "build")


def test_out_is_like_q_and_the_caches_alias_their_inputs(trt: Any) -> None:
    plugin_cls, _ = attention_trt_v3.classes(trt)
    plugin = plugin_cls({"num_heads": 16, "kv_num_heads": 2})
    assert plugin.num_outputs == 3 and plugin.get_capability_interface("build") is plugin
    assert [plugin.get_aliased_input(i) for i in range(3)] == [-1, 3, 4]
    types_in = ["half"] * 5 + ["int32"] * 2
    assert plugin.get_output_data_types(types_in) == ["half"] * 3
    shapes = [("B", "S", 2048), ("B", "S", 256), ("B", "S", 256), ("B", 2, 4096, 128),
              ("B", 2, 4096, 128), ("B",), ("B",)]  # fmt: skip
    assert plugin.get_output_shapes(shapes, [], None) == [shapes[0], shapes[3], shapes[4]]


def io(types_: list[str], fmt: str = "linear") -> list[Any]:
    return [types.SimpleNamespace(desc=types.SimpleNamespace(type=t, format=fmt)) for t in types_]


@pytest.mark.parametrize("types_,fmt,ok", [
    (["half"] * 5 + ["int32"] * 2 + ["half"] * 3, "linear", True),
    (["float"] * 5 + ["int32"] * 2 + ["float"] * 3, "linear", True),
    (["half"] * 5 + ["int32"] * 2 + ["half"] * 3, "chw32", False),
    (["bf16"] * 5 + ["int32"] * 2 + ["bf16"] * 3, "linear", False),
    (["half"] * 4 + ["float"] + ["int32"] * 2 + ["half"] * 3, "linear", False),
    (["half"] * 5 + ["int32", "half"] + ["half"] * 3, "linear", False),
    (["half"] * 5 + ["int32"] * 2 + ["half", "float", "half"], "linear", False),
])  # fmt: skip
def test_formats_one_float_type_int32_lengths_linear(
    trt: Any, types_: list, fmt: str, ok: bool
) -> None:
    plugin_cls, _ = attention_trt_v3.classes(trt)
    plugin = plugin_cls({"num_heads": 16, "kv_num_heads": 2})
    in_out = io(types_, fmt)
    assert all(plugin.supports_format_combination(p, in_out, 7) for p in range(10)) == ok


def test_enqueue_launches_the_kernel_in_place_compiled_once(trt: Any, monkeypatch) -> None:
    launched: list[tuple] = []
    compiled: list[Any] = []

    class Kernel:
        def __init__(self, config: attention_cuda.KernelConfig) -> None:
            compiled.append(config)

        def launch(self, *pointers: int, **sizes: Any) -> None:
            launched.append((pointers, sizes))

    monkeypatch.setattr(attention_cuda, "CudaAttention", Kernel)
    monkeypatch.setattr(attention_cuda, "stream_handle", lambda s: ("stream", s))
    _, creator_cls = attention_trt_v3.classes(trt)
    plugin = creator_cls().create_plugin("attn", PARSED, "runtime").attach_to_context(None)
    dims = [(3, 5, 2048), (3, 5, 256), (3, 5, 256), (3, 2, 64, 128), (3, 2, 64, 128), (3,), (3,)]
    desc = [types.SimpleNamespace(dims=d, type="half") for d in dims]
    inputs, outputs = [10, 11, 12, 13, 14, 15, 16], [20, 13, 14]
    for _ in range(2):
        plugin.enqueue(desc, desc[:1] + desc[3:5], inputs, outputs, 0, 99)
    assert compiled == [attention_cuda.from_node_attributes(
        {"num_heads": 16, "kv_num_heads": 2, "scale": 0.125}, 128, "float16")]  # fmt: skip
    assert launched == [((10, 11, 12, 13, 14, 15, 16, 20),
                         {"batch": 3, "seq": 5, "capacity": 64, "stream": ("stream", 99)})] * 2  # fmt: skip
    with pytest.raises(RuntimeError, match="output 2 is not bound to input 4"):
        plugin.enqueue(desc, desc[:1] + desc[3:5], inputs, [20, 13, 21], 0, 99)


def test_a_tensorrt_without_aliased_outputs_or_plugin_layers_is_refused(monkeypatch) -> None:
    """A clear BuildError, not TensorRT-RTX's parser aborting the process on a plugin node."""
    from edgeomni.builder.errors import BuildError

    monkeypatch.setattr(attention_trt_v3, "_classes", {})
    with pytest.raises(BuildError, match="has no IPluginV3OneBuildV2"):
        trt_builder.register_plugin(fake_trt(with_aliasing=False), "python_plugin")
    rtx = fake_trt()
    rtx.INetworkDefinition = type("INetworkDefinition", (), {})
    with pytest.raises(
        BuildError, match=r"has no plugin layers \(INetworkDefinition.add_plugin_v3\)"
    ):
        trt_builder.register_plugin(rtx, "python_plugin")


@pytest.mark.parametrize("version,lowering", [("10.3.0.30", "python_plugin"),
                                              ("10.8.0", "python_plugin"), ("10.9.0", "plugin"),
                                              ("10.2.0", None)])  # fmt: skip
def test_tensorrt_10_3_takes_the_python_plugin(version: str, lowering: str | None) -> None:
    flavour = trt_builder.FLAVOURS["tensorrt"]
    assert flavour.attention(version) == lowering
    if lowering:
        assert (
            ".".join(map(str, flavour.since(lowering)))
            == {"python_plugin": "10.3", "plugin": "10.9"}[lowering]
        )


def test_the_runtime_registers_the_plugin_only_for_its_lowering(trt: Any) -> None:
    from edgeomni.runtime.tensorrt_engine import register_plugins

    register_plugins(trt, {"attention": "native"})
    register_plugins(trt, {"attention": "plugin"})
    assert trt.registry == []
    register_plugins(trt, {"attention": "python_plugin"})
    assert len(trt.registry) == 1
