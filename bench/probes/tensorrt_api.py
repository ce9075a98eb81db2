"""Which of the TensorRT API calls edgeomni's builder and TrtEngine use the installed TensorRT (or
TensorRT-RTX) has: run it on a new target before trusting a build there.

    python bench/probes/tensorrt_api.py [tensorrt|tensorrt_rtx]
"""

from __future__ import annotations

import importlib
import sys

USED = {
    "module": ["Builder", "Runtime", "OnnxParser", "ILogger", "Logger", "nptype",
               "NetworkDefinitionCreationFlag", "ExecutionContextAllocationStrategy",
               "TensorIOMode", "LayerInformationFormat", "PreviewFeature"],
    "Builder": ["create_network", "create_builder_config", "create_optimization_profile",
                "build_serialized_network"],
    "IBuilderConfig": ["add_optimization_profile", "create_timing_cache", "set_timing_cache",
                       "get_timing_cache", "profiling_verbosity"],
    "ICudaEngine": ["num_io_tensors", "get_tensor_name", "get_tensor_mode", "get_tensor_dtype",
                    "get_tensor_shape", "get_tensor_profile_shape", "num_optimization_profiles",
                    "create_execution_context", "device_memory_size_v2",
                    "get_device_memory_size_for_profile_v2", "create_engine_inspector"],
    "IExecutionContext": ["set_input_shape", "set_tensor_address", "get_tensor_shape",
                          "execute_async_v3", "set_optimization_profile_async",
                          "set_device_memory", "device_memory"],
    "INetworkDefinition": ["add_attention", "add_kv_cache_update", "add_rotary_embedding",
                           "num_layers"],
}  # fmt: skip


def main() -> int:
    names = sys.argv[1:] or ["tensorrt", "tensorrt_rtx", "tensorrt_rtx_bindings"]
    for name in names:
        try:
            trt = importlib.import_module(name)
        except ImportError as e:
            print(f"{name}: does not import ({e})")
            continue
        print(f"{name} {trt.__version__}")
        for owner, attrs in USED.items():
            obj = trt if owner == "module" else getattr(trt, owner, None)
            if obj is None:
                print(f"  {owner}: MISSING")
                continue
            missing = [a for a in attrs if not hasattr(obj, a)]
            print(f"  {owner}: {'all there' if not missing else 'missing ' + ', '.join(missing)}")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
