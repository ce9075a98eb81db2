"""What every engine backend shares: its error, the attention lengths a call feeds, the
``device`` a config names and EngineBase (graph ids, no sequence graph by default). Below the backends (engine.py's ONNX Runtime, fused_engine.py,
tensorrt_engine.py), which import it and never each other: engine.py (the interface stages see,
and the opening) reaches the others through the backend table (plugins/backends.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class EngineError(RuntimeError):
    """An engine cannot be opened or run as its config says."""


# the attention op's per-row lengths (cache length before the call, the call's new tokens): a
# call feeds them by these names; an engine takes them as inputs, derives its lowering's own
# inputs from them, or both, and drops them where its graph has no such input
LENGTHS = ("past_lens", "query_lens")


class EngineBase:
    """What every engine shares: ``new_graph_id``, a number for each call shape it captures as
    a CUDA graph, or None where it captures none (the callers never read ``cuda_graphs``
    themselves); and ``sequence_graph``, ``sum_frame`` and ``draw_first`` refused, for an engine
    that cannot capture a sequence of its calls, sum a frame or draw a first code on its
    device (the fused engine overrides them)."""

    BACKEND: str  # the name its errors give
    cuda_graphs: bool
    _graph_ids = 0

    def new_graph_id(self) -> int | None:
        if not self.cuda_graphs:
            return None
        self._graph_ids += 1
        return self._graph_ids

    def sequence_graph(self, queue: Callable[[], None]) -> Any:
        raise EngineError(
            f"{self.BACKEND} engines run calls one at a time: captures_sequences is False"
        )

    # whether ``sum_frame`` queues a codec frame's embedding sum on the engine's device (over
    # its in-engine sampler's tables)
    sums_frames = False

    def sum_frame(self, out: Any, base: Any, codes: Any, add: Any = None) -> None:
        raise EngineError(f"{self.BACKEND} engines do not sum frames: sums_frames is False")

    # whether ``draw_first`` draws a speech frame's first code from the engine's top K on its
    # device (the talker's step, its draw and the next frame then queue with no host read)
    draws_first = False

    def draw_first(
        self, values: Any, ids: Any, marks: Any, uniform: Any, table: Any, drawn: Any,
        base: Any, first: Any, *, penalty: float, temperature: float, top_k: int, top_p: float,
    ) -> None:  # fmt: skip
        raise EngineError(f"{self.BACKEND} engines do not draw on the device: draws_first is "
                          "False")  # fmt: skip


def parse_device(device: Any) -> tuple[str, int]:
    """A config's ``device``: "cpu", "cuda" (the first GPU) or "cuda:N" -> (kind, index)."""
    text = str(device)
    kind, colon, index = text.partition(":")
    if kind == "cpu" and not colon:
        return "cpu", 0
    if kind == "cuda" and (not colon or (index.isdigit() and index.isascii())):
        return "cuda", int(index or 0)
    raise EngineError(f"device {device!r} is not cpu, cuda or cuda:N (N a GPU's index)")
