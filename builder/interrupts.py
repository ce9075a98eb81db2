"""SIGINT and SIGTERM for edge-build and edge-infer: one line and the shell's exit status, a
clean stop, and nothing split that must not be split.

``raised()`` turns SIGTERM into an exception as Ctrl-C is (``Terminated``, a KeyboardInterrupt),
so one cleanup path serves both; ``held()`` keeps both off a step that must finish whole (the
build's swap and cleanup, edge-infer writing its outputs); ``exit_status`` is what a shell
expects of a process that signal stopped (130, 143). It lives here, the lower of the two
commands' layers, and needs only the standard library, so edge-infer uses it too.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STOP = (signal.SIGINT, signal.SIGTERM)
_taken: list[int] = []  # the stop signals the handler took, within raised()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so the same cleanup runs for it."""


def _exception(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _raise(signum: int, frame: Any) -> None:
    """The first stop signal raises; later ones are ignored, so the cleanup it starts finishes.
    (Ignored by a Python handler: with SIG_IGN, one that came just before would be reported as
    "ignored due to race condition".)"""
    _taken.append(signum)
    for sig in STOP:
        signal.signal(sig, _ignore)
    raise _exception(signum)


def _ignore(signum: int, frame: Any) -> None:
    pass


def taken() -> int | None:
    """The stop signal the handler took, if any: torch's exporter may catch the exception it
    raised, or wrap it in its own error, so a command asks this too."""
    return _taken[0] if _taken else None


def check() -> None:
    """Raise again for a stop signal taken earlier whose exception some library swallowed, so an
    interrupted build never goes on to replace the engine dir."""
    if _taken:
        raise _exception(_taken[0])


@contextmanager
def raised() -> Iterator[None]:
    """For a command's main: SIGINT and SIGTERM raise (once). The old handlers come back after,
    unless a signal stopped the run: then both stay ignored while the process exits, so a second
    Ctrl-C cannot kill it with another status than the first signal's."""
    _taken.clear()
    old = {sig: signal.getsignal(sig) for sig in STOP}
    try:
        for sig in STOP:
            signal.signal(sig, _raise)
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, signal.SIG_IGN if _taken else handler)
        if _taken:
            _forget_unhandled_interrupt()
        _taken.clear()


def _forget_unhandled_interrupt() -> None:
    """CPython marks a KeyboardInterrupt that escaped a C-level eval (``PyRun_String``, which
    pybind11's ``py::exec`` inside torch uses) as unhandled, even when Python code caught it
    later; under ``python -m`` the interpreter then kills itself with SIGINT at exit, whatever
    status the command returned (CI, 2026-12-05: an interrupted build exited -2, not 130). Each
    such eval clears the mark first, so one that succeeds forgets it."""
    if sys.implementation.name != "cpython":
        return
    import ctypes

    run = ctypes.pythonapi.PyRun_String
    run.restype = ctypes.py_object
    run.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]
    scope: dict[str, object] = {}
    run(b"None", 258, scope, scope)  # 258: Py_eval_input


@contextmanager
def held() -> Iterator[list[int]]:
    """SIGINT and SIGTERM wait until the block is done and are then dropped (the list says which
    came). The mask keeps them from this thread; the handlers are swapped too, because threads
    that torch started before the mask still take signals and wake the handler here."""
    arrived: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield arrived  # signal handlers run only in the main thread
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    old: dict[int, Any] = {}
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP)
        for sig in STOP:
            old[sig] = signal.signal(sig, lambda signum, frame: arrived.append(signum))
        yield arrived
    finally:
        _drain(arrived)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextmanager
def deferred() -> Iterator[None]:
    """Like ``held()``, for a step inside a run that must finish whole (a file written while
    requests still run): a stop signal that came during it is raised once it is done, as the
    handler would have raised it, instead of being dropped."""
    with held() as arrived:
        yield
    if arrived:
        _raise(arrived[0], None)


def _drain(arrived: list[int]) -> None:
    """Take the held signals that are pending, so unblocking does not deliver them."""
    # macOS has no sigtimedwait: there unblocking delivers them, to the recorder still in place
    wait = getattr(signal, "sigtimedwait", None)
    while wait is not None and (info := wait(STOP, 0)) is not None:
        arrived.append(info.si_signo)


def exit_status(e: BaseException, signum: int | None = None) -> int:
    """128 + the number of the signal that stopped the run: ``signum`` when the handler took
    one, else the one ``e`` stands for (SIGTERM for Terminated, SIGINT for KeyboardInterrupt)."""
    if signum is None:
        signum = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
    return 128 + int(signum)
