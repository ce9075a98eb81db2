"""The toy family's build hooks (export/family.py's FamilyHooks): one component, ``shift``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from edgeomni.export.common import artifacts
from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.export.common.onnx_export import export_onnx
from edgeomni.export.family import BuildArgs, Component
from edgeomni.graph_schema import SCHEMA_VERSION, Emit, Graph, Input, Stage
from toy_family import SHIFT_RUNNER

SHIFT = Component("shift", ".", "shift.onnx", SHIFT_RUNNER)


class Shift(torch.nn.Module):
    def __init__(self, shift: torch.Tensor) -> None:
        super().__init__()
        self.shift = torch.nn.Parameter(shift.float().reshape(1), requires_grad=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return codes + self.shift


def components(ckpt: Checkpoint) -> tuple[Component, ...]:
    return (SHIFT,)


def export_component(
    ckpt: Checkpoint, component: Component, work_dir: Path, args: BuildArgs
) -> Path:
    module = Shift(ckpt.tensor("shift")).eval()
    n = torch.export.Dim("n", min=1, max=4096)
    return export_onnx(module, (torch.zeros(1, 8),), work_dir / "shift.onnx",
                       input_names=["codes"], output_names=["shifted"],
                       dynamic_shapes=({1: n},))  # fmt: skip


def write_artifacts(ckpt: Checkpoint, component: Component, out_dir: Path, args: BuildArgs) -> None:
    artifacts.write_engine_config(out_dir, {
        "component": component.name, "model_type": ckpt.model_type, "engine": component.engine,
        "backend": args.backend, "device": args.device, "dtype": "float32",
        "builder_config": artifacts.build_limits(args),
    })  # fmt: skip


def multistage_topology(bundle: Checkpoint, components: Mapping[str, str], args: Any) -> Graph:
    stage = Stage(
        id="shift",
        runner=SHIFT_RUNNER,
        artifact=components["shift"],
        kind="iterative",
        inputs=(Input("text", "request:messages", "fail"), Input("rot", "request:rot", "skip")),
        emits=(Emit(id="text", kind="text", transport="chunk_stream", terminal=True),),
    )
    return Graph(SCHEMA_VERSION, ("shift:text",), (stage,))
