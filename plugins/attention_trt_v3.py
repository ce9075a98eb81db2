"""edgeomni::CachedAttention as a Python ``IPluginV3``, for TensorRT 10.3-10.8 (JetPack 6's 10.3):
no native attention in the ONNX parser and no ``tensorrt.plugin`` ahead-of-time plugins.

The ONNX node is the one the AOT plugin lowering writes (op type ``CachedAttention``, attribute
``plugin_namespace="edgeomni"``, the op's attributes) less its ``aot`` flag; the parser hands the
attributes to this plugin's creator as plugin fields. The plugin declares ``out`` like ``q`` and
the two caches aliased to their inputs (``IPluginV3OneBuildV2``, TensorRT >= 10.3; the build
enables ``ALIASED_PLUGIN_IO_10_03``), so the kernel writes only the new slots of the runtime's
cache buffers. Its ``enqueue`` launches the NVRTC-compiled kernel of plugins/attention_cuda.py
through cuda-python, compiled on first use for the GPU it runs on (so the board needs NVRTC,
which JetPack's CUDA has). Only the op's attributes are serialized into the engine.

Unlike the AOT plugin, an engine built so runs only in a Python process that has registered the
creator (``register(trt)``; TrtEngine does it when the engine's config.json says
``"attention": "python_plugin"``): not in trtexec. No torch.

Written against TensorRT's documented Python plugin API. Of it, only the registration and
``create_plugin`` have run under a TensorRT (TensorRT-RTX 1.7 on the H200,
bench/probes/tensorrt_python_plugin.py): TensorRT-RTX has no plugin layers, and TensorRT itself
cannot be installed here (docs/design.md, "TensorRT: what ran where").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgeomni.plugins import attention, attention_cuda

NAME, NAMESPACE, VERSION = attention.OP_TYPE, attention.DOMAIN, "1"
# Python IPluginV3 with aliased outputs (IPluginV3OneBuildV2)
PYTHON_PLUGIN_SINCE = (10, 3)
INTS, FLOATS = ("num_heads", "kv_num_heads", "window", "causal"), ("scale",)
ALIASED = {1: 3, 2: 4}  # output -> input: present_key is past_key, present_value past_value
_kernels: dict[attention_cuda.KernelConfig, Any] = {}  # compiled once per process and variant


def register(trt: Any) -> None:
    """Register the creator with TensorRT's plugin registry (once per module: before parsing a
    lowered graph, and before deserializing an engine built from one)."""
    if trt.__name__ in _registered:
        return
    _, creator_cls = classes(trt)
    creator = creator_cls()
    if not trt.get_plugin_registry().register_creator(creator, NAMESPACE):
        raise RuntimeError(f"TensorRT refused to register the {NAMESPACE}::{NAME} plugin creator")
    _registered[trt.__name__] = creator  # kept alive: TensorRT calls it for the process's life


_registered: dict[str, Any] = {}


def attributes(fields: Sequence[Any]) -> dict[str, Any]:
    """The op's attributes from plugin fields (the parser's, or the engine's serialized ones)."""
    given = {f.name: np.asarray(f.data).reshape(-1) for f in fields}
    missing = [n for n in ("num_heads", "kv_num_heads") if n not in given or not given[n].size]
    if missing:
        raise ValueError(f"{NAMESPACE}::{NAME}: no {', '.join(missing)} field")
    attrs: dict[str, Any] = {"scale": 0.0, "window": 0, "causal": 1}
    for name in (*INTS, *FLOATS):
        if name in given and given[name].size:
            value = given[name][0]
            attrs[name] = float(value) if name in FLOATS else int(value)
    return attrs


def kernel_config(
    attrs: Mapping[str, Any], head_dim: int, dtype: str
) -> attention_cuda.KernelConfig:
    return attention_cuda.from_node_attributes(attrs, head_dim, dtype)


