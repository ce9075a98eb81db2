"""What a model family provides to the builder: its components, their export, the graph."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from edgeomni.export.common.checkpoint import Checkpoint
from edgeomni.graph_schema.state import StateTensor


@dataclass(frozen=True)
class Component:
    """One engine of a family: where it lives in the engine dir and which runner serves it."""

    name: str
    subdir: str  # relative to the engine dir; "." for the root
    engine: str  # engine file name inside subdir
    runner: str


DEFAULT_CUDA_TOPK = 64


@dataclass(frozen=True)
class ComponentMemory:
    """What a family's memory_plan hook returns for one component."""

    module: Any  # the torch module the export starts from, on the meta device, in its dtype
    tables: Mapping[str, tuple[tuple[int, ...], str]]  # host table -> (shape, dtype name)
    # a decoder's declared row state (its KV cache; a hybrid's recurrent and convolution
    # state too; none for a code predictor frame engine); None for encoders and the vocoder,
    # which are not decoders
    state: Sequence[StateTensor] | None = None
    # the parameter that becomes the MatMul making logits (or the list of a frame's heads)
    lm_head: str | None = "lm_head_t"


@dataclass(frozen=True)
class BuildArgs:
    """The limits and target of one build (None under --graph-only)."""

    max_batch_size: int
    max_input_len: int
    max_kv_cache_capacity: int
    backend: str = "onnxruntime"
    device: str = "cpu"
    dtype: str = "float32"
    # decoders also output each row's top-K logits, so a GPU runtime copies K candidates per
    # row to the host, not the vocabulary (0: none; None: 64 on cuda, 0 on cpu)
    logits_topk: int | None = None
    # decoders that run chains of calls (Qwen3-Omni's code predictor) draw their tokens in the
    # engine (export/common/sampler.py). None: on cuda, where it spares a host round trip per
    # call; off on cpu, where the sampler's ~45 small ops cost more than drawing on the host
    engine_sampling: bool | None = None
    # how the code predictor (Qwen3-Omni's, Qwen3-TTS's) is called: "frame" builds it as one
    # engine call a frame (export/common/predictor_frame.py: its steps, heads and draws in one
    # graph), "steps" as one call a step. None: frame for ONNX Runtime on the CPU (measured
    # faster there, docs/benchmarks.md) unless engine_sampling asks for steps that draw or
    # int4_awq calibrates them; steps elsewhere, where a GPU captures the steps and draws them
    # in the engine
    code_predictor_calls: str | None = None
    # weight-only quantization of the decoders' linear layers (builder/quantize.py): None for
    # float weights, else "int4_rtn" or "int4_awq"; the group size (K entries per scale); the lm_head too
    # (default: docs/quantization.md measures what it costs and saves)
    quantization: str | None = None
    group_size: int = 32
    quantize_lm_head: bool = True
    quantize_encoders: bool = False  # components without a KV cache too (encoders, vocoder)
    calibration: str | None = None  # int4_awq's request file (None: the shipped text)
    # how a speech family's vocoder streams (Qwen3-Omni's and Qwen3-TTS's code2wav): "stateful"
    # builds its stateful step engine too (component code2wav_stream), "windows" only the
    # codes -> waveform engine that windows with left context use. None: stateful for the CPU;
    # windows for a GPU (past one request they beat the step, captured but one row a call under
    # onnxruntime-gpu 1.31, in the H200 runs of docs/benchmarks.md; rows together it has not run
    # on a GPU yet) and with TensorRT (whose lowering of the step graph is not written yet)
    code2wav_streaming: str | None = None

    def __post_init__(self) -> None:
        if self.code2wav_streaming is None:
            windows = self.backend.startswith("tensorrt") or self.device != "cpu"
            object.__setattr__(self, "code2wav_streaming", "windows" if windows else "stateful")
        if self.logits_topk is None:
            object.__setattr__(
                self, "logits_topk", DEFAULT_CUDA_TOPK if self.device == "cuda" else 0
            )
        if self.code_predictor_calls is None:
            cpu = self.backend == "onnxruntime" and self.device == "cpu"
            # not with a sampler's steps asked for, nor int4_awq (which calibrates the steps)
            frame = cpu and not self.engine_sampling and self.quantization != "int4_awq"
            object.__setattr__(self, "code_predictor_calls", "frame" if frame else "steps")
        if self.engine_sampling is None:
            object.__setattr__(self, "engine_sampling", self.device == "cuda")
        if self.code_predictor_calls not in ("frame", "steps"):
            raise ValueError(f"code_predictor_calls must be frame or steps, "
                             f"got {self.code_predictor_calls!r}")  # fmt: skip
        if self.code_predictor_calls == "frame" and (self.backend, self.device) != (
                "onnxruntime", "cpu"):  # fmt: skip
            raise ValueError("a code predictor frame engine is built for ONNX Runtime on the CPU")
        if self.code_predictor_calls == "frame" and self.quantization == "int4_awq":
            raise ValueError("int4_awq calibrates the code predictor's steps engine: a frame "
                             "engine takes int4_rtn")  # fmt: skip
        if self.logits_topk < 0:
            raise ValueError(f"logits_topk must be >= 0, got {self.logits_topk}")


