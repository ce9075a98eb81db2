"""edgeomni::CachedAttention as a TensorRT plugin, for TensorRT without native attention (the
ONNX parser of 10.9-10.14 has no Attention or TensorScatter: JetPack 7.0/7.1's 10.13).

The plugin lowering (``lower_tensorrt_plugin``) keeps each CachedAttention node as it is, adding
what TensorRT's ONNX parser needs to find the plugin (``plugin_namespace``) and its ahead-of-time
implementation (``aot``). ``register(trt, trtp)`` declares the plugin to ``tensorrt.plugin``
(TensorRT >= 10.9): its outputs (``out`` like ``q``; the caches aliased to their inputs, so the
cache is updated in place), its types, and an ahead-of-time implementation returning the PTX of
the NVRTC-compiled kernel (plugins/attention_cuda.py) with the op's attributes baked in, since a
serialized engine keeps no attributes. An engine built so runs on the plain TensorRT runtime:
no Python plugin code, no torch (shared/notes/tensorrt.md, section 2).

Written against TensorRT's documented ``tensorrt.plugin`` API; no TensorRT with that module can
be installed on this project's machines, so it has not run (docs/design.md, "TensorRT: what ran
where"). The kernel itself is checked against the op's reference on the H200.
"""

# no ``from __future__ import annotations``: tensorrt.plugin reads the annotations of the
# functions ``register`` declares (tensor inputs against attributes), so they must be objects
from typing import Any, Union

from edgeomni.plugins import attention, attention_cuda

PLUGIN = f"{attention.DOMAIN}::{attention.OP_TYPE}"
# ``tensorrt.plugin`` with ahead-of-time implementations and aliased outputs
PLUGIN_SINCE = (10, 9)


def lower_tensorrt_plugin(node: Any, ctx: Any, aot: bool = True) -> list[Any]:
    """The node as TensorRT's parser maps it to this plugin (op type = plugin name, namespace
    and AOT as attributes); its inputs, outputs and the op's own attributes are unchanged.
    ``aot=False``: the same node for the Python IPluginV3 of plugins/attention_trt_v3.py, whose
    creator takes the op's attributes as its fields."""
    from onnx import helper

    given = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs = {**ATTRIBUTE_DEFAULTS, **given}  # all written: the plugin declares no defaults
    return [
        helper.make_node(
            node.op_type,
            list(node.input),
            list(node.output),
            name=node.name,
            domain=node.domain,
            plugin_namespace=attention.DOMAIN,
            **({"aot": 1} if aot else {}),
            num_heads=int(attrs["num_heads"]),
            kv_num_heads=int(attrs["kv_num_heads"]),
            scale=float(attrs["scale"]),
            window=int(attrs["window"]),
            causal=int(attrs["causal"]),
        )
    ]


ATTRIBUTE_DEFAULTS = {"scale": 0.0, "window": 0, "causal": 1}


def register(trt: Any, trtp: Any, arch: str) -> None:
    """Declare the plugin to ``tensorrt.plugin`` (once per process, before parsing). ``arch``:
    the PTX target, e.g. ``compute_87`` for Orin (the driver compiles PTX for newer GPUs too)."""
    if PLUGIN in _registered:
        return
    _registered.add(PLUGIN)

    desc, expr = trtp.TensorDesc, trtp.SymExprs
    Outputs = tuple[desc, desc, desc]  # noqa: N806

    @trtp.register(PLUGIN)
    def _desc(q: desc, k: desc, v: desc, past_key: desc, past_value: desc, past_lens: desc,
              query_lens: desc, num_heads: int, kv_num_heads: int, scale: float, window: int,
              causal: int) -> Outputs:  # fmt: skip
        return q.like(), past_key.aliased(), past_value.aliased()

    @trtp.autotune(PLUGIN)
    def _types(q: desc, k: desc, v: desc, past_key: desc, past_value: desc, past_lens: desc,
               query_lens: desc, num_heads: int, kv_num_heads: int, scale: float, window: int,
               causal: int, outputs: Outputs) -> list[trtp.AutoTuneCombination]:  # fmt: skip
        # inputs q, k, v, caches (one float type), lengths int32; outputs out and the caches
        floats = "FP16|FP32"
        spec = ", ".join([floats] * 5 + ["INT32", "INT32"] + [floats] * 3)
        return [trtp.AutoTuneCombination(spec, "LINEAR")]

    @trtp.aot_impl(PLUGIN)
    def _aot(q: desc, k: desc, v: desc, past_key: desc, past_value: desc, past_lens: desc,
             query_lens: desc, num_heads: int, kv_num_heads: int, scale: float, window: int,
             causal: int, outputs: Outputs, tactic: int,
             ) -> tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, expr]:  # fmt: skip  # noqa: UP007
        cfg = kernel_config(trt, q, past_key, num_heads, kv_num_heads, scale, window, causal)
        ptx = attention_cuda.compile_ptx(cfg.source(), arch)
        batch, seq, capacity = q.shape_expr[0], q.shape_expr[1], past_key.shape_expr[2]
        grid, block, shared = cfg.launch_params(batch, seq, capacity, cdiv=trtp.cdiv)
        launch = trtp.KernelLaunchParams()
        launch.grid_x, launch.grid_y, launch.grid_z = grid
        launch.block_x, launch.block_y, launch.block_z = block
        launch.shared_mem = shared
        # the kernel's int32 arguments after its inputs: B, S, C (attention_cuda.PARAMS)
        extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(e) for e in (batch, seq, capacity)])
        return attention_cuda.KERNEL_NAME.encode(), ptx, launch, extra


_registered: set[str] = set()


def kernel_config(trt: Any, q: Any, past_key: Any, num_heads: int, kv_num_heads: int,
                  scale: float, window: int, causal: int) -> attention_cuda.KernelConfig:  # fmt: skip
    """The kernel variant for this node: the head size must be a build-time constant (the
    exported caches have it fixed), the float type is the node's."""
    head = past_key.shape_expr[3]
    if not head.is_constant:
        raise ValueError(f"{PLUGIN}: the head size (the caches' last axis) must be static")
    dtype = {trt.float16: "float16", trt.float32: "float32"}.get(q.dtype)
    if dtype is None:
        raise ValueError(f"{PLUGIN}: the kernel has float16 and float32, not {q.dtype}")
    attrs = {"num_heads": num_heads, "kv_num_heads": kv_num_heads, "scale": scale,
             "window": window, "causal": causal}  # fmt: skip
    return attention_cuda.from_node_attributes(attrs, head.constant_value(), dtype)
