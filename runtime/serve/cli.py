"""edge-serve: the graph of an engine dir behind OpenAI's chat-completions API, in one process.

    edge-serve --config ENG [--host 127.0.0.1] [--port 8000] [--batch-size 8] [--max-queue 64]
        [--api-key KEY] [--max-tokens 256] [--max-audio-seconds 60] [--max-image-pixels N]

Needs the ``serve`` extra (Starlette and uvicorn): pip install 'edgeomni[serve]'.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from edgeomni.runtime.requests import DEFAULT_MAX_GENERATE_LENGTH
from edgeomni.runtime.scheduler import PATIENCE

log = logging.getLogger("edge-serve")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="edge-serve",
        description="Serve an engine dir's graph over OpenAI's API (GET /health, GET "
        "/v1/models, POST /v1/chat/completions with text, streamed or not). Every request "
        "joins one in-flight scheduler loop; a client that disconnects frees its slot.",
    )
    p.add_argument("--config", required=True, type=Path,
                   help="engine dir (or its multistage_config.json)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")  # fmt: skip
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--batch-size", type=int, default=8,
                   help="requests each stage runs at once (at most the build's max batch)")  # fmt: skip
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait beyond those running; more get 429")  # fmt: skip
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (default: the "
                   "EDGE_SERVE_API_KEY environment variable, else none)")  # fmt: skip
    p.add_argument("--max-tokens", type=int,
                   help="a request's default and largest max_tokens (default: "
                   f"{DEFAULT_MAX_GENERATE_LENGTH}, or less where the build's KV cache "
                   "capacity is smaller; more than that capacity is refused)")  # fmt: skip
    p.add_argument("--max-audio-seconds", type=float, default=60.0,
                   help="the longest inline audio a request may bring")  # fmt: skip
    p.add_argument("--max-image-pixels", type=int, default=4096 * 4096,
                   help="the largest inline image a request may bring")  # fmt: skip
    p.add_argument("--stage-patience", type=int, default=PATIENCE, metavar="TURNS",
                   help="how many scheduler turns a later stage (talker, vocoder) waits for "
                   f"requests on their way before it steps a batch that is not full (default "
                   f"{PATIENCE}; 0: step every turn)")  # fmt: skip
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="GPU engines launch their kernels instead of replaying captured CUDA "
                   "graphs (slower; for debugging)")  # fmt: skip
    p.add_argument("--warmup", choices=("auto", "on", "off"), default="auto",
                   help="before the port opens, run 1, 2, .. --batch-size requests at once, so a "
                   "GPU build's CUDA graphs are captured before clients wait on them (auto, the "
                   "default: on when an engine runs on a GPU with CUDA graphs)")  # fmt: skip
    p.add_argument("--threads", type=int, help="CPU threads per engine (default: onnxruntime's)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def token_limit(server: Any, asked: int | None) -> int:
    """A request's largest max_tokens: what was asked, else the default, within the text
    stage's KV cache (a prompt takes at least one of its slots); a ValueError past it."""
    room = min((s.max_seq for s in server.pipe.graph.stages
                if s.id in server.text_stages and s.max_seq), default=None)  # fmt: skip
    most = None if room is None else room - 1
    if asked is None:
        return (
            DEFAULT_MAX_GENERATE_LENGTH if most is None else min(DEFAULT_MAX_GENERATE_LENGTH, most)
        )
    if most is not None and asked > most:
        raise ValueError(f"--max-tokens {asked} does not fit the build: its KV cache holds "
                         f"{room} tokens, the prompt's included (at most {most})")  # fmt: skip
    return asked


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(name)s: %(message)s")  # fmt: skip
    try:
        import uvicorn

        from edgeomni.runtime.serve.app import make_app
    except ImportError as e:
        print(f"edge-serve: {e.name} is missing: pip install 'edgeomni[serve]'", file=sys.stderr)
        return 2
    from edgeomni.graph_schema import GraphError
    from edgeomni.runtime.pipeline import Pipeline, resolve_config
    from edgeomni.runtime.serve import warmup
    from edgeomni.runtime.serve.server import Server

    if args.max_tokens is not None and args.max_tokens < 1:
        print("edge-serve: --max-tokens must be >= 1", file=sys.stderr)
        return 2
    if args.stage_patience < 0:
        print("edge-serve: --stage-patience must be >= 0", file=sys.stderr)
        return 2
    try:
        config = resolve_config(args.config)
        pipe = Pipeline(config, threads=args.threads, patience=args.stage_patience,
                        cuda_graphs=not args.no_cuda_graphs)  # fmt: skip
        server = Server(pipe, batch_size=args.batch_size, max_queue=args.max_queue)
        pipe.open(set(pipe.graph.stage_ids))  # every engine loads before the port opens
    except GraphError as e:
        print(f"edge-serve: invalid graph: {e}", file=sys.stderr)
        return 2
    except (OSError, RuntimeError, ValueError) as e:
        print(f"edge-serve: {e}", file=sys.stderr)
        return 2
    try:
        max_tokens = token_limit(server, args.max_tokens)
    except ValueError as e:
        print(f"edge-serve: {e}", file=sys.stderr)
        return 2
    server.start()
    if args.warmup == "on" or (args.warmup == "auto" and warmup.needed(server)):
        try:
            warmup.warm_up(server, batch_size=min(args.batch_size, server.capacity))
        except RuntimeError as e:  # the graph fails a plain request
            print(f"edge-serve: the warm-up failed: {e}", file=sys.stderr)
            server.stop(timeout=30)
            return 1
    api_key = args.api_key or os.environ.get("EDGE_SERVE_API_KEY") or None
    app = make_app(
        server,
        model=config.parent.name,
        api_key=api_key,
        max_tokens=max_tokens,
        max_audio_s=args.max_audio_seconds,
        max_pixels=args.max_image_pixels,
    )
    # uvicorn stops taking connections on SIGTERM / Ctrl-C and lets the open ones finish, then
    # raises the signal again, to whatever handler was there before it: this one takes it, so
    # the loop is stopped and the media folder removed before the process ends (a second
    # Ctrl-C while draining still quits at once: uvicorn's own handler sees it)
    caught: list[int] = []
    drain = (signal.SIGINT, signal.SIGTERM)
    before = {sig: signal.signal(sig, lambda sig, _frame: caught.append(sig)) for sig in drain}
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    finally:
        server.stop(timeout=30)
        shutil.rmtree(app.state.media_root, ignore_errors=True)
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if caught:
        log.info("stopped by %s after the requests in flight", signal.Signals(caught[0]).name)
    return 1 if server.error is not None else 0


if __name__ == "__main__":
    sys.exit(main())