class FamilyHooks(Protocol):
    """The module a registry entry points at implements these functions."""

    def components(self, ckpt: Checkpoint) -> tuple[Component, ...]:
        """Every component this checkpoint can build, in build order."""

    def export_component(
        self, ckpt: Checkpoint, component: Component, work_dir: Path, args: BuildArgs
    ) -> Path:
        """Export one component to ONNX (plugin ops not yet lowered); returns the model path."""

    def write_artifacts(
        self, ckpt: Checkpoint, component: Component, out_dir: Path, args: BuildArgs
    ) -> None:
        """Write what the runtime needs beside the engine: config.json, tables, tokenizer."""

    def multistage_topology(
        self, bundle: Checkpoint, components: Mapping[str, str], args: BuildArgs | None
    ) -> Any:
        """The graph (a graph_schema.Graph) for the built components (name -> artifact dir),
        or None when these components cannot run as a graph."""


class OptionalFamilyHooks(Protocol):
    """Hooks a family module may define; the builder falls back to the defaults described here.

    ``served_by`` (a module-level mapping): component name -> id of the graph stage whose runner
    runs that component although no stage names its dir as artifact. The default, for components
    it does not list, is the stage whose runner is the component's ``runner`` (how Qwen3-Omni's
    code predictor is run by the talker stage). ``edge-build --graph-only`` writes no graph when
    it finds a component that no stage runs, neither as artifact nor this way.

    ``no_graph_reason`` says why ``multistage_topology`` returned None for these components, for
    the builder's log and --graph-only's exit message; without it (or when it returns None) the
    builder names the family's components that are missing.

    ``preflight`` checks, before anything is exported, all that the build of these components
    will need of the checkpoint that takes only its config and small files (the tokenizer, a
    talker's speakers and ids, image processor settings), and raises CheckpointError with the
    reason, so such a fault is reported in a second rather than after minutes of export. Without
    it the same faults surface when ``write_artifacts`` runs.

    ``memory_plan`` gives what ``edge-build --estimate`` counts for one component, from the
    config alone: the module its export starts from, built on the meta device, its host tables
    and its KV cache (a ComponentMemory). Without it --estimate says the family has none.

    ``position_limits`` names, for each selected decoder whose KV cache --max-kv-cache-capacity
    sizes, the config key of its position limit and the value; edge-build warns when the
    capacity is past one. Without it nothing is checked.

    ``left_out`` names the components a build with these args leaves out of "all", each with
    the reason (Qwen3-Omni's and Qwen3-TTS's code2wav_stream under ``code2wav_streaming``
    windows); naming one in --components is then an error giving that reason. Without it a
    build's "all" is every component.

    ``calibration_fields`` gives the top-level request fields the shipped calibration text needs
    to run through the family's graph (a CustomVoice checkpoint's speaker), for int4_awq's
    calibration of talkers and code predictors (builder/awq_graph.py). Without it none.

    ``calibration_needs`` names the request keys those calibration requests must set for the
    selected components to run at all (a voice-clone checkpoint's reference clip), each with
    what it is: int4_awq without --calibration is then refused before any export, and a
    --calibration file whose requests leave one out. Without it none.
    """

    served_by: Mapping[str, str]

    def no_graph_reason(self, components: Mapping[str, str]) -> str | None:
        """Why these components (name -> artifact dir) cannot run as a graph, or None."""

    def preflight(self, ckpt: Checkpoint, components: Sequence[Component], args: BuildArgs) -> None:
        """Raise CheckpointError for what the selected components' build would fail on later."""

    def memory_plan(
        self, ckpt: Checkpoint, component: Component, args: BuildArgs
    ) -> ComponentMemory:
        """The component's module (meta device), host tables and KV cache shape."""

    def position_limits(
        self, ckpt: Checkpoint, components: Sequence[Component]
    ) -> Mapping[str, tuple[str, int]]:
        """Component name -> (config key, the positions its config declares it takes)."""

    def calibration_fields(self, ckpt: Checkpoint) -> Mapping[str, Any]:
        """Request fields for calibration requests made of plain text."""

    def calibration_needs(
        self, ckpt: Checkpoint, components: Sequence[Component]
    ) -> Mapping[str, str]:
        """Request key -> what it is, for calibration requests through these components."""

    def left_out(self, ckpt: Checkpoint, args: BuildArgs) -> Mapping[str, str]:
        """Component name -> why a build with ``args`` leaves it out of "all"."""
