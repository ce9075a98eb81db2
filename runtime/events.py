"""What stages report about each request while they run, in order: the CLI prints and writes
from these, the server will stream them and benchmarks time them, so none of them reach into
a stage's internals.

Plain frozen dataclasses; ``index`` is the request's position in the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Event", "Failed", "Finished", "Listener", "TextDelta"]


@dataclass(frozen=True)
class TextDelta:
    """New text of a request's reply: ``text`` continues what earlier deltas gave (the deltas
    of a request concatenate to its ``output_text``), ``token_ids`` the tokens generated since
    the last delta (held-back text, such as half a character or what may become a stop string,
    comes in a later delta)."""

    index: int
    stage: str
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Finished:
    """The stage is done with the request: ``reason`` is eos, stop or length."""

    index: int
    stage: str
    reason: str


@dataclass(frozen=True)
class Failed:
    """The request failed in this stage; it leaves the run, the others go on."""

    index: int
    stage: str
    error: str


Event = TextDelta | Finished | Failed
Listener = Callable[[Event], None]
