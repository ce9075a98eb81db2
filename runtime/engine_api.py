"""What every engine backend shares and stages see of an engine: the interface, its error, the
attention lengths a call feeds and the ``device`` a config names. Below the backends
(engine.py's ONNX Runtime, fused_engine.py, tensorrt_engine.py), which import it and never
each other: engine.py opens them through the backend table (plugins/backends.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:  # engine_api imports nothing of the runtime: every engine module is above it
    from edgeomni.runtime.buffers import Buffers


class EngineError(RuntimeError):
    """An engine cannot be opened or run as its config says."""


class Binding(Protocol):
    def bind_in_place(self, input_name: str, output_name: str, array: Any) -> None: ...
    def bind_input(self, name: str, array: Any) -> None: ...
    def bind_output(self, name: str, array: Any) -> None: ...
    def run(
        self, feeds: Mapping[str, Any], *, graph: int | None = None, wait: bool = True
    ) -> None: ...


# the attention op's per-row lengths (cache length before the call, the call's new tokens): a
# call feeds them by these names; an engine takes them as inputs, derives its lowering's own
# inputs from them, or both, and drops them where its graph has no such input
LENGTHS = ("past_lens", "query_lens")


class Engine(Protocol):
    """What stages see of an engine. What a backend's lowering needs at run time (extra length
    inputs, which inputs a captured graph freezes, where and on which device its buffers live)
    stays behind it: stages allocate and move buffers through ``buffers``, feed the graph's own
    inputs (attention lengths as ``LENGTHS``) and read the engine's preferences, never a
    backend's tensor names, its array types or its device."""

    device: str  # "cpu" or "cuda": where the engine runs (for reports)
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    input_types: dict[str, np.dtype]
    output_types: dict[str, np.dtype]
    output_shapes: dict[str, tuple[Any, ...]]  # ints where fixed, names or None where dynamic
    buffers: Buffers  # its buffers' memory, and the operations on them
    # preferences (what costs less on it; any call runs either way):
    replays_steps: bool  # one-token calls run with graph=id are captured once and replayed
    prefers_fixed_shapes: bool  # calls cost less at a few fixed shapes than at each one's own
    # sequence_graph(queue) captures the calls queue makes through its bindings as one graph
    captures_sequences: bool

    def binding(self) -> Binding: ...

    def new_graph_id(self) -> int | None:
        """An id under which run(graph=id) captures a call once and replays it after; None
        where this engine captures nothing (a CPU engine, CUDA graphs off)."""

    def sequence_graph(self, queue: Callable[[], None]) -> Any: ...


def no_sequence_graph(backend: str) -> EngineError:
    """What an engine that cannot capture a sequence of its calls answers sequence_graph."""
    return EngineError(f"{backend} engines run calls one at a time: captures_sequences is False")


def parse_device(device: Any) -> tuple[str, int]:
    """A config's ``device``: "cpu", "cuda" (the first GPU) or "cuda:N" -> (kind, index)."""
    text = str(device)
    kind, colon, index = text.partition(":")
    if kind == "cpu" and not colon:
        return "cpu", 0
    if kind == "cuda" and (not colon or (index.isdigit() and index.isascii())):
        return "cuda", int(index or 0)
    raise EngineError(f"device {device!r} is not cpu, cuda or cuda:N (N a GPU's index)")
