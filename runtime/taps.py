"""Recording engine outputs while requests run through a graph: edge-build's int4_awq
calibration of talkers and code predictors (builder/awq_graph.py), whose inputs only the graph
makes.

``edge-infer --config ENG --record-taps SPEC`` runs SPEC's requests through ENG's graph on the
CPU. Each engine SPEC names is replaced by a model of its own (the component's float graph with
the inputs of its MatMuls added as outputs, which the builder writes), and every call's rows of
those outputs are kept: the call's real tokens only (idle batch rows and padding dropped), at
most SPEC's "rows" per output, chosen at random with a fixed seed. They are written to SPEC's rows file
(.npz, keys ``<tap index>/<output>``).

SPEC (JSON): {"taps": [{"folder": engine folder, "model": path, "outputs": [names]}],
"body": a request file's object, "batch_size": N, "rows": kept per output, "rows_file": path}.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.runtime.engine import Engines, OrtBinding, OrtEngine


@dataclasses.dataclass(frozen=True)
class Tap:
    """One component's calibration model and what to record from it."""

    model: Path  # the float graph, lowered for the CPU, the taps added as outputs
    outputs: Sequence[str]
    sink: Callable[[str, np.ndarray], None]


class TapBinding(OrtBinding):
    """An OrtBinding that also binds each tap output (ONNX Runtime allocates it on the host)
    and hands its rows to the sink after each run. ONNX Runtime returns a binding's outputs in
    the order their names were first bound, which this mirrors."""

    tap: Tap
    order: list[str]

    def _bound(self, name: str) -> None:
        if name not in self.order:
            self.order.append(name)

    def bind_in_place(
        self, input_name: str, output_name: str, array: Any, capacity: int | None = None
    ) -> None:
        super().bind_in_place(input_name, output_name, array, capacity)
        self._bound(output_name)

    def bind_output(self, name: str, array: Any) -> None:
        super().bind_output(name, array)
        self._bound(name)

    def run(self, feeds: Mapping[str, Any], *, graph: int | None = None, wait: bool = True) -> None:
        for name in self.tap.outputs:
            self._io.bind_output(name, "cpu")
            self._bound(name)
        super().run(feeds, graph=None, wait=True)
        values = self._io.get_outputs()
        lens = feeds.get("query_lens")
        for name in self.tap.outputs:
            self.tap.sink(name, real_rows(values[self.order.index(name)].numpy(), lens))


def real_rows(array: np.ndarray, query_lens: Any) -> np.ndarray:
    """A tap's rows [n, K] of the call's real tokens: a batch's idle rows (query length 0) and
    padding positions (past a row's query length) dropped, where the shape tells them apart
    ([B, S, K] or [B, K]); and any row that is not finite."""
    if query_lens is not None:
        lens = np.asarray(query_lens).reshape(-1)
        if array.ndim == 3 and array.shape[0] == len(lens):
            array = array[np.arange(array.shape[1])[None, :] < lens[:, None]]
        elif array.ndim == 2 and array.shape[0] == len(lens):
            array = array[lens > 0]
    rows = array.reshape(-1, array.shape[-1])
    return rows[np.isfinite(rows).all(axis=1)]


class TapEngine(OrtEngine):
    """A tap's model on the CPU, whose bindings record its extra outputs."""

    def __init__(self, tap: Tap, threads: int | None = None) -> None:
        super().__init__(tap.model, device="cpu", threads=threads, spin=False)
        self.tap = tap

    def binding(self) -> TapBinding:
        b = TapBinding(self.session, False, inputs=self.input_names, buffers=self.buffers)
        b.tap, b.order = self.tap, []
        return b


@dataclasses.dataclass(frozen=True)
class TapEngines(Engines):
    """Engines opened on the CPU, the calibrated components' as their TapEngines."""

    taps: Mapping[Path, Tap] = dataclasses.field(default_factory=dict)

    def open(self, folder: Path, config: Mapping[str, Any], *, spin: bool | None = None,
             replay: bool = True) -> Any:  # fmt: skip
        tap = self.taps.get(Path(folder).resolve())
        if tap is not None:
            return TapEngine(tap, self.threads)
        return super().open(folder, config, spin=False, replay=False)  # recording, not replaying


class Rows:
    """Each tap's rows over the run, thinned at random as they come (to 4 x ``keep`` once past
    8 x), then ``keep`` of them."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.rows: dict[str, list[np.ndarray]] = {}
        self.rng = np.random.default_rng(0)

    def add(self, name: str, rows: np.ndarray) -> None:
        parts = self.rows.setdefault(name, [])
        parts.append(np.asarray(rows, np.float32).copy())
        if sum(len(p) for p in parts) > 8 * self.keep:
            parts[:] = [self._sample(np.concatenate(parts), 4 * self.keep)]

    def result(self) -> dict[str, np.ndarray]:
        return {name: self._sample(np.concatenate(parts), self.keep)
                for name, parts in self.rows.items()}  # fmt: skip

    def _sample(self, x: np.ndarray, n: int) -> np.ndarray:
        return x[np.sort(self.rng.choice(len(x), n, replace=False))] if len(x) > n else x


class RecordError(RuntimeError):
    """Why the rows could not be recorded (edge-infer exits 2 with it)."""


def record(spec_path: Path, engine_dir: Path) -> None:
    """Run SPEC's requests through the graph in ``engine_dir`` and write the rows file."""
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file, parse_sampling

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    taps = spec["taps"]
    rows = [Rows(int(spec["rows"])) for _ in taps]
    made = {Path(t["folder"]).resolve(): Tap(Path(t["model"]), tuple(t["outputs"]), r.add)
            for t, r in zip(taps, rows, strict=True)}  # fmt: skip
    sampling, extra = parse_sampling({})
    requests, _ = parse_request_file(spec["body"], sampling, extra, ())
    # in cohorts: the same rows every build
    pipeline = Pipeline(engine_dir, engines=TapEngines(taps=made), batching="cohort")
    outcomes = pipeline.run(requests, batch_size=int(spec["batch_size"]), requested=None)
    failed = [o.entry.get("error") for o in outcomes if not o.entry.get("ok", True)]
    if failed and len(failed) == len(outcomes):
        raise RecordError(f"every calibration request failed ({failed[0]})")
    arrays = {}
    for i, (tap, got) in enumerate(zip(taps, rows, strict=True)):
        result = got.result()
        if not result:
            raise RecordError(f"{Path(tap['folder']).name} was not called by the requests")
        arrays.update({f"{i}/{name}": value for name, value in result.items()})
    np.savez(spec["rows_file"], **arrays)
