"""Probe the Python IPluginV3 attention (plugins/attention_trt_v3.py) with this TensorRT, step by
step, printing where it stops: the registry lookup, create_plugin with parser-like fields, and a
one-node network built with add_plugin_v3 (no ONNX parser), every plugin method call printed.

    python bench/probes/tensorrt_python_plugin.py [--module tensorrt_rtx_bindings]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from pathlib import Path


def traced(cls: type) -> type:
    """Each method of the plugin class prints its name and any exception (TensorRT hides them)."""
    for name in [n for n in vars(cls) if not n.startswith("__")]:
        fn = getattr(cls, name)
        if not callable(fn):
            continue

        def wrap(*a, _fn=fn, _name=name, **k):  # noqa: ANN002, ANN003, ANN202
            print(f"  -> {cls.__name__}.{_name}", flush=True)
            try:
                return _fn(*a, **k)
            except Exception:
                traceback.print_exc()
                sys.stdout.flush()
                raise

        setattr(cls, name, wrap)
    return cls


def main() -> int:
    from edgeomni.plugins import attention_trt_v3 as v3

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--module", default="tensorrt_rtx_bindings")
    p.add_argument("--work", type=Path, default=Path("/tmp/pyplugin"))
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    trt = importlib.import_module(a.module)
    print(trt.__name__, trt.__version__, flush=True)
    plugin_cls, creator_cls = v3.classes(trt)
    traced(plugin_cls)
    traced(creator_cls)
    v3.register(trt)
    creator = trt.get_plugin_registry().get_creator(v3.NAME, v3.VERSION, v3.NAMESPACE)
    print("creator from the registry:", creator, flush=True)
    attrs = {"num_heads": 4, "kv_num_heads": 2, "scale": 0.0, "window": 0, "causal": 1}
    fc = trt.PluginFieldCollection(v3.fields(trt, attrs))
    plugin = creator.create_plugin("attn", fc, trt.TensorRTPhase.BUILD)
    print("create_plugin:", plugin, flush=True)

    logger = trt.Logger(trt.Logger.VERBOSE)
    builder = trt.Builder(logger)
    net = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    h, d, c = 4, 16, 32
    shapes = {"q": (-1, -1, h * d), "k": (-1, -1, 2 * d), "v": (-1, -1, 2 * d),
              "past_key": (-1, 2, c, d), "past_value": (-1, 2, c, d),
              "past_lens": (-1,), "query_lens": (-1,)}  # fmt: skip
    ins = [
        net.add_input(n, trt.int32 if "lens" in n else trt.float16, s) for n, s in shapes.items()
    ]
    layer = net.add_plugin_v3(ins, [], plugin)
    print("add_plugin_v3:", layer, flush=True)
    for i, name in enumerate(("out", "present_key", "present_value")):
        layer.get_output(i).name = name
        net.mark_output(layer.get_output(i))
    config = builder.create_builder_config()
    config.set_preview_feature(trt.PreviewFeature.ALIASED_PLUGIN_IO_10_03, True)
    prof = builder.create_optimization_profile()
    for n, s in shapes.items():
        lo = tuple(1 if x < 0 else x for x in s)
        hi = tuple((2 if i == 0 else 8) if x < 0 else x for i, x in enumerate(s))
        prof.set_shape(n, lo, hi, hi)
    config.add_optimization_profile(prof)
    plan = builder.build_serialized_network(net, config)
    print("build with add_plugin_v3:", "ok" if plan is not None else "FAILED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
