"""edge-infer: run requests through a built engine dir's multi-stage graph."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_CONFIG, EXIT_REQUESTS_FAILED = 0, 1, 2, 3

EPILOG = """\
exit status:
  0  every request succeeded (or --validate-config found the graph valid)
  2  bad usage, bad graph or engine dir, or a malformed request file
  3  the run finished but one or more requests failed (see predictions: ok, error)
  1  an unexpected internal error
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="edge-infer",
        description="Run requests through the multi-stage graph of a built engine dir.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config", required=True, type=Path, help="engine dir, or its multistage_config.json"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="one user message; the reply goes to stdout")
    src.add_argument("--input-file", type=Path, help="request file (llm_inference format)")
    p.add_argument(
        "--audio",
        action="append",
        default=[],
        metavar="WAV",
        help="with --prompt: an audio file for the thinker to hear (any rate; resampled to 16 kHz); "
        "repeatable",
    )
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="FILE",
        help="with --prompt: an image; repeatable",
    )
    p.add_argument("--output-file", type=Path, help="predictions.json to write (atomically)")
    p.add_argument(
        "--batch-size",
        type=int,
        help="requests per cohort, also capped by the build's max_batch (default: the request "
        "file's batch_size, else 1)",
    )
    p.add_argument(
        "--sampling",
        default="{}",
        help='default sampling as JSON, e.g. \'{"temperature":0.7,"top_k":20}\'; request-file '
        "keys override it. Greedy: top_k 1 or temperature 0",
    )
    p.add_argument(
        "--max-generate-length", type=int, help="tokens to generate for --prompt (default 256)"
    )
    p.add_argument(
        "--no-chat-template",
        action="store_true",
        help="send --prompt to the model as raw text instead of through the chat template",
    )
    p.add_argument(
        "--validate-config",
        action="store_true",
        help="check the graph's structure and runners, load no engine, and exit",
    )
    p.add_argument(
        "--dump-profile",
        action="store_true",
        help="print per-stage times, peak memory and wall clock to stderr",
    )
    p.add_argument(
        "--out-audio",
        type=Path,
        help="with --prompt: run the speech stages too and write the reply's audio (WAV) here",
    )
    p.add_argument(
        "--output-audio-dir",
        type=Path,
        help="with --input-file: run the speech stages too and write audio_req<i>.wav and the "
        "codec codes rvq_req<i>.safetensors here",
    )
    p.add_argument("--voice", help="speaker for --prompt (an unknown voice lists the known ones)")
    p.add_argument(
        "--whole-utterance",
        action="store_true",
        help="vocode each utterance in one pass after the talker finishes, when it fits the "
        "vocoder engine (default: in windows with left context)",
    )
    p.add_argument("--threads", type=int, help="CPU threads per engine (default: all cores)")
    p.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="GPU engines run every decode step and vocoder window as separate kernel "
        "launches instead of replaying a captured CUDA graph (slower; for debugging)",
    )
    p.add_argument(
        "--stage-streaming",
        action="store_true",
        help="start the talker at the reply's first token and run the thinker's later steps as "
        "it needs them, instead of after the thinker finished every reply of the cohort (the "
        "same tokens and codes). Meant for a GPU: on an H200 audio started 1.4-2.4x sooner, "
        "throughput from 10%% lower to 13%% higher; on a CPU the run is slower and audio starts "
        "no sooner (docs/benchmarks.md)",
    )
    return p


