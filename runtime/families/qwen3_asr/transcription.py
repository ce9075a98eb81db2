"""Qwen3-ASR's speech-to-text form (runtime/family.py, ``transcription``): a transcription
request's messages as transformers' ``Qwen3ASRProcessor.apply_transcription_request`` builds
them, and the model's reply parsed as its ``decode(..., return_format="parsed")`` parses it.

The model answers ``language <Name><asr_text><transcript>``. A forced language is the start of
that answer, given: the assistant turn holds ``language <Name><asr_text>`` and the prompt ends
inside it (``continue_final_message``), so the model writes only the transcript. A context
prompt (hot words) is the system turn's text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The names the model was trained with in "language <Name><asr_text>", by language code
# (transformers' processing_qwen3_asr.LANGUAGE_CODE_TO_NAME, 5.24).
LANGUAGE_CODE_TO_NAME = {
    "ar": "Arabic", "yue": "Cantonese", "zh": "Chinese", "cs": "Czech", "da": "Danish",
    "nl": "Dutch", "en": "English", "fil": "Filipino", "fi": "Finnish", "fr": "French",
    "de": "German", "el": "Greek", "hi": "Hindi", "hu": "Hungarian", "id": "Indonesian",
    "it": "Italian", "ja": "Japanese", "ko": "Korean", "mk": "Macedonian", "ms": "Malay",
    "fa": "Persian", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian",
    "es": "Spanish", "sv": "Swedish", "th": "Thai", "tr": "Turkish", "vi": "Vietnamese",
}  # fmt: skip
MARKER = "<asr_text>"
HEADER = "language "  # the reply's first line, before the marker
# the parser's repetition fix: a character or a pattern of up to 20 characters repeated more
# than 20 times in a row is kept once (the reference implementation's post-processing)
REPEATS, PATTERN_CHARS = 20, 20


def language_name(value: str) -> str:
    """A language code or name (any case) as the model's name for it; a ValueError naming the
    known ones otherwise."""
    wanted = value.strip().lower()
    for code, name in LANGUAGE_CODE_TO_NAME.items():
        if wanted in (code, name.lower()):
            return name
    known = ", ".join(f"{name} ({code})" for code, name in LANGUAGE_CODE_TO_NAME.items())
    raise ValueError(f"unknown language {value!r} for Qwen3-ASR; known: {known}")


def forced_start(language: str | None) -> str:
    """The assistant turn's given start: ``language <Name><asr_text>``, or "" (detected)."""
    return f"language {language_name(language)}{MARKER}" if language else ""


class Transcription:
    """Qwen3-ASR's transcription form; stateless (its methods are static)."""

    language_name = staticmethod(language_name)  # a forced language's name, for the answer

    @staticmethod
    def messages(
        audio: str, language: str | None = None, prompt: str | None = None
    ) -> list[dict[str, Any]]:
        """The request's messages for one audio file, as the processor lays them out: the
        context ``prompt`` as a system turn (when given, even ""), the audio as the user turn,
        and the assistant turn to continue (its given start: the forced language, or ""). The
        request renders them with ``continue_final_message``. A ValueError for an unknown
        language."""
        out: list[dict[str, Any]] = []
        if prompt is not None:
            out.append({"role": "system", "content": [{"type": "text", "text": prompt}]})
        out.append({"role": "user", "content": [{"type": "audio", "audio": str(audio)}]})
        start = forced_start(language)
        out.append({"role": "assistant", "content": [{"type": "text", "text": start}]})
        return out

    @staticmethod
    def request_messages(
        messages: Sequence[Mapping[str, Any]], controls: Mapping[str, Any]
    ) -> list[Mapping[str, Any]] | None:
        """A request's messages with its ``language`` control applied: an assistant turn that
        starts with the forced language, to be continued; None when the control is not given.
        A ValueError for an unknown language, or a request that already ends with an
        assistant turn (the reply's start would be given twice)."""
        language = controls.get("language")
        if not language:
            return None
        start = forced_start(language)
        if messages and messages[-1].get("role") == "assistant":
            raise ValueError(
                "language forces the start of the reply, but the request's last message is "
                "already an assistant's"
            )
        return [*messages, {"role": "assistant", "content": start}]

    @staticmethod
    def parse(output_text: str) -> tuple[str | None, str]:
        """(language or None, transcript) of the model's decoded reply (special tokens
        skipped), as transformers' ``_parse_single_output``: text before an ``assistant\\n``
        dropped, long repetitions collapsed, the first line before ``<asr_text>`` read as
        ``language <Name>`` ("language None" is none); without the marker the whole text is
        the transcript."""
        if output_text is None or not str(output_text).strip():
            return None, ""
        text = str(output_text).strip()
        if "assistant\n" in text:
            text = text.split("assistant\n", 1)[-1]
        text = collapse_patterns(collapse_runs(text))
        if MARKER not in text:
            return None, text.strip()
        head, transcript = text.split(MARKER, 1)
        head = head.strip()
        if head.lower() == "language none":
            return None, transcript.strip()
        language = None
        for line in (x.strip() for x in head.splitlines()):
            if not line:
                continue
            if line.lower().startswith("language "):
                language = line[len("language ") :].strip() or None
            else:
                language = line
            break  # the first non-empty line only
        return language or None, transcript.strip()

    @staticmethod
    def partial(text: str) -> str | None:
        """The transcript so far of a reply still being written (edge-serve's streamed
        deltas): what ``parse`` will give of it whatever comes next, as far as that is
        settled (the repetition fix may still fold the text's end into one pattern: that part
        waits); None while the text may still be the ``language <Name>`` header. A reply that
        cannot be one (a forced language's) is the transcript from its first character."""
        raw = text.strip()  # as parse strips it (the end's whitespace may yet be followed)
        if "assistant\n" in raw:
            raw = raw.split("assistant\n", 1)[-1]
        head, marker, rest = settled(raw).partition(MARKER)
        if marker:
            return rest.lstrip()
        if MARKER in raw or raw.lower().startswith(HEADER) or HEADER.startswith(raw.lower()):
            return None  # the header, or its marker not settled yet
        return head


