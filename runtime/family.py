"""What a model family declares to the runtime, and where it registers.

A family's runtime folder (``runtime/families/<name>/__init__.py``) or an out-of-tree family's
module calls ``register_family(RuntimeFamily(...))``; runtime/families/ collects the declarations
into the tables the generic runtime reads (runners, media hooks, request keys, stage keys), so no
generic file names a family or one of its keys. The export side of a family registers with
export/registry.py (whose ``load_plugins`` imports out-of-tree families named by
``EDGEOMNI_FAMILIES`` or the ``edgeomni.families`` entry points).

Standard library only, and importing it loads no family: a plugin imports it to declare.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def text_value(key: str, value: Any) -> str:
    """A request key whose value is a string (an empty one is "not given")."""
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {value!r}")
    return value


@dataclass(frozen=True)
class RequestKey:
    """A key of a request (and of a request file's top level) that a family's stage reads as the
    graph input ``request:<key>``. ``check(key, value)`` validates and returns the value (a
    ValueError fails the request; "" or () is "not given"). ``flag``: edge-infer's flag that
    sets it as the request file's default (with its ``flag_help``, read by ``flag_type``); ``path``: the value is a
    media file the run reads, of this kind ("audio": its flag's file is checked as --audio's); ``speech_field``: the field of edge-serve's /v1/audio/speech body that
    sets it; ``speaks``: a stage that speaks reads it (its flag goes with edge-infer's audio
    outputs)."""

    meaning: str
    check: Callable[[str, Any], Any] = text_value
    flag: str | None = None
    flag_help: str = ""
    flag_type: Callable[[str], Any] = str  # the flag's text as the key's value
    path: str | None = None
    speech_field: str | None = None
    speaks: bool = True


@dataclass(frozen=True)
class RuntimeFamily:
    """A family's runtime: the runners its graphs name, its thinker's media hooks, and the
    request keys its stages read.

    ``runners``: (runner name, kind, "module:attribute" of its factory, emit id -> kind), the
    factory imported when a stage with it first runs. ``media``: engine config model_type ->
    "module:attribute" of its thinker's media hook (runtime/prompt.py says what a hook has).
    ``request_keys``: its request controls (``RequestKey``). ``stage_prefixes`` and
    ``stage_keys``: the sampling and limit keys of its later stages (``talker_top_k``), given in
    a request's ``sampling`` object, at a request file's top level, in ``--sampling`` or as
    extra fields of an edge-serve body; a key with one of the prefixes that is not a stage key
    is an error (a typo). Each stage key is validated by its name after the prefix: a sampling
    name as the text model's, ``max_new_tokens`` an integer >= 1, ``min_new_tokens`` >= 0, any
    other a number. ``aliases``: request keys that are another name of a stage key (upstream's
    ``max_audio_length``): key -> (stage key, meaning). ``text_fallbacks``: a text model's key
    that a graph without a text model gives to a stage key instead (qwen3_tts_inference reads
    ``repetition_penalty`` as the talker's), unless that stage key is given too.
    ``length_keys``: stage keys that, each set to n, make an utterance n frames long (how
    edge-serve's warm-up runs the lengths traffic runs). ``transcription``: engine config
    model_type -> "module:attribute" of its speech-to-text form (an ASR model's): an object
    with ``messages(audio, language, prompt)`` (the request's chat messages for one audio file,
    an optional forced language name and an optional context prompt, ending with the
    assistant turn the reply continues: the request renders them with
    ``continue_final_message``; a ValueError for a language it does not know),
    ``parse(output_text)`` ((language or None, transcript) from the model's decoded text: the
    text model's runner puts them in each predictions entry), and optionally
    ``request_messages(messages, controls)`` (a request's messages with the family's request
    controls applied, such as a forced language as the start of the reply, which is then
    continued; None when none is given) and ``partial(text)`` (the transcript so far of a reply
    being written, for streamed deltas) and ``language_name(value)`` (a forced language's
    name as the model writes it, for an answer whose reply does not repeat it); a class is
    instantiated once, without arguments;
    edge-serve's /v1/audio/transcriptions and edge-infer read it.
    ``label``: the family's name in messages ("a <label> control")."""

    name: str
    label: str = ""
    runners: tuple[tuple[str, str, str, Mapping[str, str]], ...] = ()
    media: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    request_keys: Mapping[str, RequestKey] = field(default_factory=lambda: _EMPTY)
    stage_prefixes: tuple[str, ...] = ()
    stage_keys: tuple[str, ...] = ()
    aliases: Mapping[str, tuple[str, str]] = field(default_factory=lambda: _EMPTY)
    text_fallbacks: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    length_keys: tuple[str, ...] = ()
    transcription: Mapping[str, str] = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        for key in self.stage_keys:
            if not key.startswith(self.stage_prefixes):
                raise ValueError(f"{self.name}: stage key {key!r} has none of its prefixes")


_REGISTERED: dict[str, RuntimeFamily] = {}
_frozen: list[str] = []  # set once runtime/families/ has read the registry


def register_family(family: RuntimeFamily) -> RuntimeFamily:
    """Add a family's runtime declaration. The runtime reads the registry once, when
    runtime/families/ is first imported (it imports the built-in families and the plugins
    first): a later registration is an error, not a family silently missing."""
    if _REGISTERED.get(family.name) == family:
        return family
    if family.name in _REGISTERED:
        raise RuntimeError(f"runtime family {family.name!r} registered twice")
    if _frozen:
        raise RuntimeError(
            f"runtime family {family.name!r} registered after the runtime read its families: "
            "register it from a module named by EDGEOMNI_FAMILIES or an edgeomni.families "
            "entry point"
        )
    _REGISTERED[family.name] = family
    return family


def registered() -> tuple[RuntimeFamily, ...]:
    return tuple(_REGISTERED.values())


def freeze() -> tuple[RuntimeFamily, ...]:
    """The declarations, read once: later registrations are refused."""
    _frozen.append("read")
    return registered()