def classes(trt: Any) -> tuple[type, type]:
    """The plugin and creator classes for this TensorRT module (``tensorrt`` or TensorRT-RTX's,
    which share the plugin API); made once per module."""
    if trt.__name__ in _classes:
        return _classes[trt.__name__]
    if not hasattr(trt, "IPluginV3OneBuildV2"):
        raise RuntimeError(
            f"{trt.__name__} {trt.__version__} has no IPluginV3OneBuildV2 (aliased plugin "
            "outputs), which the attention plugin's in-place KV cache needs"
        )
    if not hasattr(getattr(trt, "INetworkDefinition", None), "add_plugin_v3"):
        # TensorRT-RTX 1.7: its registry takes the creator, but its networks have no plugin
        # layers, and its ONNX parser aborts the process on a plugin node
        raise RuntimeError(
            f"{trt.__name__} {trt.__version__} has no plugin layers "
            "(INetworkDefinition.add_plugin_v3), so no IPluginV3 attention"
        )
    dtypes = {trt.DataType.HALF: "float16", trt.DataType.FLOAT: "float32"}

    class CachedAttentionPlugin(
        trt.IPluginV3, trt.IPluginV3OneCore, trt.IPluginV3OneBuildV2, trt.IPluginV3OneRuntime
    ):
        def __init__(self, attrs: Mapping[str, Any]) -> None:
            trt.IPluginV3.__init__(self)
            trt.IPluginV3OneCore.__init__(self)
            trt.IPluginV3OneBuildV2.__init__(self)
            trt.IPluginV3OneRuntime.__init__(self)
            self.plugin_name, self.plugin_namespace, self.plugin_version = NAME, NAMESPACE, VERSION
            self.num_outputs = 3
            self.attrs = dict(attrs)
            self.timing_cache_id = ""

        # core and build
        def get_capability_interface(self, capability: Any) -> Any:
            return self

        def clone(self) -> Any:
            return CachedAttentionPlugin(self.attrs)

        def get_aliased_input(self, output_index: int) -> int:
            return ALIASED.get(output_index, -1)

        def get_output_data_types(self, input_types: Sequence[Any]) -> list[Any]:
            return [input_types[0], input_types[3], input_types[4]]

        def get_output_shapes(
            self, inputs: Sequence[Any], shape_inputs: Any, builder: Any
        ) -> list[Any]:
            return [trt.DimsExprs(inputs[0]), trt.DimsExprs(inputs[3]), trt.DimsExprs(inputs[4])]

        def supports_format_combination(
            self, pos: int, in_out: Sequence[Any], num_inputs: int
        ) -> bool:
            desc = in_out[pos].desc
            if desc.format != trt.TensorFormat.LINEAR:
                return False
            if pos in (5, 6):  # past_lens, query_lens
                return desc.type == trt.DataType.INT32
            if pos == 0:
                return desc.type in dtypes
            return desc.type == in_out[0].desc.type  # k, v, the caches and every output

        def configure_plugin(self, inputs: Any, outputs: Any) -> None:
            return None

        def get_workspace_size(self, inputs: Any, outputs: Any) -> int:
            return 0

        def get_valid_tactics(self) -> list[int]:
            return [1]  # one kernel

        def set_tactic(self, tactic: int) -> None:
            return None

        # runtime
        def on_shape_change(self, inputs: Any, outputs: Any) -> None:
            return None

        def attach_to_context(self, context: Any) -> Any:
            return self.clone()

        def get_fields_to_serialize(self) -> Any:
            return trt.PluginFieldCollection(fields(trt, self.attrs))

        def enqueue(self, input_desc: Sequence[Any], output_desc: Sequence[Any],
                    inputs: Sequence[int], outputs: Sequence[int], workspace: int,
                    stream: int) -> None:  # fmt: skip
            launch(self.attrs, [tuple(d.dims) for d in input_desc], dtypes[input_desc[0].type],
                   inputs, outputs, stream)  # fmt: skip

    class CachedAttentionCreator(trt.IPluginCreatorV3One):
        def __init__(self) -> None:
            trt.IPluginCreatorV3One.__init__(self)
            self.name, self.plugin_namespace, self.plugin_version = NAME, NAMESPACE, VERSION
            self.field_names = trt.PluginFieldCollection(
                fields(
                    trt, {"num_heads": 0, "kv_num_heads": 0, "scale": 0.0, "window": 0, "causal": 1}
                )  # fmt: skip
            )

        def create_plugin(self, name: str, fc: Sequence[Any], phase: Any) -> Any:
            return CachedAttentionPlugin(attributes(fc))

    _classes[trt.__name__] = (CachedAttentionPlugin, CachedAttentionCreator)
    return _classes[trt.__name__]


_classes: dict[str, tuple[type, type]] = {}


def fields(trt: Any, attrs: Mapping[str, Any]) -> list[Any]:
    """The op's attributes as plugin fields: int32 and float32 scalars, as the parser gives."""
    out = [trt.PluginField(n, np.array([int(attrs[n])], np.int32), trt.PluginFieldType.INT32)
           for n in INTS]  # fmt: skip
    out += [trt.PluginField(n, np.array([float(attrs[n])], np.float32),
                            trt.PluginFieldType.FLOAT32) for n in FLOATS]  # fmt: skip
    return out


def launch(attrs: Mapping[str, Any], dims: Sequence[tuple[int, ...]], dtype: str,
           inputs: Sequence[int], outputs: Sequence[int], stream: int) -> None:  # fmt: skip
    """One call of the kernel on TensorRT's buffers: inputs q, k, v, past_key, past_value,
    past_lens, query_lens; outputs out and the caches, which alias past_key and past_value."""
    for out, inp in ALIASED.items():
        if outputs[out] != inputs[inp]:
            raise RuntimeError(
                f"{NAMESPACE}::{NAME}: output {out} is not bound to input {inp}'s buffer (the "
                "cache is updated in place)"
            )
    (batch, seq, _), (_, _, capacity, head_dim) = dims[0], dims[3]
    config = kernel_config(attrs, head_dim, dtype)
    kernel = _kernels.get(config)
    if kernel is None:  # the first call in this process, on the GPU it runs on
        kernel = _kernels[config] = attention_cuda.CudaAttention(config)
    q, k, v, past_key, past_value, past_lens, query_lens = inputs
    kernel.launch(q, k, v, past_key, past_value, past_lens, query_lens, outputs[0], batch=batch,
                  seq=seq, capacity=capacity, stream=attention_cuda.stream_handle(stream))  # fmt: skip
