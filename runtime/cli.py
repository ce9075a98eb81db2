"""edge-infer: run requests through a built engine dir's multi-stage graph."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeomni.runtime.context_cache import CONTEXT_CACHE_HELP, cache_mb_error
from edgeomni.runtime.destinations import PATH_KEYS, destination_error, engine_inputs
from edgeomni.runtime.engine import VOCODER_THREADS_HELP
from edgeomni.runtime.families import REQUEST_KEYS as FAMILY_KEYS
from edgeomni.runtime.media.files import media_problem
from edgeomni.runtime.media.image import MAX_IMAGE_PIXELS, PIL_PIXEL_LIMIT
from edgeomni.runtime.scheduler import PATIENCE

EXIT_OK, EXIT_INTERNAL, EXIT_BAD_CONFIG, EXIT_REQUESTS_FAILED = 0, 1, 2, 3

EPILOG = """\
Nothing runs until the flags, the request file, the output destinations and every stage the
requests need have been checked; a request that fails (its text, chat template, media, limits,
or an engine call on its rows) fails alone, with ok false and its error, and the others still
run. Keys and flags that change nothing on this graph (a text model's keys on Qwen3-TTS, the
talker's in a run that does not speak) are named in a warning. On a graph without a text model
repetition_penalty is the talker's, as qwen3_tts_inference reads it.

exit status:
  0    every request succeeded (or --validate-config found the graph and engine dir valid)
  2    bad usage (a flag, its text, a media file it names that is missing, no audio, image
       or video, or one the run refuses: no or NaN samples, over --max-image-pixels), a bad
       graph or engine dir (what --validate-config checks), a malformed request file, or an
       output destination that cannot or may not be written (a file the run reads, an engine
       dir edge-build wrote or a place inside one); nothing ran
  3    the run finished but one or more requests failed (see predictions: ok, error; a
       request file's media file that cannot be read fails its request alone)
  130  interrupted (Ctrl-C), 143 terminated (SIGTERM): the requests that had finished are
       written, the others fail as interrupted
  1    an unexpected internal error (--verbose shows where), or the outputs could not be
       written after the run
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="edge-infer",
        description="Run requests through the multi-stage graph of a built engine dir.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config", type=Path, help="engine dir, or its multistage_config.json (required)"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--prompt",
        help="one user message; the reply goes to stdout (on a graph without a text model, "
        "Qwen3-TTS's, the text spoken into --out-audio)",
    )
    src.add_argument(
        "--input-file",
        type=Path,
        help="request file in TensorRT Edge-LLM's format (llm_inference's keys; the README lists "
        "each and what it does here)",
    )
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
    p.add_argument(
        "--max-image-pixels",
        type=int,
        default=MAX_IMAGE_PIXELS,
        metavar="N",
        help="the most pixels an image (or a video's frame file) may have, checked from its "
        f"header before it is decoded; past it the image is refused (default {MAX_IMAGE_PIXELS}, "
        f"4096x4096; at most {PIL_PIXEL_LIMIT}, Pillow's limit)",
    )
    p.add_argument(
        "--video",
        action="append",
        default=[],
        metavar="FILE",
        help="with --prompt: a video file, its frames sampled as the model's video processor "
        "samples them (needs PyAV, the 'video' extra; frames as images go in a request file's "
        "video part); repeatable",
    )
    p.add_argument(
        "--output-file",
        type=Path,
        help="predictions.json to write (atomically), in llm_inference's fields plus ok, error "
        "and stages (a request file run without it prints them on stdout). No output may be a "
        "file the run reads or lie inside an engine dir edge-build wrote",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        help="requests each stage runs together (a cohort's, with --batching cohort), also "
        "capped by the build's max_batch (default: the request file's batch_size, else 1: one "
        "at a time, whatever the build allows)",
    )
    p.add_argument(
        "--sampling",
        default="{}",
        help='default sampling as JSON, e.g. \'{"temperature":0.7,"top_k":20}\'; request-file '
        "keys override it. Greedy: top_k 1 or temperature 0",
    )
    p.add_argument(
        "--max-generate-length",
        type=int,
        help="tokens to generate (default 256; with --input-file the file's default, which its "
        "top level and requests override)",
    )
    p.add_argument(
        "--no-chat-template",
        action="store_true",
        help="send the prompt to the model as raw text instead of through the chat template "
        "(with --input-file: apply_chat_template false, unless the file sets it)",
    )
    p.add_argument(
        "--record-taps",
        type=Path,
        metavar="SPEC",
        help="what edge-build --quantization int4_awq runs to calibrate talkers and code "
        "predictors: SPEC's requests through this graph on the CPU, the engines SPEC names "
        "replaced by its models, their extra outputs' rows written to SPEC's rows file "
        "(runtime/taps.py), and exit",
    )
    p.add_argument(
        "--read-requests",
        type=Path,
        metavar="FILE",
        help="what edge-build --calibration reads its request file with (no --config): FILE "
        "read as --input-file reads it, each request's message texts and the keys it sets "
        "printed as JSON, and exit (2 naming a malformed file or the first bad request)",
    )
    p.add_argument(
        "--validate-config",
        action="store_true",
        help="check the graph (structure, runners, artifact paths) and what opening each stage "
        "reads (its config.json and required keys, engine file, tables, tokenizer and chat "
        "template), load no engine, and exit",
    )
    p.add_argument(
        "--dump-profile",
        action="store_true",
        help="print per-stage times, peak memory and wall clock to stderr, and each built "
        "component's memory (engine files, host tables, KV cache at the build's limits: "
        "edge-build --estimate's columns, as built)",
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
        "codec codes rvq_req<i>.safetensors (rvq_codes, int32 [frames, codes]) here (made if "
        "missing, in a folder that exists; not an engine dir edge-build wrote, nor inside one)",
    )
    p.add_argument(
        "--voice",
        help="speaker for --out-audio, or with --output-audio-dir the request file's default "
        "speaker (its top level and requests override it; an unknown voice fails the request "
        "with the known ones)",
    )
    for flag, key in SPEECH_FLAGS[1:]:  # the families' request controls' flags
        p.add_argument(
            flag, dest=key, type=FAMILY_KEYS[key].flag_type, help=FAMILY_KEYS[key].flag_help
        )
    p.add_argument(
        "--whole-utterance",
        action="store_true",
        help="vocode each utterance in one pass after the talker finishes, when it fits the "
        "vocoder engine; utterances finished together share calls (default: streamed while "
        "the talker runs, for the first audio sooner; see --code2wav-streaming)",
    )
    p.add_argument(
        "--code2wav-streaming",
        choices=("stateful", "windows"),
        default=None,
        help="how the vocoder streams: stateful (each frame decoded once, in chunks, with the "
        "state carried from call to call; needs an engine dir built with edge-build "
        "--code2wav-streaming stateful, the default for onnxruntime) or windows (each window "
        "decoded again with left context). Default: what the graph's code2wav stage config "
        "says (streaming), stateful where the build made the step engine",
    )
    p.add_argument(
        "--batching",
        choices=("inflight", "cohort"),
        default="inflight",
        help="inflight (default): requests join each stage's running batch as rows free up "
        "and leave it the step they finish, moving on to the next stage (thinker, talker, "
        "vocoder) at once, each with its own sampling settings, voice and seed. cohort: fixed "
        "cohorts of requests with equal settings, as TensorRT Edge-LLM's multistage_inference "
        "batches (to compare run by run)",
    )
    p.add_argument(
        "--stage-patience",
        type=int,
        metavar="TURNS",
        help="in flight, how many scheduler turns a later stage (talker, vocoder) waits for "
        f"requests still on their way before it steps a batch that is not full (default "
        f"{PATIENCE}; 0: step every turn, first audio soonest, least throughput when requests "
        "reach it one at a time)",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads per engine, at most the usable cores (default: all)",
    )
    p.add_argument(
        "--context-cache-mb",
        type=float,
        metavar="MB",
        help=CONTEXT_CACHE_HELP,
    )
    p.add_argument(
        "--vocoder-threads",
        type=int,
        metavar="N",
        help=VOCODER_THREADS_HELP,
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log debug detail, with tracebacks")
    p.add_argument(
        "--no-cuda-graphs",
        action="store_true",
        help="GPU engines run every decode step and vocoder window as separate kernel "
        "launches instead of replaying a captured CUDA graph (slower; for debugging)",
    )
    p.add_argument(
        "--stage-streaming",
        action="store_true",
        help="start the talker at the reply's first token and have it read the later tokens "
        "as the thinker writes them, instead of once the thinker finished the reply (the same "
        "tokens and codes). Measured in cohorts on an H200: audio started 1.4-2.4x sooner, "
        "throughput from 10%% lower to 13%% higher; on a CPU the run is slower and audio starts "
        "no sooner (docs/benchmarks.md)",
    )
    return p


def _fail(message: str, code: int) -> int:
    print(f"edge-infer: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if args.config is None and args.read_requests is None:
        cli.error("the following arguments are required: --config")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(name)s: %(message)s",
        stream=sys.stderr,
    )
    from edgeomni.builder import interrupts
    from edgeomni.runtime.pipeline import failure

    try:
        with interrupts.raised():
            return _main(args)
    except KeyboardInterrupt as e:  # before any request ran
        print("edge-infer: interrupted", file=sys.stderr)
        return interrupts.exit_status(e)
    except Exception as e:  # a bug: one line; --verbose shows where
        if args.verbose:
            traceback.print_exc()
        hint = "" if args.verbose else " (--verbose shows where)"
        return _fail(f"internal error: {failure(e)}{hint}", EXIT_INTERNAL)


def _main(args: argparse.Namespace) -> int:
    from edgeomni.builder.interrupts import deferred, exit_status, held
    from edgeomni.graph_schema import GraphError
    from edgeomni.runtime.engine import Engines
    from edgeomni.runtime.outputs import AudioWriter
    from edgeomni.runtime.pipeline import INTERRUPTED, Interrupted, Pipeline, StageError
    from edgeomni.runtime.predictions import json_bytes, predictions, write_predictions
    from edgeomni.runtime.requests import (
        load_request_file,
        loads_once,
        parse_request_file,
        parse_sampling,
    )

    if args.read_requests:
        return _read_requests(args.read_requests)
    if args.validate_config:
        return _validate(args.config)
    if args.record_taps:
        return _record_taps(args.record_taps, args.config)
    problem = usage_error(args)
    if problem:
        return _fail(problem, EXIT_BAD_CONFIG)
    try:
        raw = loads_once(args.sampling)
        sampling, extra = parse_sampling(raw)
    except (ValueError, TypeError) as e:
        return _fail(f"--sampling: {e}", EXIT_BAD_CONFIG)
    except RecursionError:
        return _fail("--sampling: nested too deeply to read", EXIT_BAD_CONFIG)
    try:
        if args.input_file is not None:
            requests, settings = load_request_file(
                args.input_file, sampling, extra, given=raw, top=flag_defaults(args)
            )
        else:
            requests, settings = parse_request_file(_prompt_body(args), sampling, extra, raw)
    except ValueError as e:
        return _fail(str(e), EXIT_BAD_CONFIG)
    except OSError as e:
        return _fail(f"--input-file: {_os_reason(e)}", EXIT_BAD_CONFIG)
    try:  # the graph (no engine is loaded): outputs may not be any file its stages read
        pipeline = Pipeline(
            args.config,
            engines=Engines(
                threads=args.threads,
                cuda_graphs=not args.no_cuda_graphs,
                max_image_pixels=args.max_image_pixels,
            ),
            whole_utterance=args.whole_utterance,
            code2wav_streaming=args.code2wav_streaming,
            stream_stages=args.stage_streaming,
            batching=args.batching,
            patience=PATIENCE if args.stage_patience is None else args.stage_patience,
            vocoder_threads=args.vocoder_threads,
            context_cache_mb=args.context_cache_mb,
        )
    except GraphError as e:
        return _fail(f"invalid graph: {e}", EXIT_BAD_CONFIG)
    except (OSError, RuntimeError) as e:
        return _fail(str(e), EXIT_BAD_CONFIG)
    problem = destination_error(args, requests, engine_inputs(pipeline))
    if problem:
        return _fail(problem, EXIT_BAD_CONFIG)

    want_audio = args.out_audio is not None or args.output_audio_dir is not None
    for key, why in settings["ignored"].items():
        print(f"edge-infer: warning: ignoring the request file's {key}: {why}", file=sys.stderr)
    if want_audio and not pipeline.audio_terminals():
        return _fail("this graph has no audio output", EXIT_BAD_CONFIG)
    if not want_audio and not pipeline.text_terminals():
        return _fail(
            "this graph makes audio only: give --out-audio (with --prompt) or --output-audio-dir",
            EXIT_BAD_CONFIG,
        )
    batch_size = args.batch_size or settings.get("batch_size") or 1
    # text stages only, unless audio was asked for (a graph without text always speaks)
    requested = None if want_audio else pipeline.text_terminals()
    if want_audio and pipeline.text_terminals():
        for key, to in settings["fallbacks"].items():
            print(f"edge-infer: warning: the request file's {key} applies to the text model "
                  f"here; TensorRT Edge-LLM's llm_inference applies it to a later stage. Set "
                  f"{to} for that stage", file=sys.stderr)  # fmt: skip
    reply = _Reply(args.prompt is not None, pipeline.text_terminals())
    # each request's audio and codes are written from its events, the moment it is spoken
    writer = AudioWriter(
        pipeline.stages_emitting("audio"), pipeline.stages_emitting("codec"),
        out_audio=args.out_audio, out_dir=args.output_audio_dir, guard=deferred,
    )  # fmt: skip
    listeners = [f for f, on in ((reply.show, reply.enabled), (writer, writer.enabled)) if on]
    interrupt: KeyboardInterrupt | None = None
    try:
        outcomes = pipeline.run(
            requests, batch_size=batch_size, requested=requested,
            listener=(lambda event: [f(event) for f in listeners]) if listeners else None,
        )  # fmt: skip
    except StageError as e:  # a stage the graph names cannot be opened: nothing ran
        return _fail(f"invalid engine dir: {e}", EXIT_BAD_CONFIG)
    except Interrupted as e:  # what finished is still written
        outcomes, interrupt = e.outcomes, e.signal
    # after the run's stages opened (an engine dir that cannot run says only that)
    _warn_inert(args, requests, pipeline, speaks=want_audio)
    entries = [o.entry for o in outcomes]
    for entry in entries:
        if entry["ok"]:
            entry.update(writer.fields.get(entry["request_idx"], {}))
    finished = sum(e["error"] != INTERRUPTED for e in entries)
    if interrupt is None or finished:  # an interrupted run that answered nothing writes nothing
        with held():  # the outputs are written whole: a signal now waits, and is dropped
            try:
                if writer.error is not None:
                    raise writer.error
                if args.output_file is not None:
                    write_predictions(args.output_file, entries, args.input_file)
                elif args.input_file is not None:  # no file named: predictions on stdout
                    sys.stdout.buffer.write(json_bytes(predictions(entries, args.input_file)))
                    sys.stdout.flush()
            except OSError as e:
                return _fail(f"cannot write the outputs: {_os_reason(e)}", EXIT_INTERNAL)
    reply.end()
    if interrupt is not None:
        wrote = f"; wrote {args.output_file}" if finished and args.output_file else ""
        print(
            f"edge-infer: interrupted; {finished} of {len(entries)} requests had finished{wrote}",
            file=sys.stderr,
        )
        return exit_status(interrupt)
    _report(args, entries, reply.printed, audio_only=not pipeline.text_terminals())
    if args.dump_profile:
        from edgeomni.runtime.footprint import footprint

        profile = {**pipeline.profile.as_dict(), "memory": footprint(pipeline.engine_dir)}
        cache = pipeline.context_cache
        profile["context_cache"] = cache.as_dict() if cache is not None else None
        print(json.dumps(profile, indent=2), file=sys.stderr)
    return EXIT_OK if all(e["ok"] for e in entries) else EXIT_REQUESTS_FAILED


def _record_taps(spec: Path, config: Path) -> int:
    from edgeomni.runtime.taps import RecordError, record

    try:
        record(spec, config)
    except (RecordError, OSError, ValueError, KeyError) as e:
        return _fail(f"--record-taps: {e}", EXIT_BAD_CONFIG)
    return EXIT_OK


def _read_requests(path: Path) -> int:
    """A request file read by the reader --input-file uses, for edge-build --calibration (the
    builder sits below the runtime, so it asks this command): {"requests": [{"texts": each
    message's text, "given": the keys the request sets, its file's top level's too}]}."""
    from edgeomni.runtime.requests import BadRequest, load_request_file

    try:
        entries, _ = load_request_file(path)
    except ValueError as e:
        return _fail(str(e), EXIT_BAD_CONFIG)
    except OSError as e:
        return _fail(_os_reason(e), EXIT_BAD_CONFIG)
    bad = next((e for e in entries if isinstance(e, BadRequest)), None)
    if bad is not None:
        return _fail(f"{path}: request {bad.index}: {bad.error}", EXIT_BAD_CONFIG)
    out = []
    for request in entries:
        texts = []
        for msg in request.messages:
            content = msg["content"]
            parts = [content] if isinstance(content, str) else [
                p["text"] for p in content if p["type"] == "text"]  # fmt: skip
            texts += parts
        out.append({"texts": texts, "given": sorted(request.given)})
    print(json.dumps({"requests": out}))
    return EXIT_OK


def _validate(config: Path) -> int:
    """The graph and what opening each stage reads, without loading an engine."""
    from edgeomni.graph_schema import GraphError
    from edgeomni.runtime.pipeline import Pipeline, StageError

    try:
        pipeline = Pipeline(config)
        pipeline.check()
    except GraphError as e:
        return _fail(f"invalid graph: {e}", EXIT_BAD_CONFIG)
    except StageError as e:
        return _fail(f"invalid engine dir: {e}", EXIT_BAD_CONFIG)
    except OSError as e:
        return _fail(f"--config: {_os_reason(e)}", EXIT_BAD_CONFIG)
    graph = pipeline.graph
    print(f"{config}: valid ({len(graph.stages)} stages, terminals {', '.join(graph.terminals)})")
    return EXIT_OK


# the families' request controls whose value is a file the run reads
# the flags that name a media file, and its kind
MEDIA_FLAGS = {"--audio": "audio", "--image": "image", "--video": "video",
               **{k.flag: k.path for k in FAMILY_KEYS.values() if k.path and k.flag}}  # fmt: skip
# the families' request controls that a stage which does not speak reads
SILENT_KEYS = tuple(key for key, k in FAMILY_KEYS.items() if not k.speaks)
# --voice and the flags the families declare for their request controls (runtime/family.py),
# each setting the request key of its name (a request file's default)
SPEECH_FLAGS = (("--voice", "voice"),
                *((k.flag, key) for key, k in FAMILY_KEYS.items() if k.flag))  # fmt: skip
# flags whose value is text (a path's is checked as a file instead)
TEXT_FLAGS = ("--prompt", "--voice", "--sampling",
              *(k.flag for key, k in FAMILY_KEYS.items()
                if k.flag and k.flag_type is str and not k.path))  # fmt: skip


def usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags and the media files they name (before any other file is
    read), or None."""
    if args.prompt is None and args.input_file is None:
        return "give --prompt TEXT or --input-file FILE (or --validate-config)"
    for flag in TEXT_FLAGS:
        problem = _not_utf8(flag, getattr(args, flag[2:].replace("-", "_")))
        if problem:
            return problem
    from edgeomni.runtime.engine import threads_error

    problem = (threads_error(args.threads)
               or threads_error(args.vocoder_threads, "--vocoder-threads")
               or cache_mb_error(args.context_cache_mb))  # fmt: skip
    if problem:
        return problem
    for flag, value, least in (("--batch-size", args.batch_size, 1),
                               ("--max-generate-length", args.max_generate_length, 1),
                               ("--stage-patience", args.stage_patience, 0)):  # fmt: skip
        if value is not None and value < least:
            return f"{flag} must be at least {least}, got {value}"
    if not 1 <= args.max_image_pixels <= PIL_PIXEL_LIMIT:
        return f"--max-image-pixels must be in 1..{PIL_PIXEL_LIMIT}, got {args.max_image_pixels}"
    if (args.audio or args.image or args.video) and args.prompt is None:
        return "--audio, --image and --video go with --prompt (put media in the request file)"
    if args.out_audio is not None and args.prompt is None:
        return "--out-audio goes with --prompt (use --output-audio-dir for a file)"
    if args.output_audio_dir is not None and args.input_file is None:
        return "--output-audio-dir goes with --input-file"
    speaks = args.out_audio is not None or args.output_audio_dir is not None
    for flag, key in SPEECH_FLAGS:
        if getattr(args, key) is not None and not speaks and key not in SILENT_KEYS:
            out = "--out-audio" if args.input_file is None else "--output-audio-dir"
            return f"{flag} is for the speech of {out}; without {out} nothing speaks"
    media = [("--audio", a) for a in args.audio] + [("--image", i) for i in args.image]
    media += [("--video", v) for v in args.video]
    media += [(flag, getattr(args, key)) for flag, key in SPEECH_FLAGS
              if key in PATH_KEYS and getattr(args, key) is not None]  # fmt: skip
    for flag, path in media:
        problem = _readable_file(Path(path)) or media_problem(
            MEDIA_FLAGS[flag], path, args.max_image_pixels
        )
        if problem:
            return f"{flag} {path}: {problem}"
    return None


def _not_utf8(flag: str, value: str | None) -> str | None:
    """A flag's text that is not UTF-8: Python hands undecodable bytes of the command line on
    as lone surrogates (U+DC80..U+DCFF for the bytes 0x80..0xFF), which no tokenizer takes."""
    if value is None:
        return None
    for i, ch in enumerate(value):
        if "\udc80" <= ch <= "\udcff":
            return f"{flag} is not UTF-8 text (the byte 0x{ord(ch) - 0xDC00:02x} at character {i})"
        if "\ud800" <= ch <= "\udfff":
            return f"{flag} is not valid Unicode text (a lone surrogate at character {i})"
    return None


def _readable_file(path: Path) -> str | None:
    """Why a media file given as a flag cannot be opened, or None (then ``media_problem``
    reads it)."""
    try:
        with path.open("rb"):
            pass
    except IsADirectoryError:
        return "is a directory, not a file"
    except OSError as e:
        return e.strerror or str(e)
    return None


def _prompt_body(args: argparse.Namespace) -> dict[str, Any]:
    """--prompt and its flags as a one-request request file."""
    media = [{"type": "audio", "audio": str(a)} for a in args.audio]
    media += [{"type": "image", "image": str(i)} for i in args.image]
    media += [{"type": "video", "video": str(v)} for v in args.video]
    content = [*media, {"type": "text", "text": args.prompt}] if media else args.prompt
    request = {"messages": [{"role": "user", "content": content}]}
    return {**flag_defaults(args), "requests": [request]}


def flag_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that set a request file's top-level keys: a file's own top level and each
    request's keys override them, as they do --sampling's."""
    body: dict[str, Any] = {}
    if args.no_chat_template:
        body["apply_chat_template"] = False
    if args.max_generate_length is not None:
        body["max_generate_length"] = args.max_generate_length
    for _, key in SPEECH_FLAGS:
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    return body


def _os_reason(e: OSError) -> str:
    """An OSError as one line: the path and the reason, without the errno."""
    where = f"{e.filename}: " if e.filename else ""
    return f"{where}{e.strerror or e}"


def _warn_inert(
    args: argparse.Namespace, requests: Sequence[Any], pipeline: Any, *, speaks: bool
) -> None:
    """One warning line for each reason keys and flags set change nothing in this run (none
    when no stage ran: there is nothing to tell them apart by)."""
    from edgeomni.runtime.requests import BadRequest, inert_keys

    reads = pipeline.reads()
    if not reads:
        return
    given = {k for r in requests if not isinstance(r, BadRequest) for k in r.given}
    text_model = bool(pipeline.text_terminals())
    inert = inert_keys(given, reads=reads, text_model=text_model, speaks=speaks)
    if not speaks:
        flags = (("--whole-utterance", args.whole_utterance),
                 ("--code2wav-streaming", args.code2wav_streaming is not None),
                 ("--stage-streaming", args.stage_streaming),
                 ("--vocoder-threads", args.vocoder_threads is not None))  # fmt: skip
        inert.update({flag: "this run does not speak" for flag, on in flags if on})
    if "context_cache_key" in given and pipeline.context_cache is None:
        inert["context_cache_key"] = "the context cache is off (--context-cache-mb)"
    if args.stage_patience is not None and args.batching == "cohort":
        inert["--stage-patience"] = "cohorts run each stage in turn (it is for --batching inflight)"
    if args.no_cuda_graphs and "cuda" not in pipeline.devices():
        inert["--no-cuda-graphs"] = "no engine of this run is on a GPU"
    widest = pipeline.widest(args.batch_size) if args.batch_size else None
    if widest is not None and widest < args.batch_size:
        print(f"edge-infer: warning: --batch-size {args.batch_size} is above this build's: each "
              f"stage runs at most {widest} requests at once", file=sys.stderr)  # fmt: skip
    by_why: dict[str, list[str]] = {}
    for key, why in inert.items():
        by_why.setdefault(why, []).append(key)
    for why, keys in by_why.items():
        verb = "changes" if len(keys) == 1 else "change"
        print(f"edge-infer: warning: {', '.join(keys)} {verb} nothing here: {why}",
              file=sys.stderr)  # fmt: skip


class _Reply:
    """--prompt: the reply's text on stdout as it is generated (the text terminal's deltas)."""

    def __init__(self, enabled: bool, text_ports: Sequence[str]) -> None:
        self.enabled = enabled
        self.stages = {port.split(":")[0] for port in text_ports}
        self.printed = False

    def show(self, event: Any) -> None:
        from edgeomni.runtime.events import TextDelta

        if self.enabled and isinstance(event, TextDelta) and event.stage in self.stages:
            sys.stdout.write(event.text)
            sys.stdout.flush()
            self.printed = True

    def end(self) -> None:
        """End the streamed line (once the run is over)."""
        if self.printed:
            sys.stdout.write("\n")
            sys.stdout.flush()


def _report(
    args: argparse.Namespace,
    entries: Sequence[dict[str, Any]],
    streamed: bool,
    *,
    audio_only: bool = False,
) -> None:
    """--prompt: the reply on stdout unless it was streamed there or the graph only speaks (or
    why it failed), and on stderr the audio file it wrote, whatever the family; a request
    file: a summary."""
    if args.prompt is not None:
        entry = entries[0]
        if not entry["ok"]:
            print(f"edge-infer: request failed: {entry['error']}", file=sys.stderr)
            return
        if not (audio_only or streamed):
            print(entry.get("output_text", ""))
        if "audio_file" in entry:
            seconds = entry.get("audio_duration_ms", 0) / 1e3
            print(f"edge-infer: wrote {args.out_audio} ({seconds:.2f} s of audio)", file=sys.stderr)
        return
    bad = [e for e in entries if not e["ok"]]
    print(
        f"edge-infer: {len(entries) - len(bad)} of {len(entries)} requests succeeded"
        + (f"; wrote {args.output_file}" if args.output_file else ""),
        file=sys.stderr,
    )
    for e in bad:
        print(f"  request {e['request_idx']}: {e['error']}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
