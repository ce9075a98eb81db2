"""int4_awq's calibration rows for decoders whose inputs the graph makes (talkers, code
predictors): their MatMul inputs recorded while the built graph runs calibration requests.

A talker reads the thinker's hidden states and its own codec embeddings; a code predictor reads
the talker's hidden state. Text through the component's own graph cannot make those, so once
every engine of the build is written, the build runs the calibration requests through the
whole graph (edgeomni's runtime, ONNX Runtime on this machine's CPU). Each component being
calibrated runs there as its float graph, lowered for the CPU with the inputs of the MatMuls
to quantize added as outputs, and every call's rows of those outputs are kept. The engines
upstream are the build's own (the thinker already int4, as it will run).

It needs the build's engines to run on this CPU: an ONNX Runtime build for ``cpu``. Other
builds (CUDA, TensorRT) round these components plainly, with a warning (docs/quantization.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.builder.awq import ROWS
from edgeomni.runtime.engine import Engines, OrtBinding, OrtEngine, open_engine

REQUESTS = 8  # calibration requests run through the graph (the first of the texts)
MAX_TOKENS = 48  # text tokens each may generate
MAX_FRAMES = 48  # codec frames each may speak


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

    def bind_in_place(self, input_name: str, output_name: str, array: Any) -> None:
        super().bind_in_place(input_name, output_name, array)
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
    def __init__(self, tap: Tap, threads: int | None) -> None:
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
        return open_engine(folder, config, threads=self.threads, cuda_graphs=False, spin=False)


class Rows:
    """Each tap's rows over the run, thinned at random to at most 4 x ROWS as they come."""

    def __init__(self) -> None:
        self.rows: dict[str, list[np.ndarray]] = {}
        self.rng = np.random.default_rng(0)

    def add(self, name: str, rows: np.ndarray) -> None:
        parts = self.rows.setdefault(name, [])
        parts.append(np.asarray(rows, np.float32).copy())
        if sum(len(p) for p in parts) > 8 * ROWS:
            x = np.concatenate(parts)
            parts[:] = [x[np.sort(self.rng.choice(len(x), 4 * ROWS, replace=False))]]

    def result(self) -> dict[str, np.ndarray]:
        out = {}
        for name, parts in self.rows.items():
            x = np.concatenate(parts)
            out[name] = (
                x[np.sort(self.rng.choice(len(x), ROWS, replace=False))] if len(x) > ROWS else x
            )
        return out


def tap_model(raw: Path, inputs: Sequence[str], out: Path) -> None:
    """``raw``'s float graph lowered for ONNX Runtime's CPU with ``inputs`` as outputs, at
    ``out`` (beside raw: its external data stays where it points)."""
    import onnx
    from onnx import helper

    from edgeomni.plugins import lower_model
    from edgeomni.plugins.lowering import onnxruntime_options

    model = onnx.load(str(raw), load_external_data=False)
    lower_model(model, "onnxruntime", onnxruntime_options())
    for name in inputs:
        model.graph.output.append(helper.make_empty_tensor_value_info(name))
    onnx.save(model, str(out))