def collapse_runs(text: str, limit: int = REPEATS) -> str:
    """Each run of one character longer than ``limit`` kept as that character once."""
    out, i = [], 0
    while i < len(text):
        j = i
        while j < len(text) and text[j] == text[i]:
            j += 1
        out.append(text[i] if j - i > limit else text[i:j])
        i = j
    return "".join(out)


def collapse_patterns(text: str, limit: int = REPEATS, longest: int = PATTERN_CHARS) -> str:
    """The first pattern (1..``longest`` characters, shortest first, scanning from the start)
    repeated at least ``limit`` times in a row kept once, the rest of the text after its last
    repetition collapsed the same way."""
    n = len(text)
    if n < 2 * limit:
        return text
    last = n - 2 * limit  # the last start a pattern is looked for at
    for i in range(last + 1):
        for k in range(1, longest + 1):
            if i + k * limit > n:
                break
            if _repeats(text, i, k, limit):
                unit, end = text[i : i + k], i + limit * k
                while end + k <= n and text[end : end + k] == unit:
                    end += k
                return text[:i] + unit + collapse_patterns(text[end:], limit, longest)
    return text


def settled(text: str, limit: int = REPEATS, longest: int = PATTERN_CHARS) -> str:
    """The longest start of ``collapse_patterns(collapse_runs(text))`` that no continuation of
    ``text`` changes: for a model's reply so far, what its parse will keep."""
    runs = collapse_runs(text, limit)
    tail = len(text) - len(text.rstrip(text[-1])) if text else 0
    # a last run of at most `limit` characters may still grow past it (and fold to one)
    known = runs[: len(runs) - tail] if tail <= limit else runs
    return _settled_patterns(known, limit, longest)


def _settled_patterns(text: str, limit: int, longest: int) -> str:
    """``collapse_patterns`` of every continuation of ``text``, as far as they all agree. A
    start where a pattern may still repeat ``limit`` times is open: the text from it repeats
    some pattern so far, or repeats one ``limit`` times where collapse_patterns would not look
    yet (fewer than ``2 * limit`` characters follow it, though more may come); the output
    stops at the first open start. Its last ``longest`` characters are never settled."""
    n = len(text)
    for i in range(n):
        for k in range(1, longest + 1):
            if i + k * limit > n:  # not decided yet: open while the text so far repeats it
                if _periodic(text, i, k):
                    return text[:i]
                continue
            if _repeats(text, i, k, limit):
                if i > n - 2 * limit:  # collapse_patterns looks here only once more follows
                    return text[:i]
                unit, end = text[i : i + k], i + limit * k
                while end + k <= n and text[end : end + k] == unit:
                    end += k
                if unit.startswith(text[end:]):  # the repetition may go on
                    return text[:i] + unit
                return text[:i] + unit + _settled_patterns(text[end:], limit, longest)
    return text


def _periodic(text: str, i: int, k: int) -> bool:
    """``text[i:]`` repeats its first ``k`` characters (or is shorter than them)."""
    return text.startswith(text[i : len(text) - k], i + k) if len(text) - i > k else True


def _repeats(text: str, i: int, k: int, limit: int) -> bool:
    """``text[i:i+k]`` repeated ``limit`` times from ``i`` (all of it within ``text``)."""
    if text[i + k] != text[i]:  # the usual answer, without slicing
        return False
    unit = text[i : i + k]
    return all(text.startswith(unit, i + r * k) for r in range(1, limit))
