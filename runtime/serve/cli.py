"""edge-serve: the graph of an engine dir behind OpenAI's chat-completions API, in one process
(or, ``--ray``, its stage groups as Ray Serve deployments behind this process).

    edge-serve --config ENG [--host 127.0.0.1] [--port 8000] [--batch-size N] [--max-queue 64]
        [--api-key KEY] [--max-tokens 256] [--max-audio-seconds 60] [--max-image-pixels N]
        [--ray [--ray-address ADDR] [--placement FILE] [--ray-cpus N] [--ray-start-timeout S]]

Needs the ``serve`` extra (Starlette and uvicorn): pip install 'edgeomni[serve]'; ``--ray``
also the ``ray`` extra (the stages as Ray Serve deployments: serve/ray_app.py).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from edgeomni.runtime.context_cache import CONTEXT_CACHE_HELP, cache_mb_error
from edgeomni.runtime.engine import VOCODER_THREADS_HELP
from edgeomni.runtime.media.image import MAX_IMAGE_PIXELS, PIL_PIXEL_LIMIT
from edgeomni.runtime.requests import DEFAULT_MAX_GENERATE_LENGTH
from edgeomni.runtime.scheduler import PATIENCE

log = logging.getLogger("edge-serve")
BATCH_SIZE = 8  # --batch-size where the build names no max batch
RAY_START_TIMEOUT = 600.0  # seconds --ray waits for its deployments by default


EPILOG = """\
exit status:
  0    stopped by SIGTERM or Ctrl-C once the requests in flight had finished
  2    a bad flag, an engine dir it cannot serve (or --batch-size above its build), a
       --placement file it cannot use (its JSON path named; with --ray, also a group the
       cluster's resources cannot hold), or an address it cannot listen on (a port in use, a
       host that is not this machine's or does not resolve): one line, before any port opens
  1    the warm-up failed, the scheduler loop stopped on an error, deploying on Ray Serve
       failed or its groups were not running within --ray-start-timeout (--ray; the line
       names them), or an internal error
  130  Ctrl-C again while draining (the requests in flight are cut, the line says how many),
       or Ctrl-C before the port opened (loading, deploying, warming up); 143 the same for SIGTERM
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (no usage block), as every other error here."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``low..high``, so a value out of range is argparse's
    one-line error (exit 2), not a traceback later."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            span = f"{low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {span}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    """An argparse type: a finite duration above zero (``nan`` and ``inf`` parse as floats)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="edge-serve",
        description="Serve an engine dir's graph over OpenAI's API (GET /health, GET "
        "/v1/models, POST /v1/chat/completions, streamed or not; POST /v1/audio/speech on a "
        "speech graph, POST /v1/audio/transcriptions on an ASR graph). Every request "
        "joins one in-flight scheduler loop (with --ray, the loop of each group of stages, a "
        "Ray Serve deployment); a client that disconnects frees its slot.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, type=Path,
                   help="engine dir (or its multistage_config.json)")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only)")  # fmt: skip
    p.add_argument("--port", type=_int_at_least(0, 65535), default=8000,
                   help="TCP port, 0..65535 (default 8000; 0: any free one)")  # fmt: skip
    p.add_argument("--batch-size", type=_int_at_least(1),
                   help="requests each stage runs at once (default: the build's max batch, "
                   f"else {BATCH_SIZE}; more than the build's is refused)")  # fmt: skip
    p.add_argument("--max-queue", type=_int_at_least(0), default=64,
                   help="requests that may wait beyond those running; more get 429")  # fmt: skip
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (default: the "
                   "EDGE_SERVE_API_KEY environment variable, else none)")  # fmt: skip
    p.add_argument("--max-tokens", type=_int_at_least(1),
                   help="a request's default and largest max_tokens (default: "
                   f"{DEFAULT_MAX_GENERATE_LENGTH}, or less where the build's KV cache "
                   "capacity is smaller; more than that capacity is refused)")  # fmt: skip
    p.add_argument("--max-audio-seconds", type=_seconds, default=60.0,
                   help="the longest inline audio a request may bring")  # fmt: skip
    p.add_argument("--max-image-pixels", type=_int_at_least(1, PIL_PIXEL_LIMIT),
                   default=MAX_IMAGE_PIXELS, metavar="N",
                   help=f"the most pixels an inline image may have, checked from its header "
                   f"before it is decoded (default {MAX_IMAGE_PIXELS}, 4096x4096; at most "
                   f"{PIL_PIXEL_LIMIT}, Pillow's limit)")  # fmt: skip
    p.add_argument("--stage-patience", type=_int_at_least(0), default=PATIENCE, metavar="TURNS",
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
    p.add_argument("--threads", type=_int_at_least(1),
                   help="CPU threads per engine, at most the usable cores (default: "
                   "onnxruntime's)")  # fmt: skip
    p.add_argument("--context-cache-mb", type=float, metavar="MB",
                   help=CONTEXT_CACHE_HELP + " (with --ray, each group of stages holds its own)")
    p.add_argument("--vocoder-threads", type=_int_at_least(1), metavar="N",
                   help=VOCODER_THREADS_HELP + " (not with --ray: there a group of stages is a "
                   "process of its own)")  # fmt: skip
    ray = p.add_argument_group(
        "Ray Serve", "the graph's stages as Ray Serve deployments, this process the front (needs "
        "the ray extra: pip install 'edgeomni[ray]')")  # fmt: skip
    ray.add_argument("--ray", action="store_true",
                     help="serve through Ray Serve: each group of stages a deployment (default: "
                     "every stage in one group)")  # fmt: skip
    ray.add_argument("--ray-address", metavar="ADDR",
                     help="the Ray cluster to join (ray.init's address, e.g. auto or "
                     "ray://HEAD:10001; default: start a local one)")  # fmt: skip
    ray.add_argument("--placement", type=Path, metavar="FILE",
                     help="which stages go together, their replicas and resources (JSON, see "
                     "docs/ray.md)")  # fmt: skip
    ray.add_argument("--ray-cpus", type=_int_at_least(1), metavar="N",
                     help="CPUs of the local cluster --ray starts (default: all)")  # fmt: skip
    ray.add_argument("--ray-start-timeout", type=_seconds,
                     metavar="S", help="how long to wait for every group's replicas to load "
                     f"their engines before giving up (exit 1; default {RAY_START_TIMEOUT:g})")  # fmt: skip
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


def _fail(message: str, code: int = 2) -> int:
    print(f"edge-serve: error: {message}", file=sys.stderr)
    return code


def build_batch(pipe: Any) -> int | None:
    """The largest batch every stage of the build takes (each stage's ``max_batch``, which
    edge-build stamps from its engine's build), or None where no stage says."""
    return min((s.max_batch for s in pipe.graph.stages if s.max_batch), default=None)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # a bad flag (one line, 2) or --help (0)
        return e.code if isinstance(e.code, int) else 2
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(name)s: %(message)s")  # fmt: skip
    try:
        import uvicorn  # noqa: F401

        from edgeomni.runtime.serve.app import make_app  # noqa: F401
    except ImportError as e:
        return _fail(f"{e.name} is missing: pip install 'edgeomni[serve]'")
    from edgeomni.builder import interrupts

    with contextlib.ExitStack() as opened:  # the socket and the server, if it ends before serving
        try:
            with interrupts.raised():
                ready = _prepare(args, opened)
                if isinstance(ready, int):
                    return ready
                opened.pop_all()  # _serve closes them
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM before the port opened
            print("edge-serve: interrupted", file=sys.stderr)
            return interrupts.exit_status(e)
        except Exception as e:  # a bug: one line; --verbose shows where
            if args.verbose:
                traceback.print_exc()
            return _fail(f"internal error: {type(e).__name__}: {e}", 1)
    return _serve(*ready)


def _prepare(args: argparse.Namespace, opened: contextlib.ExitStack) -> int | tuple[Any, Any, Any]:
    """Everything before the port opens, cheapest first: the graph and the flags against its
    build, the address, the engines, the warm-up. An exit status, or (socket, server, app);
    what it opened is closed by ``opened`` unless it is served."""
    from edgeomni.graph_schema import GraphError
    from edgeomni.runtime.engine import Engines, threads_error
    from edgeomni.runtime.pipeline import Pipeline, resolve_config
    from edgeomni.runtime.serve import warmup
    from edgeomni.runtime.serve.app import make_app
    from edgeomni.runtime.serve.listen import AddressError, bind
    from edgeomni.runtime.serve.server import Server

    problem = (threads_error(args.threads)
               or threads_error(args.vocoder_threads, "--vocoder-threads")
               or cache_mb_error(args.context_cache_mb))  # fmt: skip
    if problem:
        return _fail(problem)
    if args.ray and args.vocoder_threads is not None:
        return _fail("--vocoder-threads is for edge-serve without --ray (with --ray, place the "
                     "vocoder's stage in a group of its own: its own process)")
    if not args.ray and (args.placement or args.ray_address or args.ray_cpus
                         or args.ray_start_timeout):  # fmt: skip
        return _fail("--placement, --ray-address, --ray-cpus and --ray-start-timeout go with "
                     "--ray")
    if args.ray and args.ray_address and args.ray_cpus:
        return _fail("--ray-cpus sizes a local cluster; --ray-address joins one (give one)")
    if args.ray:
        try:
            import ray  # noqa: F401
            from ray import serve  # noqa: F401
        except ImportError as e:
            return _fail(f"{e.name} is missing: pip install 'edgeomni[ray]'")
    try:
        config = resolve_config(args.config)
        engines = Engines(threads=args.threads, cuda_graphs=not args.no_cuda_graphs,
                          max_image_pixels=args.max_image_pixels)  # fmt: skip
        pipe = Pipeline(config, engines=engines, patience=args.stage_patience,
                        vocoder_threads=args.vocoder_threads,
                        context_cache_mb=args.context_cache_mb)
    except GraphError as e:
        return _fail(f"invalid graph: {e}")
    except (OSError, RuntimeError, ValueError) as e:
        return _fail(str(e))
    most = build_batch(pipe)
    batch_size = args.batch_size or most or BATCH_SIZE
    if most is not None and batch_size > most:  # the 429 limit is computed from it
        return _fail(f"--batch-size {batch_size} is over the build's max batch, {most} "
                     f"(edge-build --max-batch-size); give at most {most}")  # fmt: skip
    if args.ray:
        from edgeomni.runtime.serve import placement
        from edgeomni.runtime.serve.ray_app import RayServer

        placement_name = args.placement or "the default placement (every stage in group all)"
        try:
            where = (placement.load(args.placement, pipe.graph) if args.placement
                     else placement.single(pipe.graph))  # fmt: skip
            if args.ray_cpus:  # a local cluster of that size: refused before it starts
                placement.check_fits(where, [{"CPU": float(args.ray_cpus)}], unknown={"GPU"},
                                     cluster=f"the local cluster (--ray-cpus {args.ray_cpus})")
        except placement.PlacementError as e:
            return _fail(f"{placement_name}: {e}")
        server: Server = RayServer(
            pipe, where, batch_size=batch_size, max_queue=args.max_queue,
            address=args.ray_address, num_cpus=args.ray_cpus,
            engines={"threads": args.threads, "cuda_graphs": not args.no_cuda_graphs,
                     "max_image_pixels": args.max_image_pixels,
                     "context_cache_mb": args.context_cache_mb},  # fmt: skip
        )  # fmt: skip
    else:
        server = Server(pipe, batch_size=batch_size, max_queue=args.max_queue)
    try:
        max_tokens = token_limit(server, args.max_tokens)
    except ValueError as e:
        return _fail(str(e))
    try:
        sock = opened.enter_context(bind(args.host, args.port))
    except AddressError as e:
        return _fail(str(e))
    if args.ray:  # the replicas load the engines; the port opens once they all have
        from edgeomni.runtime.serve.ray_app import StartError

        try:
            server.start(timeout=args.ray_start_timeout or RAY_START_TIMEOUT)
        except placement.PlacementError as e:  # what the cluster it joined has
            return _fail(f"{placement_name}: {e}")
        except StartError as e:
            return _fail(f"deploying on Ray Serve failed: {e}", 1)
        except Exception as e:  # noqa: BLE001 (Ray's own errors: a cluster it cannot join)
            return _fail(f"deploying on Ray Serve failed: {type(e).__name__}: {e}", 1)
    else:
        try:
            pipe.open(set(pipe.graph.stage_ids))  # every engine loads before the port opens
        except GraphError as e:
            return _fail(f"invalid graph: {e}")
        except (OSError, RuntimeError, ValueError) as e:
            return _fail(str(e))
        server.start()
    opened.callback(server.stop, timeout=10)
    opened.callback(server.cancel_all)  # first: the warm-up's requests are cut
    if args.warmup == "on" or (args.warmup == "auto" and warmup.needed(server)):
        try:
            warmup.warm_up(server, batch_size=min(batch_size, server.capacity))
        except RuntimeError as e:  # the graph fails a plain request
            return _fail(f"the warm-up failed: {e}", 1)
    api_key = args.api_key or os.environ.get("EDGE_SERVE_API_KEY") or None
    app = make_app(
        server,
        model=config.parent.name,
        api_key=api_key,
        max_tokens=max_tokens,
        max_audio_s=args.max_audio_seconds,
        max_pixels=args.max_image_pixels,
    )
    return sock, server, app


def _serve(sock: socket.socket, server: Any, app: Any) -> int:
    """Serve until SIGINT or SIGTERM: the first drains (exit 0 once the requests in flight
    have finished), a second cuts them (exit 130 or 143 at once); the media folder goes
    either way."""
    import uvicorn

    from edgeomni.runtime.serve.listen import STOP, Web

    web = Web(uvicorn.Config(app, log_level="info"), server)
    host, port = sock.getsockname()[:2]
    log.info("listening on http://%s:%d (Ctrl-C: finish the requests in flight and stop; "
             "twice: cut them)", f"[{host}]" if ":" in host else host, port)  # fmt: skip
    before = {sig: signal.signal(sig, web.handle_exit) for sig in STOP}  # none lost till it runs
    try:
        web.run(sockets=[sock])
    finally:
        for sig in STOP:  # the exit is under way: nothing stops the cleanup
            signal.signal(sig, signal.SIG_IGN)
        server.stop(timeout=30 if web.cut is None else 5)  # cut: dropped at the loop's next turn
        sock.close()
        if app.state.media_root is not None:
            shutil.rmtree(app.state.media_root, ignore_errors=True)
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if web.cut is not None:
        how = "Ctrl-C" if web.cut_by == signal.SIGINT else "SIGTERM"
        what = f"cut the {_requests(web.cut)} in flight" if web.cut else "no request was in flight"
        print(f"edge-serve: {how} again while draining: {what}", file=sys.stderr)
        return 128 + web.cut_by
    if web.signals:
        name = signal.Signals(web.signals[0]).name
        if web.draining:
            log.info("stopped by %s once the %s in flight had finished", name,
                     _requests(web.draining))  # fmt: skip
        else:
            log.info("stopped by %s (no request was in flight)", name)
    return 1 if server.error is not None else 0


def _requests(n: int) -> str:
    return "1 request" if n == 1 else f"{n} requests"


if __name__ == "__main__":
    sys.exit(main())