def calibration_body(
    texts: Sequence[str], given: Path | None, fields: Mapping[str, Any] | None = None,
    max_input_len: int = 128, tokenizer: Path | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The requests run: the user's --calibration request file as it is, or REQUESTS pieces of
    the shipped text, each at most half the build's ``max_input_len`` in the graph's tokens
    (``tokenizer``; the prompt's template adds its own), with the family's ``fields`` (a
    CustomVoice speaker) at the top; token and frame counts capped."""
    import json

    if given is not None:
        body = json.loads(Path(given).read_text(encoding="utf-8"))
    else:
        pieces = [p for t in texts for p in _pieces(t, tokenizer, max(8, max_input_len // 2))]
        body = {**(fields or {}), "requests": [{"messages": [{"role": "user", "content": p}]}
                                               for p in pieces[:REQUESTS]]}  # fmt: skip
    return {"max_generate_length": MAX_TOKENS, **body}


def _pieces(text: str, tokenizer: Path | None, budget: int) -> list[str]:
    """``text`` cut into runs of whole words of at most ``budget`` tokens each (words when no
    tokenizer is given)."""
    count: Callable[[str], int] = lambda t: len(t.split())  # noqa: E731
    if tokenizer is not None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer))
        count = lambda t: len(tok.encode(t, add_special_tokens=False).ids)  # noqa: E731
    pieces: list[str] = []
    for word in text.split():
        if pieces and count(pieces[-1] + " " + word) <= budget:
            pieces[-1] += " " + word
        elif count(word) <= budget:
            pieces.append(word)
    return pieces


def record(
    engine_dir: Path, taps: Mapping[Path, tuple[Path, Sequence[str]]], body: dict[str, Any],
    batch_size: int,
) -> dict[Path, dict[str, np.ndarray]] | str:  # fmt: skip
    """Run ``body``'s requests through the graph in ``engine_dir``; for each component folder
    in ``taps`` (folder -> (its raw graph, the MatMul inputs to record)), those inputs' rows.
    Or why it could not be done."""
    from edgeomni.runtime.pipeline import Pipeline
    from edgeomni.runtime.requests import parse_request_file, parse_sampling

    rows = {folder: Rows() for folder in taps}
    made: dict[Path, Tap] = {}
    files = []
    try:
        for folder, (raw, inputs) in taps.items():
            out = raw.with_name(raw.stem + ".taps.onnx")
            files.append(out)
            tap_model(raw, inputs, out)
            made[folder.resolve()] = Tap(out, tuple(inputs), rows[folder].add)
        sampling, extra = parse_sampling({"talker_max_new_tokens": MAX_FRAMES, "seed": 0})
        requests, _ = parse_request_file(body, sampling, extra, ("talker_max_new_tokens", "seed"))
        pipeline = Pipeline(
            engine_dir, engines=TapEngines(threads=None, taps=made), batching="cohort"
        )  # the same rows every build
        outcomes = pipeline.run(requests, batch_size=batch_size, requested=None)
    except Exception as e:  # noqa: BLE001 - any failure leaves the plain rounding, said why
        return f"running the graph for calibration failed ({type(e).__name__}: {e})"
    finally:
        for f in files:
            f.unlink(missing_ok=True)
    failed = [o.entry.get("error") for o in outcomes if not o.entry.get("ok", True)]
    if failed and len(failed) == len(outcomes):
        return f"every calibration request failed ({failed[0]})"
    result = {folder: r.result() for folder, r in rows.items()}
    for folder, got in result.items():
        if not got:
            return f"{folder.name} was not called by the calibration requests"
    return result


def requantize(
    staging: Path, graph: Path | None, later: Sequence[tuple[Any, Path, Path]], args: Any,
    build_engine: Callable[[Any, Path, Path, dict[str, Any]], None],
    fields: Mapping[str, Any] | None = None,
) -> None:  # fmt: skip
    """int4_awq for ``later`` (component, its exported float graph, its folder), rounded
    plainly so far: record their MatMul inputs through the built graph in ``staging``, then
    quantize each again with the calibrated scales and build its engine again. Where that
    cannot be done they stay plainly rounded; a warning and their config.json say why.
    ``fields``: the family's top-level request fields for the shipped text (its optional
    ``calibration_fields`` hook)."""
    import json
    import logging

    import onnx

    from edgeomni.builder import awq, quantize

    log = logging.getLogger("edge-build")
    calibration = Path(args.calibration) if args.calibration else None
    spec = quantize.Quantization("int4_awq", args.group_size, args.quantize_lm_head, calibration)
    why = None
    if graph is None:
        why = "no graph was written to run"
    elif args.backend != "onnxruntime" or str(args.device).partition(":")[0] != "cpu":
        why = (f"their calibration runs the built graph on this machine's CPU, and this build "
               f"is for {args.backend} on {args.device}")  # fmt: skip
    rows: dict[Path, dict[str, np.ndarray]] | str = why or ""
    if why is None:
        taps = {}
        for _, raw, out_dir in later:
            model = onnx.load(str(raw), load_external_data=False)
            taps[out_dir] = (raw, list(quantize._groups(model, spec)))
        tokenizer = next(iter(sorted(staging.rglob("tokenizer.json"))), None)
        body = calibration_body(awq.calibration_texts(calibration), calibration, fields,
                                args.max_input_len, tokenizer)  # fmt: skip
        log.info("int4_awq: running %d calibration requests through the built graph for %s",
                 len(body.get("requests", [])), ", ".join(c.name for c, _, _ in later))  # fmt: skip
        rows = record(staging, taps, body, min(int(args.max_batch_size), 4))
    for comp, raw, out_dir in later:
        if isinstance(rows, str):
            log.warning("%s: int4_awq cannot calibrate it (%s); its weights are rounded plainly "
                        "(int4_rtn)", comp.name, rows)  # fmt: skip
            path = out_dir / "config.json"
            report = json.loads(path.read_text())["quantization"]
            report["awq"] = {"calibrated": False, "why": rows}
            path.write_text(json.dumps({**json.loads(path.read_text()),
                                        "quantization": report}, indent=2) + "\n")  # fmt: skip
            continue
        out = raw.with_name(raw.stem + ".awq.onnx")
        report = quantize.quantize_file(raw, out, spec, rows=rows[out_dir])
        build_engine(comp, out, out_dir, {"quantization": report})
