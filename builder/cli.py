"""edge-build: build engines and the multi-stage graph from a Hugging Face checkpoint."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="edge-build",
        description=(
            "Export each component of a Hugging Face checkpoint to ONNX, lower the attention "
            "plugin for the backend, build one engine per component, and write "
            "multistage_config.json beside them."
        ),
    )
    p.add_argument("--model-dir", type=Path, required=True, help="HF checkpoint directory (local)")
    p.add_argument("--engine-dir", type=Path, required=True, help="where engines and graph go")
    p.add_argument("--max-batch-size", type=int, default=4, help="requests per cohort (default 4)")
    p.add_argument(
        "--max-input-len", type=int, default=1024, help="longest prompt in tokens (default 1024)"
    )
    p.add_argument(
        "--max-kv-cache-capacity",
        type=int,
        default=4096,
        help="KV cache slots per request: prompt plus generated tokens (default 4096)",
    )
    p.add_argument(
        "--backend",
        choices=("onnxruntime", "tensorrt"),
        default="onnxruntime",
        help="engine backend (default onnxruntime; tensorrt is not available yet)",
    )
    p.add_argument(
        "--components",
        default="all",
        help="comma-separated components to build, or 'all' (default)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(name)s: %(message)s",
        stream=sys.stderr,
    )
    from edgeomni.builder.build import build
    from edgeomni.builder.errors import BuildError
    from edgeomni.export.common.checkpoint import CheckpointError
    from edgeomni.export.family import BuildArgs
    from edgeomni.export.registry import UnknownModelType

    build_args = BuildArgs(
        max_batch_size=args.max_batch_size,
        max_input_len=args.max_input_len,
        max_kv_cache_capacity=args.max_kv_cache_capacity,
        backend=args.backend,
    )
    try:
        graph = build(
            args.model_dir,
            args.engine_dir,
            build_args,
            [c.strip() for c in args.components.split(",") if c.strip()],
        )
    except (BuildError, CheckpointError, UnknownModelType) as e:
        print(f"edge-build: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if graph is not None:
        print(f"edge-build: wrote {graph}", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
