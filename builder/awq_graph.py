"""int4_awq's calibration rows for decoders whose inputs the graph makes (talkers, code
predictors): their MatMul inputs recorded while the built graph runs calibration requests.

A talker reads the thinker's hidden states and its own codec embeddings; a code predictor reads
the talker's hidden state. Text through the component's own graph cannot make those, so once
every engine of the build is written, the build runs the calibration requests through the
whole graph (``edge-infer --record-taps``: edgeomni's runtime in a process of its own,
ONNX Runtime on this machine's CPU; runtime/taps.py). Each component being
calibrated runs there as its float graph, lowered for the CPU with the inputs of the MatMuls
to quantize added as outputs, and every call's rows of those outputs are kept. The engines
upstream are the build's own (the thinker already int4, as it will run).

It needs the build's engines to run on this CPU: an ONNX Runtime build for ``cpu``. Other
builds (CUDA, TensorRT) round these components plainly, with a warning (docs/quantization.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.builder.awq import ROWS

REQUESTS = 8  # calibration requests run through the graph (the first of the texts)
MAX_TOKENS = 48  # text tokens each may generate


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
    (``tokenizer``; the prompt's template adds its own). On top, where the file does not set
    them: a token cap, seed 0 (the same rows every build) and the family's ``fields`` (a
    CustomVoice speaker, a frame cap)."""
    import json

    if given is not None:
        body = json.loads(Path(given).read_text(encoding="utf-8"))
    else:
        pieces = [p for t in texts for p in _pieces(t, tokenizer, max(8, max_input_len // 2))]
        body = {"requests": [{"messages": [{"role": "user", "content": p}]}
                             for p in pieces[:REQUESTS]]}  # fmt: skip
    return {"max_generate_length": MAX_TOKENS, "seed": 0, **(fields or {}), **body}


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
    """Run ``body``'s requests through the graph in ``engine_dir`` (edge-infer --record-taps,
    in a process of its own: the runtime sits above the builder); for each component folder in
    ``taps`` (folder -> (its raw graph, the MatMul inputs to record)), those inputs' rows. Or
    why it could not be done."""
    import json
    import subprocess
    import tempfile

    command = edge_infer()
    if command is None:
        return "edge-infer, which runs the graph, is not installed beside this Python"
    folders = list(taps)
    with tempfile.TemporaryDirectory(prefix="edge-build-awq-") as tmp:
        entries = []
        for i, folder in enumerate(folders):
            raw, inputs = taps[folder]
            model = raw.with_name(f"{raw.stem}.taps{i}.onnx")  # beside raw: its data stays put
            tap_model(raw, inputs, model)
            entries.append({"folder": str(folder), "model": str(model), "outputs": list(inputs)})
        spec = {"taps": entries, "body": body, "batch_size": batch_size, "rows": ROWS,
                "rows_file": str(Path(tmp) / "rows.npz")}  # fmt: skip
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        try:
            done = subprocess.run(
                [command, "--config", str(engine_dir), "--record-taps",
                 str(Path(tmp) / "spec.json")], capture_output=True, text=True,
            )  # fmt: skip
        finally:
            for entry in entries:
                Path(entry["model"]).unlink(missing_ok=True)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            why = lines[-1].removeprefix("edge-infer: error: ") if lines else "no message"
            return f"running the graph for calibration failed ({why})"
        with np.load(spec["rows_file"]) as saved:
            got = {k: saved[k] for k in saved.files}
    return {folder: {name: got[f"{i}/{name}"] for name in taps[folder][1] if f"{i}/{name}" in got}
            for i, folder in enumerate(folders)}  # fmt: skip


def edge_infer() -> str | None:
    """The edge-infer this Python's edgeomni installed (its scripts folder, else PATH)."""
    import shutil
    import sysconfig

    beside = Path(sysconfig.get_path("scripts")) / "edge-infer"
    return str(beside) if beside.is_file() else shutil.which("edge-infer")


def runs_here(args: Any) -> bool:
    """Whether this build's engines run on this machine's CPU, so the calibration requests can
    run through its graph (else its talkers and code predictors are rounded plainly)."""
    return args.backend == "onnxruntime" and str(args.device).partition(":")[0] == "cpu"


def check_requests(hooks: Any, ckpt: Any, selected: Sequence[Any], args: Any) -> None:
    """Before any export: the calibration requests can run through the graph of ``selected``,
    setting every request key the family's optional ``calibration_needs`` names (a
    voice-clone checkpoint's reference clip, which the shipped text cannot give)."""
    from edgeomni.builder import awq
    from edgeomni.builder.errors import BuildError

    hook = getattr(hooks, "calibration_needs", None)
    if args.quantization != "int4_awq" or not runs_here(args) or not callable(hook):
        return
    needs = dict(hook(ckpt, tuple(selected)))
    if not needs:
        return
    keys = " and ".join(needs)
    what = "; ".join(f"{key}: {meaning}" for key, meaning in needs.items())
    if args.calibration is None:
        raise BuildError(
            f"--quantization int4_awq: the talkers and code predictors of {ckpt.path} are "
            f"calibrated by running requests through the built graph, and each request needs "
            f"{keys} ({what}), which the shipped calibration text cannot give: pass "
            f"--calibration FILE, a request file whose requests set {keys}"
        )
    for i, request in enumerate(awq.read_requests(Path(args.calibration))):
        missing = [key for key in needs if key not in request["given"]]
        if missing:
            raise BuildError(
                f"--calibration {args.calibration}: request {i} sets no {', '.join(missing)} "
                f"({what}); the calibration requests run through {ckpt.path}'s graph need it"
            )


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
    elif not runs_here(args):
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
            cfg = json.loads(path.read_text())
            cfg["quantization"]["awq"] = {"calibrated": False, "why": rows}
            path.write_text(json.dumps(cfg, indent=2) + "\n")
            continue
        out = raw.with_name(raw.stem + ".awq.onnx")
        report = quantize.quantize_file(raw, out, spec, rows=rows[out_dir])
        build_engine(comp, out, out_dir, {"quantization": report})
