"""edge-build: build engines and the multi-stage graph from a Hugging Face checkpoint."""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from pathlib import Path

from edgeomni.plugins.backends import BACKENDS

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="edge-build",
        description=(
            "Export each component of a Hugging Face checkpoint to ONNX, lower the attention "
            "plugin for the backend, build one engine per component, and write "
            "multistage_config.json beside them. With --graph-only, build nothing: write "
            "multistage_config.json for the engines already in --engine-dir."
        ),
        epilog=(
            "--graph-only looks for the backbone in ENG, ENG/thinker or ENG/llm; for the audio "
            "and visual encoders in audio/ and visual/ under ENG or ENG/multimodal; for every "
            "other engine in its own subdirectory (talker/, code_predictor/, code2wav/). An engine "
            "anywhere else is left out and logged. It writes no graph, and says why, for a "
            "tensor-parallel build, a build without its llm, or an engine that no stage runs; a "
            "multistage_config.json it did not write is kept as multistage_config.json.orig. "
            "A build replaces ENG only when ENG holds nothing but the files its "
            "edgeomni_manifest.json lists, unchanged since edge-build wrote them. "
            "Exit status: 0 built (or graph written); 2 bad input (checkpoint, model type, "
            "flags, an engine dir it may not replace or cannot write) or, with --graph-only, no "
            "graph could be written; 1 internal error (one line; -v shows the traceback) or a "
            "system error such as a full disk; "
            "130 (SIGINT) or 143 (SIGTERM) interrupted, ENG left as it was."
        ),
    )
    p.add_argument("--model-dir", type=Path, required=True, help="HF checkpoint directory (local)")
    p.add_argument(
        "--engine-dir",
        type=Path,
        default=None,
        help="where engines and graph go (required unless --estimate)",
    )
    p.add_argument(
        "--estimate",
        action="store_true",
        help="build nothing: print each component's memory for this build (engine weights at "
        "the chosen --dtype / --quantization, host embedding tables, the KV cache at "
        "--max-batch-size x --max-kv-cache-capacity) and the total, from config.json alone (and "
        "a pre-quantized checkpoint's tensor headers, where its weights are there)",
    )
    p.add_argument(
        "--graph-only",
        action="store_true",
        help=(
            "build nothing: find the engines already in --engine-dir and write their "
            "multistage_config.json (the size, backend and components flags are not needed; "
            "each stage's limits come from its engine's config.json); exit 2 with the reason "
            "when no graph can be written"
        ),
    )
    p.add_argument(
        "--max-batch-size", type=int, default=None, help="requests per cohort (default 4)"
    )
    p.add_argument(
        "--max-input-len",
        type=int,
        default=None,
        help="longest prompt in tokens (default 1024, or --max-kv-cache-capacity when that is "
        "smaller)",
    )
    p.add_argument(
        "--max-kv-cache-capacity",
        type=int,
        default=None,
        help="KV cache slots per request: prompt plus generated tokens (default 4096)",
    )
    p.add_argument(
        "--backend",
        choices=tuple(BACKENDS),
        default=None,
        help="engine backend (default onnxruntime). "
        + " ".join(f"{name}: {b.help}" for name, b in BACKENDS.items())
        + " Backends that run on cuda only need --device cuda (their default). Builds without "
        "a GPU (a note then says what this machine lacks to run the engines)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="where the engines run (default cpu, cuda for the TensorRT backends; cuda with "
        "onnxruntime: ONNX Runtime's CUDA provider, built here and optimised for the GPU when "
        "first loaded there)",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "float16"),
        default=None,
        help="decoder weights and activations (default float32; encoders and the vocoder "
        "stay float32)",
    )
    p.add_argument(
        "--logits-topk",
        type=int,
        default=None,
        metavar="K",
        help="decoders also output each row's K best logits, so sampling copies K candidates "
        "to the host instead of the vocabulary (default 64 with --device cuda, 0 = off on cpu)",
    )
    p.add_argument(
        "--quantization",
        choices=("int4_rtn", "int4_awq"),
        default=None,
        help="weight-only quantization of the decoders' linear layers (the LLM or thinker, "
        "talkers, code predictors): int4_rtn rounds each group of weights to 4 bits around 0, "
        "one scale per group (symmetric; no calibration); int4_awq first scales each input "
        "channel by a factor calibrated on text (--calibration) run through the component's "
        "float graph (the LLM or thinker); talkers and code predictors are calibrated on "
        "their inputs as the built graph makes them, running the calibration requests on the "
        "CPU (a build for cpu; other builds round them plainly, with a warning). Default: float weights (--dtype). Encoders, the vocoder, norms and "
        "embeddings stay float. A pre-quantized checkpoint (AWQ, GPTQ, compressed-tensors "
        "int4; its config.json's quantization_config) builds with its own int4 weights "
        "without this flag; int4_rtn then rounds only what it left float. FP8 checkpoints are "
        "read to --dtype",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        default=None,
        metavar="FILE",
        help="int4_awq's calibration text: a request file (TensorRT Edge-LLM's format, read as "
        "edge-infer reads --input-file, prompt shorthand included; each "
        "message's text, tokenized plainly, for the text model; the requests as they are, "
        "through the built graph, for talkers and code predictors: give what the checkpoint "
        "needs, a Base checkpoint's ref_audio say; a CPU build refuses one whose requests leave it "
        "out, and the default, before any export). Default: a few KB of varied English "
        "shipped with edgeomni",
    )
    p.add_argument(
        "--group-size",
        type=int,
        choices=(32, 64, 128),
        default=None,
        help="weights per int4 scale along the input axis (default 32: the best perplexity; 128, "
        "TensorRT Edge-LLM's: 8-15%% smaller and faster on ONNX Runtime's CPU kernel, 4.1x fp32 "
        "against 3.2x at Qwen3-0.6B's sizes; docs/quantization.md)",
    )
    p.add_argument(
        "--quantize-lm-head",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --quantization, the lm_head too (default: yes; it is a quarter of "
        "Qwen3-0.6B's weights and cost 0.8%% perplexity in docs/quantization.md's measurement)",
    )
    p.add_argument(
        "--quantize-encoders",
        action="store_true",
        default=None,
        help="with --quantization, the linear layers of the components without a KV cache too: "
        "the audio and vision encoders, the voice-clone encoders and code2wav's transformer "
        "(convolutions stay float; rounded plainly, as int4_rtn). Default: no: it takes "
        "Qwen3-Omni's int4 build from 26.5 to 22.6 GB, the same Jetson tiers, and moved the "
        "tiny encoders' features by about 20%% (docs/quantization.md)",
    )
    p.add_argument(
        "--code2wav-streaming",
        choices=("stateful", "windows"),
        default=None,
        help="how a speech graph's vocoder (Qwen3-Omni's, Qwen3-TTS's code2wav) streams: "
        "stateful (default with onnxruntime on the cpu; opt-in with --device cuda) also builds "
        "its stateful step engine "
        "(code2wav_stream/: each frame decoded once, the convolutions' and attention's state "
        "carried from call to call), which the graph then streams with; windows (default with "
        "--device cuda, and the only choice with the TensorRT backends) builds only the codes -> "
        "waveform engine, "
        "which streams windows with left context. Whole-utterance vocoding works with either",
    )
    p.add_argument(
        "--code-predictor-calls",
        choices=("frame", "steps"),
        default=None,
        help="how a speech graph's code predictor (Qwen3-Omni's, Qwen3-TTS's) is called: frame "
        "(default with onnxruntime on the cpu, and only there) builds one engine that runs a "
        "codec frame's 15 steps, heads and draws in one call (int4 then covers its heads too); "
        "steps (the default elsewhere, and with --quantization int4_awq, which calibrates the "
        "steps) one call a step, which a GPU captures and draws in the engine. Both draw the "
        "same codes from the same seed",
    )
    p.add_argument(
        "--components",
        default=None,
        help="comma-separated components to build, or 'all' (default)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(name)s: %(message)s",
        stream=sys.stderr,
    )
    from edgeomni.builder import interrupts

    with interrupts.raised():
        try:
            return _run(args)
        except BaseException as e:  # each kind gets its exit status in _failed
            return _failed(e, args, interrupts.taken())


def _run(args: argparse.Namespace) -> int:
    from edgeomni.builder.build import build, estimate_only, graph_only
    from edgeomni.export.family import BuildArgs

    if args.logits_topk is not None and args.logits_topk < 0:
        print(f"edge-build: error: --logits-topk must be >= 0, got {args.logits_topk}",
              file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    if args.calibration and args.quantization != "int4_awq":
        print("edge-build: error: --calibration needs --quantization int4_awq", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not args.quantization and (args.group_size or args.quantize_lm_head is not None
                                  or args.quantize_encoders):  # fmt: skip
        print("edge-build: error: --group-size, --[no-]quantize-lm-head and --quantize-encoders "
              "need --quantization", file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    if args.code_predictor_calls == "frame" and (args.backend or "onnxruntime",
                                                 args.device or "cpu") != ("onnxruntime", "cpu"):  # fmt: skip
        print("edge-build: error: --code-predictor-calls frame is built for --backend onnxruntime "
              "--device cpu", file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    if args.code_predictor_calls == "frame" and args.quantization == "int4_awq":
        print("edge-build: error: --code-predictor-calls frame takes --quantization int4_rtn: "
              "int4_awq calibrates the code predictor's steps engine", file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    if args.engine_dir is None and not args.estimate:
        print("edge-build: error: --engine-dir is required (unless --estimate)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.estimate and args.graph_only:
        print("edge-build: error: --estimate and --graph-only exclude each other",
              file=sys.stderr)  # fmt: skip
        return EXIT_BAD_INPUT
    if args.graph_only:
        _warn_ignored(args)
        graph = graph_only(args.model_dir, args.engine_dir, raise_no_graph=True)
    else:
        capacity = _or(args.max_kv_cache_capacity, 4096)
        build_args = BuildArgs(
            max_batch_size=_or(args.max_batch_size, 4),
            # a prompt must fit the cache: the default never exceeds a smaller capacity given
            max_input_len=_or(args.max_input_len, max(1, min(1024, capacity))),
            max_kv_cache_capacity=capacity,
            backend=args.backend or "onnxruntime",
            device=args.device or BACKENDS[args.backend or "onnxruntime"].devices[0],
            dtype=args.dtype or "float32",
            logits_topk=args.logits_topk,
            quantization=args.quantization,
            group_size=_or(args.group_size, 32),
            quantize_lm_head=args.quantize_lm_head is not False,
            quantize_encoders=bool(args.quantize_encoders),
            calibration=str(args.calibration) if args.calibration else None,
            code2wav_streaming=args.code2wav_streaming,
            code_predictor_calls=args.code_predictor_calls,
        )
        wanted = [c.strip() for c in (args.components or "all").split(",") if c.strip()]
        if args.estimate:
            print(estimate_only(args.model_dir, build_args, wanted))
            return EXIT_OK
        graph = build(args.model_dir, args.engine_dir, build_args, wanted)
        _note_gpu(build_args.backend, build_args.device)
    if graph is not None:
        print(f"edge-build: wrote {graph}", file=sys.stderr)
    return EXIT_OK


def _note_gpu(backend: str, device: str) -> None:
    """A cuda build made where its engines cannot run (no GPU, no cuda-python): legitimate
    (built for another machine), so one note, not an error, naming all this machine lacks,
    as edge-infer would refuse the engines here."""
    from edgeomni.plugins.backends import cuda_missing

    missing = cuda_missing(backend, 0) if device == "cuda" else []
    if missing:
        print(f"edge-build: note: these cuda engines cannot run here: {' and '.join(missing)}",
              file=sys.stderr)  # fmt: skip


def _failed(e: BaseException, args: argparse.Namespace, signum: int | None) -> int:
    """One line and the exit status for what stopped the run; a traceback only for a bug.

    An interrupt counts whatever exception it became: torch's exporter wraps it in its own."""
    from edgeomni.builder.errors import BuildError
    from edgeomni.builder.interrupts import exit_status
    from edgeomni.export.common.checkpoint import CheckpointError
    from edgeomni.export.registry import UnknownModelType

    if signum is not None or isinstance(e, KeyboardInterrupt):
        print(f"edge-build: interrupted; {args.engine_dir} was left as it was", file=sys.stderr)
        return exit_status(e, signum)
    if isinstance(e, (BuildError, CheckpointError, UnknownModelType)):
        print(f"edge-build: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if _config_class_refused(e):  # the encoders' config sections, read by transformers' classes
        print(f"edge-build: error: config.json: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if isinstance(e, OSError):  # the system's fault (a full disk), not the input's
        print(f"edge-build: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    if not isinstance(e, Exception):  # SystemExit and the like go on as they are
        raise e
    # a bug: one line; --verbose shows where
    if args.verbose:
        traceback.print_exception(e)
    hint = "" if args.verbose else " (-v shows where)"
    print(f"edge-build: internal error: {one_line(e)}{hint}", file=sys.stderr)
    return EXIT_FAILED


def _config_class_refused(e: BaseException) -> bool:
    """A config.json value of the wrong type that a transformers config class (built from the
    sections edgeomni hands on as they are: the encoders') refused, naming the field."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return False
    return isinstance(e, StrictDataclassError)


def one_line(e: BaseException) -> str:
    """An exception as one line: its type and first line, and the innermost cause's when the
    message runs on (torch's exporter wraps the real error in pages of advice)."""
    import re

    def first(x: BaseException) -> str:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(x))
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return f"{type(x).__name__}: {lines[0]}" if lines else type(x).__name__

    root = e
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    multiline = len(str(e).strip().splitlines()) > 1
    return first(e) + (f" ({first(root)})" if root is not e and multiline else "")


def _warn_ignored(args: argparse.Namespace) -> None:
    build_only = {
        "--max-batch-size": args.max_batch_size,
        "--max-input-len": args.max_input_len,
        "--max-kv-cache-capacity": args.max_kv_cache_capacity,
        "--backend": args.backend,
        "--device": args.device,
        "--dtype": args.dtype,
        "--logits-topk": args.logits_topk,
        "--quantization": args.quantization,
        "--components": args.components,
        "--code2wav-streaming": args.code2wav_streaming,
        "--code-predictor-calls": args.code_predictor_calls,
    }
    given = [flag for flag, value in build_only.items() if value is not None]
    if given:
        logging.getLogger("edge-build").warning(
            "%s ignored with --graph-only: nothing is built", ", ".join(given)
        )


def _or(value: int | None, default: int) -> int:
    """The size flags default to None so --graph-only can tell whether they were given."""
    return default if value is None else value


if __name__ == "__main__":
    sys.exit(main())
