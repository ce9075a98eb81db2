"""The TensorRT backend is not written yet: say so plainly instead of building something else."""

from __future__ import annotations

from pathlib import Path

from edgeomni.builder.errors import BuildError
from edgeomni.export.family import BuildArgs

NOT_YET = (
    "the TensorRT builder is not part of edgeomni yet (it has its own issue); "
    "build with --backend onnxruntime"
)


def build_engine(raw: Path, out_path: Path, args: BuildArgs) -> None:
    raise BuildError(NOT_YET)
