"""What ``FusedEngine.sequence_graph`` returns: a sequence of calls as one CUDA graph, valid
while the bindings it holds keep their buffers."""

from __future__ import annotations

import contextlib
from typing import Any

from edgeomni.runtime import memory
from edgeomni.runtime.engine_api import EngineError


class SequenceGraph:
    """FusedEngine.sequence_graph's graph: valid while none of its calls' bindings has
    reallocated a buffer it reads (it holds them, and so every buffer they bind)."""

    def __init__(self, engine: Any, graph: Any, bindings: list[Any]) -> None:
        self._engine, self._graph = engine, graph
        self._bindings = [(b, b.generation) for b in bindings]

    def valid(self) -> bool:
        return all(b.generation == g for b, g in self._bindings)

    def launch(self) -> None:
        """Queued on the engine's stream; the host does not wait."""
        if not self.valid():
            raise EngineError("a call of this sequence graph has new buffers: capture it again")
        memory.use(self._engine.device_id)
        memory._check(memory._cudart().cudaGraphLaunch(self._graph, self._engine.stream),
                      "cudaGraphLaunch")  # fmt: skip

    def __del__(self) -> None:
        graph = getattr(self, "_graph", None)
        if graph is not None:
            with contextlib.suppress(Exception):  # at interpreter shutdown there is no runtime
                memory._cudart().cudaGraphExecDestroy(graph)
