"""What stages report about each request while they run, in order: the CLI prints and writes
from these, the server will stream them and benchmarks time them, so none of them reach into
a stage's internals.

Plain frozen dataclasses; ``index`` is the request's position in the run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from edgeomni.runtime.prompt import PromptRows

__all__ = ["AudioChunk", "CodecFrames", "Event", "Failed", "Finished", "HiddenRows", "Listener",
           "TextDelta"]  # fmt: skip


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
class CodecFrames:
    """New codec frames of a request's speech, int64 [frames, groups]: a request's frames
    concatenate to its codes (the codec port, ``rvq_codes``; an utterance of no frames gives
    one empty event)."""

    index: int
    stage: str
    codes: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class AudioChunk:
    """New audio of a request: float32 samples starting at sample ``offset`` of its utterance
    (a request's chunks concatenate to its audio; an utterance of no audio gives one empty
    chunk, so its sample rate is known)."""

    index: int
    stage: str
    samples: np.ndarray = field(repr=False)
    offset: int
    sample_rate: int


@dataclass(frozen=True)
class HiddenRows:
    """Rows a stage hands the next one (a thinker's ``accept_hidden`` port, which its talker
    reads): the input embeddings of the tokens it fed, float32 [k, H], in order (the prompt's,
    then one per decode step; the last token drawn is never fed). The first event of a request
    has ``prompt``: what the talker's prefill reads besides (runtime.prompt.PromptRows). An
    edge's event: the scheduler hands it to the next stage, not to listeners. In one process
    ``rows`` is the producer's buffer (a view, never written again), not a copy."""

    index: int
    stage: str
    rows: np.ndarray = field(repr=False)
    prompt: PromptRows | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Finished:
    """The stage is done with the request: ``reason`` is eos, stop or length for a decoder,
    ``complete`` for a stage that converts what it was given (the vocoder)."""

    index: int
    stage: str
    reason: str


@dataclass(frozen=True)
class Failed:
    """The request failed in this stage; it leaves the run, the others go on."""

    index: int
    stage: str
    error: str


Event = TextDelta | CodecFrames | AudioChunk | HiddenRows | Finished | Failed
Listener = Callable[[Event], None]
