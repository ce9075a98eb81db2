"""int4_awq: activation-aware scales for the int4 pass (builder/quantize.py).

AWQ (Lin et al., 2023) scales each input channel of a linear layer before rounding, so the
channels that carry large activations keep more of their precision: y = (x / s) @ Q(s * W).
edgeomni calibrates on the exported graph itself:

1. the calibration text is tokenized with the stage's own tokenizer and embedded with its own
   embedding table (the artifacts the build just wrote), and run through the component's float
   graph, lowered for ONNX Runtime's CPU provider, with the input of every MatMul to quantize
   added as an output;
2. for each group of MatMuls that read the same input (the packed q/k/v projection, gate/up),
   one per-channel scale s = mean|x| ** alpha is searched over alpha in 0, 0.05, ... 1 for the
   least squared error of the layers' outputs on the calibration rows (alpha 0 is plain RTN, so
   the search never does worse than RTN on its own data);
3. 1 / s is folded into the RMSNormalization that makes the input when the group are its only
   readers, else applied by one Mul before them.

Components whose inputs are not a stage's token embeddings (talkers and code predictors take
what the graph hands them) get their rows from builder/awq_graph.py instead. Not done (yet):
AWQ's clipping search.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeomni.builder.errors import BuildError

log = logging.getLogger("edge-build")
DEFAULT_CALIBRATION = Path(__file__).with_name("calibration.txt")
ALPHAS = tuple(i / 20 for i in range(21))
ROWS = 512  # calibration token rows kept per MatMul input (spread over the whole text)
CHUNK = 256  # tokens per calibration call


def calibration_texts(path: Path | None) -> list[str]:
    """The shipped text (paragraphs), or a request file's message texts, read as edge-infer's
    --input-file reads it (read_requests)."""
    if path is None:
        return [p for p in DEFAULT_CALIBRATION.read_text().split("\n\n") if p.strip()]
    texts = [t for r in read_requests(path) for t in r["texts"]]
    if not any(t.strip() for t in texts):
        raise BuildError(f"--calibration {path}: no message text in its requests")
    return texts


def read_requests(path: Path) -> list[dict[str, Any]]:
    """Each request of the request file at ``path`` ({"texts": its messages' texts, "given":
    the keys it sets, its file's top level's too}), read by the reader edge-infer runs files
    with (runtime/requests.py, which sits above the builder: asked through edge-infer
    --read-requests), so a file one takes the other takes, and a typo is named alike."""
    import subprocess

    from edgeomni.builder.awq_graph import edge_infer

    command = edge_infer()
    if command is None:
        raise BuildError("--calibration: edge-infer, which reads request files, is not "
                         "installed beside this Python")  # fmt: skip
    done = subprocess.run([command, "--read-requests", str(path)], capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        why = lines[-1].removeprefix("edge-infer: error: ") if lines else "no message"
        raise BuildError(f"--calibration: {why}")
    return list(json.loads(done.stdout)["requests"])


def calibration_rows(
    raw: Path, out_dir: Path, inputs: Sequence[str], texts: Sequence[str]
) -> dict[str, np.ndarray] | str:
    """Each of ``inputs`` (tensor names in the raw graph) as float32 rows [n, K] over the
    calibration text; or why this component cannot be calibrated so."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    from edgeomni.plugins import lower_model
    from edgeomni.plugins.lowering import onnxruntime_options

    table_path, tok_path = out_dir / "embedding.safetensors", out_dir / "tokenizer.json"
    if not table_path.is_file() or not tok_path.is_file():
        return "its inputs are not a stage's token embeddings"
    model = onnx.load(str(raw), load_external_data=False)
    feeds_spec = {i.name: i for i in model.graph.input}
    embeds = feeds_spec.get("inputs_embeds")
    known = {"inputs_embeds", "position_ids", "past_lens", "query_lens", "last_indices",
             "deepstack_embeds"}  # fmt: skip
    unknown = [n for n in feeds_spec if n not in known and not n.startswith("past_")]
    if embeds is None or unknown:
        return f"its graph takes inputs calibration cannot make ({', '.join(unknown)})"
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    table = load_file(str(table_path))["embedding"]
    width = embeds.type.tensor_type.shape.dim[-1].dim_value
    if width and table.shape[1] != width:
        return "its embedding table is not its input width"
    lower_model(model, "onnxruntime", onnxruntime_options())
    for name in inputs:
        model.graph.output.append(helper.make_empty_tensor_value_info(name))
    calib = raw.with_name(raw.stem + ".calibrate.onnx")
    onnx.save(model, str(calib))  # beside raw: its external data stays where it points
    session = ort.InferenceSession(str(calib), providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_file(str(tok_path))
    ids = [i for t in texts for i in tok.encode(t, add_special_tokens=False).ids]
    rows: dict[str, list[np.ndarray]] = {n: [] for n in inputs}
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        out = session.run(list(inputs), _feeds(session, table[chunk], len(chunk)))
        for name, value in zip(inputs, out, strict=True):
            rows[name].append(np.asarray(value, np.float32).reshape(-1, value.shape[-1]))
    calib.unlink()
    rng = np.random.default_rng(0)
    result = {}
    for name, parts in rows.items():
        x = np.concatenate(parts)
        result[name] = x[np.sort(rng.choice(len(x), ROWS, replace=False))] if len(x) > ROWS else x
    return result


def _feeds(session: Any, embeds: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """One prefill of n tokens from position 0 into an empty cache of n slots."""
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
             "tensor(int64)": np.int64, "tensor(int32)": np.int32}  # fmt: skip
    feeds = {}
    for i in session.get_inputs():
        dtype, rank = types[i.type], len(i.shape)
        if i.name == "inputs_embeds":
            feeds[i.name] = embeds[None].astype(dtype)
        elif i.name == "position_ids":  # [1, S] or, with MRoPE, [3, 1, S]: text positions
            feeds[i.name] = np.broadcast_to(np.arange(n, dtype=dtype), (3, 1, n) if rank == 3
                                            else (1, n)).copy()  # fmt: skip
        elif i.name == "past_lens":
            feeds[i.name] = np.zeros(1, dtype)
        elif i.name == "query_lens":
            feeds[i.name] = np.full(1, n, dtype)
        elif i.name == "last_indices":
            feeds[i.name] = np.full(1, n - 1, dtype)
        elif i.name == "deepstack_embeds":  # no image in calibration text: zeros, as at run time
            feeds[i.name] = np.zeros((i.shape[0], 1, n, embeds.shape[-1]), dtype)
        else:  # a state input, one empty row: a KV cache's capacity (its dynamic axis) n slots
            feeds[i.name] = np.zeros([1, *(d if isinstance(d, int) else n for d in i.shape[1:])],
                                     dtype)  # fmt: skip
    return feeds


def search_scale(
    x: np.ndarray, weights: Sequence[np.ndarray], group: int
) -> tuple[np.ndarray, float, float]:
    """(s [K], best alpha, its error / RTN's error) for the weights [K, N_i] that read x [n, K]."""
    from edgeomni.plugins import quant_linear

    magnitude = np.abs(x).mean(axis=0).astype(np.float64) + 1e-8
    reference = [x @ w.astype(np.float32) for w in weights]
    best: tuple[float, np.ndarray, float] | None = None
    rtn_error = None
    for alpha in ALPHAS:
        s = magnitude**alpha
        s = (s / np.sqrt(s.max() * s.min())).astype(np.float32)  # centred around 1
        error = 0.0
        for w, y in zip(weights, reference, strict=True):
            scaled = (w.astype(np.float32) * s[:, None]).astype(w.dtype)
            packed, scales = quant_linear.quantize_symmetric(scaled, group, w.dtype)
            deq = quant_linear.dequantize(packed, scales, None, k=w.shape[0], block_size=group)
            error += float(np.square((x / s) @ deq.astype(np.float32) - y).sum())
        if alpha == 0:
            rtn_error = error
        if best is None or error < best[0]:
            best = (error, s, alpha)
    assert best is not None and rtn_error is not None
    return best[1], best[2], best[0] / max(rtn_error, 1e-30)
