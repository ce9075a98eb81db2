"""edge-serve's socket and signals around uvicorn.

The address is bound before anything heavy runs (engines, warm-up), so a port in use or a host
that is not this machine's is one line and exit 2 at once; the socket listens only once
uvicorn serves. uvicorn's own handling of SIGINT and SIGTERM is replaced: the first stops
taking connections and lets the requests in flight finish (a drain); a second, while
draining, cuts them (the scheduler drops them at its next turn, the connections close) and
the process exits at once with the shell's status for that signal.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import signal
import socket
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

STOP = (signal.SIGINT, signal.SIGTERM)


class AddressError(Exception):
    """``--host`` / ``--port`` name an address this process cannot listen on."""


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (not yet listening), or an AddressError saying
    why not: a host name that does not resolve, an address that is not this machine's, a port
    in use or a privileged one."""
    where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:  # UnicodeError: a name IDNA refuses
        reason = e.strerror if isinstance(e, socket.gaierror) else str(e)
        raise AddressError(f"--host {host!r}: not an address or a known host name "
                           f"({reason})") from None  # fmt: skip
    last: OSError | None = None
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            return sock
        except OSError as e:
            sock.close()
            last = e
    assert last is not None  # getaddrinfo gives at least one address or raises
    if last.errno == errno.EADDRINUSE:
        raise AddressError(f"{where}: the port is in use (another server listens on it; pick "
                           f"another --port)")  # fmt: skip
    if last.errno == errno.EADDRNOTAVAIL:
        raise AddressError(f"--host {host}: not an address of this machine ({last.strerror})")
    if last.errno == errno.EACCES:
        raise AddressError(f"{where}: permission denied (ports below 1024 need privileges)")
    raise AddressError(f"cannot listen on {where}: {last.strerror or last}")


class Web(uvicorn.Server):
    """uvicorn's server over edge-serve's ``server``, with a drain on the first SIGINT /
    SIGTERM and a cut on a second. ``signals``: those that came, in order; ``draining``: the
    requests in the server at the first; ``cut``: those the second cut (None: none came), and
    ``cut_by`` that signal."""

    def __init__(self, config: uvicorn.Config, server: Any) -> None:
        super().__init__(config)
        self.edge = server
        self.signals: list[int] = []
        self.draining = 0
        self.cut: int | None = None
        self.cut_by = 0

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Nothing: edge-serve's ``_serve`` sets ``handle_exit`` on both signals around the whole
        run, before uvicorn starts and past its cleanup (uvicorn's own capture would put its
        handlers in and raise the signals again on the way out)."""
        yield

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signals.append(sig)
        if not self.should_exit:
            self.draining = self.edge.in_flight
        elif self.cut is None:  # a second signal, while draining
            self.cut, self.cut_by = self.edge.cancel_all(), sig
            # the connections are dropped, not finished: uvicorn would log each as an error
            for name in ("uvicorn.error", "uvicorn.access"):
                logging.getLogger(name).disabled = True
            self.force_exit = True
        self.should_exit = True
