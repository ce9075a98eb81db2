"""A TensorRT engine dir against the ONNX Runtime engine dir of the same checkpoint, call by call,
through polygraphy: where a TensorRT build's tokens or audio differ from ONNX Runtime's, this
says which component's outputs differ, which outputs, and by how much.

    python bench/tensorrt_compare.py --trt ENG_TRT --ort ENG_ORT --requests R.json \\
        [--calls 8] [--atol 1e-3] [--rtol 1e-3] [--out report.json]

The ONNX Runtime dir (a CPU build) runs the request file through edge-infer's pipeline, and each
engine call's inputs are recorded as the engine got them (caches as they were before the call;
the first ``--calls`` of each component). Every recorded call then runs again through
polygraphy's runners: ``OnnxrtRunner`` on the ONNX Runtime engine and ``TrtRunner`` on the
TensorRT one, in the first optimisation profile that holds it (as the runtime picks), each given
the inputs it has, floats cast to its types. polygraphy's ``Comparator`` compares the outputs.
Exit 0: every output of every call within the tolerances; 1: some are not; 2: bad input or an
engine that does not load here (TensorRT-RTX on the H200).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

Calls = dict[str, list[dict[str, np.ndarray]]]  # component folder -> recorded input feeds
Runner = Any  # a polygraphy runner: activate(), infer(feeds), get_input_metadata(), name


@contextmanager
def recording(root: Path, limit: int) -> Iterator[Calls]:
    """While inside, every ONNX Runtime engine call under ``root`` is recorded: the inputs it was
    bound (caches, copied before the call updates them in place) and fed."""
    from edgeomni.runtime import engine as eng

    calls: Calls = defaultdict(list)
    bound: dict[int, dict[str, Any]] = defaultdict(dict)
    cls = eng.OrtBinding
    saved = {n: getattr(cls, n) for n in ("bind_in_place", "bind_input", "run")}

    def bind_in_place(self: Any, input_name: str, output_name: str, array: Any,
                      capacity: int | None = None) -> None:  # fmt: skip
        bound[id(self)][input_name] = array
        saved["bind_in_place"](self, input_name, output_name, array, capacity)

    def bind_input(self: Any, name: str, array: Any) -> None:
        bound[id(self)][name] = array
        saved["bind_input"](self, name, array)

    def run(self: Any, feeds: Mapping[str, Any], **kw: Any) -> None:
        folder = str(Path(self._session._model_path).parent.relative_to(root))
        if len(calls[folder]) < limit:
            inputs = {**bound[id(self)], **feeds}
            calls[folder].append({n: np.array(a, copy=True) for n, a in inputs.items()})
        saved["run"](self, feeds, **kw)

    cls.bind_in_place, cls.bind_input, cls.run = bind_in_place, bind_input, run
    try:
        yield calls
    finally:
        for name, fn in saved.items():
            setattr(cls, name, fn)


def record(ort_dir: Path, body: Mapping[str, Any], limit: int, batch: int) -> Calls:
    """Run the request file through the ONNX Runtime engine dir (on the CPU), recording."""
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file

    requests, _ = parse_request_file(dict(body))
    root = ort_dir.resolve()
    with recording(root, limit) as calls:
        Pipeline(root).run(requests, batch_size=batch)
    return dict(calls)


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise SystemExit(f"tensorrt_compare: {path} is missing")
    return json.loads(path.read_text())


def ort_runner(folder: Path) -> Runner:
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    path = folder / _config(folder)["engine"]
    return OnnxrtRunner(SessionFromOnnx(str(path), providers=["CPUExecutionProvider"]),
                        name=f"onnxruntime:{folder.name}")  # fmt: skip


def trt_runner(folder: Path, profile: int) -> Runner:
    """polygraphy's TrtRunner on the component's engine, in one profile."""
    cfg = _config(folder)
    flavour = cfg["tensorrt"]["flavour"]
    if flavour == "tensorrt-rtx":  # polygraphy's own switch, read when it imports TensorRT
        os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1"
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    plan = (folder / cfg["engine"]).read_bytes()
    return TrtRunner(EngineFromBytes(plan), name=f"{flavour}:{folder.name}:p{profile}",
                     optimization_profile=profile)  # fmt: skip


def runner_for(folder: Path, profile: int) -> Runner:
    """TrtRunner for a TensorRT engine; OnnxrtRunner for an ONNX Runtime one (so two ONNX
    Runtime builds compare too: another dtype, another onnxruntime)."""
    if _config(folder).get("backend") == "onnxruntime":
        return ort_runner(folder)
    return trt_runner(folder, profile)


def by_profile(cfg: Mapping[str, Any], feeds: list[dict[str, np.ndarray]]) -> dict[int, list]:
    """The recorded calls grouped by the TensorRT profile the runtime would take for each (one
    group for an engine without profiles)."""
    from edgeomni.runtime.tensorrt_engine import profile_for

    if "tensorrt" not in cfg:
        return {0: list(feeds)}
    profiles = list(cfg["tensorrt"]["profiles"].values())
    names = list(profiles[0])
    groups: dict[int, list] = defaultdict(list)
    for f in feeds:
        groups[profile_for(profiles, names, {n: a.shape for n, a in f.items()})].append(f)
    return dict(groups)


def _infer(runner: Runner, feeds: list[dict[str, np.ndarray]]) -> list[Any]:
    """Each call through an active runner, given only the inputs it has, in its types."""
    from polygraphy.comparator import IterationResult
    from polygraphy.datatype import DataType

    types = {n: DataType.to_dtype(m.dtype, "numpy") for n, m in runner.get_input_metadata().items()}
    results = []
    for f in feeds:
        mine = {n: np.asarray(f[n], dtype=t) for n, t in types.items()}
        start = time.perf_counter()
        outputs = runner.infer(mine)
        results.append(IterationResult(outputs, time.perf_counter() - start, runner.name))
    return results


def compare(
    trt_dir: Path,
    ort_dir: Path,
    calls: Calls,
    atol: float,
    rtol: float,
    make_runner: Callable[[Path, int], Runner] = runner_for,
) -> dict[str, Any]:
    """component folder -> {calls, passed} for each component with recorded calls."""
    from polygraphy.comparator import Comparator, CompareFunc, RunResults

    report: dict[str, Any] = {}
    compare_func = CompareFunc.simple(atol=atol, rtol=rtol, check_shapes=True)
    for folder, feeds in sorted(calls.items()):
        passed = True
        groups = by_profile(_config(trt_dir / folder), feeds)
        for profile, group in sorted(groups.items()):
            results = RunResults()
            for runner in (ort_runner(ort_dir / folder), make_runner(trt_dir / folder, profile)):
                with runner:
                    results.append((runner.name, _infer(runner, group)))
            passed &= bool(Comparator.compare_accuracy(results, compare_func=compare_func))
        report[folder] = {"calls": len(feeds), "profiles": sorted(groups), "passed": passed}
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--trt", type=Path, required=True,
                   help="the TensorRT engine dir (or another ONNX Runtime build)")  # fmt: skip
    p.add_argument("--ort", type=Path, required=True,
                   help="the ONNX Runtime engine dir (a CPU build) of the same checkpoint")  # fmt: skip
    p.add_argument("--requests", type=Path, required=True, help="an edge-infer request file")
    p.add_argument("--calls", type=int, default=8, help="recorded calls per component (8)")
    p.add_argument("--batch", type=int, default=1, help="requests stepped together (1)")
    p.add_argument("--atol", type=float, default=1e-3)
    p.add_argument("--rtol", type=float, default=1e-3)
    p.add_argument("--out", type=Path, help="write the per-component report as JSON")
    a = p.parse_args(argv)
    for d in (a.trt, a.ort):
        if not d.is_dir():
            print(f"tensorrt_compare: {d} is not an engine dir", file=sys.stderr)
            return 2
    calls = record(a.ort, json.loads(a.requests.read_text()), a.calls, a.batch)
    try:
        report = compare(a.trt, a.ort, calls, a.atol, a.rtol)
    except Exception as e:  # an engine TensorRT cannot load here, a missing module
        print(f"tensorrt_compare: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0 if all(r["passed"] for r in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