def _fail(message: str, code: int) -> int:
    print(f"edge-infer: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from edgeomni.graph_schema import GraphError
    from edgeomni.runtime.engine import EngineError
    from edgeomni.runtime.pipeline import Pipeline, load_graph
    from edgeomni.runtime.requests import (
        load_request_file,
        parse_request_file,
        parse_sampling,
        write_predictions,
    )

    if args.validate_config:
        try:
            _, graph = load_graph(args.config)
        except GraphError as e:
            return _fail(f"invalid graph: {e}", EXIT_BAD_CONFIG)
        print(
            f"{args.config}: valid ({len(graph.stages)} stages, terminals {', '.join(graph.terminals)})"
        )
        return EXIT_OK
    if args.prompt is None and args.input_file is None:
        return _fail(
            "give --prompt TEXT or --input-file FILE (or --validate-config)", EXIT_BAD_CONFIG
        )
    if args.batch_size is not None and args.batch_size < 1:
        return _fail("--batch-size must be at least 1", EXIT_BAD_CONFIG)
    if (args.audio or args.image) and args.prompt is None:
        return _fail(
            "--audio and --image go with --prompt (put media in the request file)", EXIT_BAD_CONFIG
        )
    if args.out_audio is not None and args.prompt is None:
        return _fail(
            "--out-audio goes with --prompt (use --output-audio-dir for a file)", EXIT_BAD_CONFIG
        )
    if args.output_audio_dir is not None and args.input_file is None:
        return _fail("--output-audio-dir goes with --input-file", EXIT_BAD_CONFIG)

    try:
        sampling, extra = parse_sampling(json.loads(args.sampling))
    except (ValueError, TypeError) as e:
        return _fail(f"--sampling: {e}", EXIT_BAD_CONFIG)
    try:
        if args.input_file is not None:
            requests, settings = load_request_file(args.input_file, sampling, extra)
        else:
            media = [{"type": "audio", "audio": str(a)} for a in args.audio]
            media += [{"type": "image", "image": str(i)} for i in args.image]
            content = [*media, {"type": "text", "text": args.prompt}] if media else args.prompt
            body: dict = {
                "apply_chat_template": not args.no_chat_template,
                "requests": [{"messages": [{"role": "user", "content": content}]}],
            }
            if args.max_generate_length is not None:
                body["max_generate_length"] = args.max_generate_length
            if args.voice is not None:
                body["requests"][0]["voice"] = args.voice
            requests, settings = parse_request_file(body, sampling, extra)
    except ValueError as e:
        return _fail(str(e), EXIT_BAD_CONFIG)

    want_audio = args.out_audio is not None or args.output_audio_dir is not None
    try:
        pipeline = Pipeline(
            args.config,
            threads=args.threads,
            whole_utterance=args.whole_utterance,
            cuda_graphs=not args.no_cuda_graphs,
            stream_stages=args.stage_streaming,
        )
    except GraphError as e:
        return _fail(f"invalid graph: {e}", EXIT_BAD_CONFIG)
    except (OSError, RuntimeError) as e:
        return _fail(str(e), EXIT_BAD_CONFIG)
    if want_audio and not pipeline.audio_terminals():
        return _fail("this graph has no audio output", EXIT_BAD_CONFIG)
    batch_size = args.batch_size or settings.get("batch_size") or 1
    # text stages only, unless audio was asked for (a graph without text always speaks)
    requested = None if want_audio else (pipeline.text_terminals() or None)
    try:
        outcomes = pipeline.run(requests, batch_size=batch_size, requested=requested)
    except EngineError as e:  # an engine the graph names cannot be opened
        return _fail(str(e), EXIT_BAD_CONFIG)
    for outcome in outcomes:
        write_audio(outcome, args)
    entries = [o.entry for o in outcomes]

    if args.output_file is not None:
        write_predictions(args.output_file, entries)
    if args.prompt is not None:
        entry = entries[0]
        if entry["ok"]:
            print(entry.get("output_text", ""))
        else:
            print(f"edge-infer: request failed: {entry['error']}", file=sys.stderr)
    else:
        bad = [e for e in entries if not e["ok"]]
        print(
            f"edge-infer: {len(entries) - len(bad)} of {len(entries)} requests succeeded"
            + (f"; wrote {args.output_file}" if args.output_file else ""),
            file=sys.stderr,
        )
        for e in bad:
            print(f"  request {e['request_idx']}: {e['error']}", file=sys.stderr)
    if args.dump_profile:
        print(json.dumps(pipeline.profile.as_dict(), indent=2), file=sys.stderr)
    return EXIT_OK if all(e["ok"] for e in entries) else EXIT_REQUESTS_FAILED


def write_audio(outcome: Any, args: argparse.Namespace) -> None:
    """Write the request's audio (and codes) where the flags say; add the audio fields."""
    from edgeomni.runtime.audio import write_wav
    from edgeomni.runtime.safetensors_np import save

    entry = outcome.entry
    if outcome.audio is None or not entry["ok"]:
        return
    i = entry["request_idx"]
    if args.out_audio is not None:
        wav = args.out_audio
    elif args.output_audio_dir is not None:
        args.output_audio_dir.mkdir(parents=True, exist_ok=True)
        wav = args.output_audio_dir / f"audio_req{i}.wav"
        if outcome.codes is not None:
            rvq = args.output_audio_dir / f"rvq_req{i}.safetensors"
            save(rvq, {"codes": outcome.codes})
            entry["rvq_file"] = str(rvq)
    else:
        return
    write_wav(wav, outcome.audio, outcome.sample_rate)
    entry.update(
        audio_file=str(wav),
        audio_samples=int(len(outcome.audio)),
        audio_sample_rate=outcome.sample_rate,
        audio_duration_ms=round(1e3 * len(outcome.audio) / outcome.sample_rate, 3),
    )


if __name__ == "__main__":
    sys.exit(main())
