"""Request files in (predictions.json out: runtime/predictions.py).

The input is TensorRT Edge-LLM's request file (llm_inference's format, and the speech keys of
qwen3_tts_inference): top-level defaults plus a ``requests`` list. Upstream's parsers read the
keys they know and ignore the rest; this one knows every key upstream reads and says what each
does here (``FILE_KEYS``, ``REQUEST_KEYS``): a key for a feature edgeomni lacks is reported as
ignored at the top level and fails the request that needs it, and an unknown key is an error
naming the nearest known one, so a typo is caught and nothing is silently misread. Keys
starting with ``_`` are comments.

A bad request becomes a ``BadRequest`` so one typo does not cost the other requests their
answers; a bad file raises ``ValueError`` before anything runs.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .families import ALIASES, STAGE_KEYS, STAGE_PREFIXES, TEXT_FALLBACKS
from .families import REQUEST_KEYS as FAMILY_KEYS
from .sampling import DEFAULT_SAMPLING, SAMPLING_KEYS, SamplingParams, sampling_from_dict

__all__ = [
    "FILE_KEYS",
    "REQUEST_KEYS",
    "SPEECH_KEYS",
    "BadRequest",
    "Request",
    "bad_text",
    "inert_keys",
    "lone_surrogate",
    "load_request_file",
    "parse_sampling",
    "parse_request_file",
]

ROLES = ("system", "user", "assistant")
PART_TYPES = ("text", "audio", "image", "video")
# what a media part may carry besides its path: upstream's image preprocessing switch; a
# video's frame rate (of the frames given, or frames sampled a second of a video file) or,
# for frames given as images, each one's time in seconds
PART_OPTIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"image": ("do_resize",), "video": ("fps", "timestamps")}
)
DEFAULT_MAX_GENERATE_LENGTH = 256
MAX_NUM_LOGPROBS = 50  # upstream's cap
MAX_LOGIT_BIAS_ENTRIES = 1024  # upstream's cap per map
LOGIT_BIAS_RANGE = 100.0  # upstream's bound on each bias
COMMENT_PREFIX = "_"
# a lone UTF-16 surrogate: JSON may spell one ("\\udc80"), but no UTF-8 text holds it
SURROGATE = re.compile("[\ud800-\udfff]")

# the families' request controls (runtime/family.py's RequestKey), read by a stage whose graph
# input is ``request:<key>``; a request that sets one on a graph without such a stage fails alone
SPEECH_KEYS: Mapping[str, str] = MappingProxyType({k: v.meaning for k, v in FAMILY_KEYS.items()})
# other names of stage keys, and what each is
_ALIAS_KEYS = {key: meaning for key, (_, meaning) in ALIASES.items()}
_PREFIXED = "/".join(f"{p}*" for p in STAGE_PREFIXES)
# what an unknown-key message adds where the later stages' keys (runtime/family.py) are accepted
_STAGE_KEYS_TOO = f" and keys starting with {', '.join(STAGE_PREFIXES)}"

CACHE_KEY_MEANING = (
    "a string naming the context cache's partition: a request reuses only what requests of the "
    "same key left (default: one partition, where the prompt's content alone decides)"
)
MAX_CACHE_KEY = 256

# Top-level keys for features edgeomni does not have: the key changes nothing (the file would
# run the same without it) and is reported once.
IGNORED_FILE_KEYS: Mapping[str, str] = MappingProxyType({
    "available_lora_weights": "LoRA adapters are not supported (a request's lora_name fails)",
    "context_cache_lookup_policy": "edgeomni's context cache (--context-cache-mb) looks every "
                                   "prompt up",
    "context_cache_commit_policy": "edgeomni's context cache (--context-cache-mb) keeps every "
                                   "prompt's full blocks, least recently used out first",
    "save_system_prompt_kv_cache": "edgeomni's context cache (--context-cache-mb) keeps every "
                                   "prompt's blocks, its system prompt's among them",
    "disable_spec_decode": "there is no speculative decoding",
    "spec_proposal_sampling": "there is no speculative decoding",
    "diffusion_config": "diffusion language models are not supported",
    "streaming": "the talker starts after the thinker unless --stage-streaming is given, and "
                 "the code2wav stage's config (or --code2wav-streaming) sets how the vocoder "
                 "streams (the same tokens and codes either way)",
})  # fmt: skip

# Keys whose feature changes a request's output: a request that needs one fails alone.
UNSUPPORTED_KEYS: Mapping[str, str] = MappingProxyType({
    "lora_name": "LoRA adapters are not supported",
    "guided_decoding": "guided decoding is not supported",
})  # fmt: skip

# Every key a request file's top level may hold and what it does here (the README lists them;
# tests/test_requests.py keeps the two in step).
FILE_KEYS: Mapping[str, str] = MappingProxyType({
    "requests": "the list of requests (required)",
    "batch_size": "requests per cohort (--batch-size overrides it)",
    "max_generate_length": "tokens the text model may generate (default 256)",
    "min_generate_length": "end of sequence is held back until this many tokens",
    "apply_chat_template": "render messages through the chat template (default true)",
    "add_generation_prompt": "end the prompt with the assistant turn's opening (default true)",
    "continue_final_message": "end the prompt inside the last message, which the reply "
                              "continues (default false; no generation prompt is added)",
    "enable_thinking": "passed to the chat template (default false)",
    "temperature": "the text model's sampling temperature (default 1.0; 0 is greedy)",
    "top_k": "the text model's top-k (default 50; 0 off, 1 greedy)",
    "top_p": "the text model's top-p (default 0.8)",
    "repetition_penalty": "the text model's repetition penalty (default 1.0)"
                          + "".join(f"; on a graph without a text model, {to} (as upstream's "
                                    f"llm_inference reads it)" for k, to in TEXT_FALLBACKS.items()
                                    if k == "repetition_penalty"),
    "seed": "the random seed of a request's draws (sampling_seed is the same key)",
    "sampling_seed": "the random seed of a request's draws",
    "voice": "the talker's speaker (speaker is the same key)",
    "speaker": "the talker's speaker",
    "stop": "stop strings, the default for every request",
    "logit_bias": "{token id: bias}: added to the text model's logits before sampling",
    "num_logprobs": "the top N log-probabilities of each generated token, 0..50 (default 0)",
    "context_cache_key": CACHE_KEY_MEANING,
    **_ALIAS_KEYS,
    "guided_decoding": UNSUPPORTED_KEYS["guided_decoding"] + ": every request fails",
    **SPEECH_KEYS,
    **{k: f"ignored: {why}" for k, why in IGNORED_FILE_KEYS.items()},
})  # fmt: skip

REQUEST_KEYS: Mapping[str, str] = MappingProxyType({
    "messages": "the conversation: role and content (a string, or text, image, video and audio "
                "parts)",
    "prompt": "one user message as a string (instead of messages)",
    "max_generate_length": "overrides the top level's",
    "min_generate_length": "overrides the top level's",
    "sampling": f"per-request sampling: the top level's sampling keys and {_PREFIXED} keys",
    "sampling_seed": "the request's seed (the same as sampling.seed)",
    "voice": "the talker's speaker (speaker is the same key)",
    "speaker": "the talker's speaker",
    "stop": "a string or strings that end generation; cut from the text",
    "logit_bias": "replaces the top level's logit_bias for this request",
    "num_logprobs": "replaces the top level's num_logprobs for this request",
    **{key: f"{meaning}, for this request" for key, meaning in _ALIAS_KEYS.items()},
    "reference": "anything (upstream's tests hold the expected answer): copied to the entry",
    "disable_spec_decode": "accepted, no effect: there is no speculative decoding",
    "save_system_prompt_kv_cache": "accepted, no effect: the context cache (--context-cache-mb) "
                                   "keeps every prompt's blocks",
    "context_cache_key": "overrides the top level's",
    **{k: f"{why}: the request fails" for k, why in UNSUPPORTED_KEYS.items()},
    **SPEECH_KEYS,
})  # fmt: skip

_FLAG_DEFAULTS = {
    "apply_chat_template": True,
    "add_generation_prompt": True,
    "enable_thinking": False,
    "continue_final_message": False,
}
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Request:
    """One validated request; ``fields`` says which request inputs it supplies to the graph."""

    index: int
    messages: tuple[Mapping[str, Any], ...]
    max_generate_length: int
    sampling: SamplingParams
    # the later stages' keys given (the families' stage keys, each validated by its name)
    stage_settings: Mapping[str, float | int]
    apply_chat_template: bool
    add_generation_prompt: bool
    enable_thinking: bool
    voice: str | None
    stop: tuple[str, ...]
    fields: frozenset[str]
    # end-of-sequence tokens are banned until this many tokens are generated (HF min_new_tokens)
    min_generate_length: int = 0
    # (token id, bias) pairs added to the text model's logits, sorted by id
    logit_bias: tuple[tuple[int, float], ...] = ()
    num_logprobs: int = 0  # the top N log-probabilities of each generated token; 0: none
    # the prompt ends inside the last message, which the reply continues (transformers'
    # continue_final_message): no generation prompt
    continue_final_message: bool = False
    # the families' request controls given (SPEECH_KEYS), each checked as its family declares:
    # read by the stage whose input is request:<key>
    speech: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    # copied into the request's predictions entry as they are (``reference``)
    carry: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    # the keys set for this request at any level (--sampling, the file's top level, the
    # request and its sampling object): what a graph that reads a key differently goes by
    given: frozenset[str] = frozenset()
    context_cache_key: str | None = None  # the context cache's partition (None: the shared one)

    @property
    def batch_settings(self) -> tuple[Any, ...]:
        """Hashable settings that must be equal across a cohort (part of its cohort key)."""
        return (
            self.sampling,
            tuple(sorted(self.stage_settings.items())),
            self.apply_chat_template,
            self.add_generation_prompt,
            self.enable_thinking,
            self.continue_final_message,
        )


@dataclass(frozen=True)
class BadRequest:
    """A request that failed validation; it is answered with ``ok: false`` and this error.
    ``messages`` and ``carry`` are what could be read of it, for its entry."""

    index: int
    error: str
    messages: Any = None
    carry: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)


def _is_extra_key(key: Any) -> bool:
    """A later stage's key (by its prefix; a family's request control is not, whatever its
    name)."""
    return isinstance(key, str) and key.startswith(STAGE_PREFIXES) and key not in SPEECH_KEYS


def _unknown(keys: Sequence[str], known: Sequence[str], what: str) -> str:
    """``unknown request keys ['temprature']; did you mean 'temperature'? accepted: ...``"""
    hints = [f"{key!r} -> {close[0]!r}" for key in keys
             if (close := difflib.get_close_matches(key, known, n=1, cutoff=0.75))]  # fmt: skip
    did = f"; did you mean {', '.join(hints)}?" if hints else ""
    return f"unknown {what} {sorted(keys)}{did}; accepted: {', '.join(known)}"


def _check_extra(key: str, value: Any) -> float | int:
    """Speech-stage keys: sampling names are range-checked, the rest must be numbers."""
    prefix = next((p for p in STAGE_PREFIXES if key.startswith(p)), None)
    if prefix is None:
        raise ValueError(f"{key} is not a speech-stage key ({', '.join(STAGE_PREFIXES)})")
    if key not in STAGE_KEYS:  # a key no stage reads would change nothing: a typo, say so
        raise ValueError(_unknown([key], STAGE_KEYS, "speech-stage key"))
    name = key[len(prefix) :]
    if name in SAMPLING_KEYS:
        params = sampling_from_dict({key: value}, prefix=prefix)
        return getattr(params, "seed" if name == "sampling_seed" else name)
    if name == "max_new_tokens":
        return _check_int(key, value)
    if name == "min_new_tokens":
        return _check_int(key, value, 0)
    if not isinstance(value, (int, float)):  # bool passes: a do-sample switch
        raise ValueError(f"{key} must be a number, got {value!r}")
    return value


def _check_int(key: str, value: Any, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{key} must be an integer >= {least}, got {value!r}")
    return value


def _check_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value


def _check_voice(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be a non-empty string, got {value!r}")
    return value


def _pick_voice(d: Mapping[str, Any]) -> str | None:
    """``voice`` and ``speaker`` are synonyms (speaker is llm_inference's name)."""
    given = {k: _check_voice(k, d[k]) for k in ("voice", "speaker") if k in d}
    if len(set(given.values())) > 1:
        raise ValueError(f"voice and speaker disagree: {given}")
    return next(iter(given.values()), None)


def _check_stop(value: Any) -> tuple[str, ...]:
    stop = [value] if isinstance(value, str) else value
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"stop must be a string or a list of non-empty strings, got {value!r}")
    return tuple(stop)


def _check_logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """upstream's rules: {"<token id>": bias}, each bias finite in [-100, 100], at most 1024."""
    if not isinstance(value, Mapping):
        raise ValueError(f'logit_bias must be an object like {{"123": -100.0}}, got {value!r}')
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(
            f"logit_bias has {len(value)} entries; at most {MAX_LOGIT_BIAS_ENTRIES} are allowed"
        )
    out: dict[int, float] = {}
    for key, bias in value.items():
        text = str(key).strip()
        if not text.isdigit():
            raise ValueError(f"logit_bias key {key!r} must be a token id (a non-negative integer)")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise ValueError(f"logit_bias[{key!r}] must be a finite number, got {bias!r}")
        if abs(bias) > LOGIT_BIAS_RANGE:
            raise ValueError(
                f"logit_bias[{key!r}] is {bias}; biases must be within "
                f"[-{LOGIT_BIAS_RANGE:g}, {LOGIT_BIAS_RANGE:g}]"
            )
        if int(text) in out:
            raise ValueError(f"logit_bias names token {int(text)} twice")
        out[int(text)] = float(bias)
    return tuple(sorted(out.items()))


def _check_num_logprobs(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_NUM_LOGPROBS:
        raise ValueError(
            f"num_logprobs must be an integer in [0, {MAX_NUM_LOGPROBS}], got {value!r}"
        )
    return value


# the top-level keys a request's own replaces: each one's check and its default
_OVERRIDES: Mapping[str, tuple[Callable[[Any], Any], Any]] = MappingProxyType({
    "max_generate_length": (lambda v: _check_int("max_generate_length", v),
                            DEFAULT_MAX_GENERATE_LENGTH),
    "min_generate_length": (lambda v: _check_int("min_generate_length", v, 0), 0),
    "stop": (_check_stop, ()),
    "logit_bias": (_check_logit_bias, ()),
    "num_logprobs": (_check_num_logprobs, 0),
})  # fmt: skip
_DEFAULTS = {key: default for key, (_, default) in _OVERRIDES.items()}


def _overrides(d: Mapping[str, Any], base: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    """``keys`` (of ``_OVERRIDES``) as ``d`` gives them, checked, else as ``base`` has them."""
    return {key: _OVERRIDES[key][0](d[key]) if key in d else base[key] for key in keys}


def _speech(d: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """The speech keys given (an empty string or list is upstream's "not given")."""
    out = dict(base)
    for key in SPEECH_KEYS:
        if key in d:
            value = FAMILY_KEYS[key].check(key, d[key])
            if value in ("", ()):
                out.pop(key, None)
            else:
                out[key] = value
    return out


def _audio_cap(d: Mapping[str, Any], extra: dict[str, Any]) -> None:
    """The families' other names of stage keys (upstream's ``max_audio_length``)."""
    for key, (target, _) in ALIASES.items():
        if key not in d:
            continue
        try:
            value = _check_extra(target, d[key])
        except ValueError as e:
            raise ValueError(str(e).replace(target, key, 1)) from None
        given = d.get(target)
        if given is not None and given != value:
            raise ValueError(f"{key} {value} and {target} {given} disagree")
        extra[target] = value


def _parse_part(part: Any, where: str) -> dict[str, Any]:
    if not isinstance(part, Mapping):
        raise ValueError(f"{where} must be an object like {{'type': 'text', 'text': ...}}")
    kind = part.get("type")
    if kind not in PART_TYPES:
        raise ValueError(f"{where}.type must be one of {', '.join(PART_TYPES)}, got {kind!r}")
    options = PART_OPTIONS.get(kind, ())
    unknown = [k for k in part if k not in ("type", kind, *options) and not _comment(k)]
    if unknown:
        known = ["type", kind, *options]
        raise ValueError(f"{where}: " + _unknown(unknown, known, f"keys of a {kind} part"))
    value = part.get(kind)
    if kind == "video":
        return _parse_video(part, where)
    if not isinstance(value, str) or (kind != "text" and not value):
        what = "a string" if kind == "text" else "a non-empty path string"
        raise ValueError(f"{where}.{kind} must be {what}, got {value!r}")
    out: dict[str, Any] = {"type": kind, kind: value}
    for key in options:
        if key in part:
            out[key] = _check_bool(f"{where}.{key}", part[key])
    return out


def _parse_video(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A video part: a video file's path, or its frames' image paths (a non-empty list), with
    an optional fps (> 0) or, for frames, their timestamps (seconds, one a frame, ascending)."""
    value = part.get("video")
    frames = isinstance(value, list)
    if not (isinstance(value, str) and value) and not (
        frames and value and all(isinstance(f, str) and f for f in value)
    ):
        raise ValueError(f"{where}.video must be a non-empty path string or a non-empty list of "
                         f"frame image paths, got {value!r}")  # fmt: skip
    out: dict[str, Any] = {"type": "video", "video": list(value) if frames else value}
    if "fps" in part:
        fps = part["fps"]
        if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 < fps < math.inf:
            raise ValueError(f"{where}.fps must be a number > 0, got {fps!r}")
        out["fps"] = float(fps)
    if "timestamps" in part:
        stamps = part["timestamps"]
        if not frames:
            raise ValueError(f"{where}.timestamps go with frames (a list of images), not a file")
        if "fps" in part:
            raise ValueError(f"{where}: give fps or timestamps, not both")
        if (not isinstance(stamps, list) or len(stamps) != len(value) or any(
                isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t < math.inf
                for t in stamps) or any(b < a for a, b in itertools.pairwise(stamps))):  # fmt: skip
            raise ValueError(f"{where}.timestamps must be {len(value)} numbers >= 0 in order (one "
                             f"a frame, in seconds), got {stamps!r}")  # fmt: skip
        out["timestamps"] = [float(t) for t in stamps]
    return out


def _comment(key: Any) -> bool:
    return isinstance(key, str) and key.startswith(COMMENT_PREFIX)


@dataclass(frozen=True)
class LoneSurrogate:
    """Where a parsed JSON value holds a lone surrogate: the path of the string (for a key, of
    the object holding it), the string, and the surrogate's index in it."""

    where: str
    text: str
    index: int
    key: bool


def lone_surrogate(value: Any, where: str = "") -> LoneSurrogate | None:
    """The first string in ``value`` (keys too, inside lists and objects) that is not Unicode
    text UTF-8 can hold: a lone surrogate, which JSON can spell (``"\\udc80"``) and a command
    line's undecodable bytes become. Walked with a stack, not recursion, so no nesting the JSON
    decoder took can overflow it."""
    stack: list[tuple[Any, str, bool]] = [(value, where, False)]
    while stack:
        item, at, key = stack.pop()
        if isinstance(item, str):
            hit = SURROGATE.search(item)
            if hit is not None:
                return LoneSurrogate(at, item, hit.start(), key)
        elif isinstance(item, Mapping):
            for name, inner in reversed(list(item.items())):
                stack.append((inner, f"{at}.{name}" if at else str(name), False))
                stack.append((name, at, True))
        elif isinstance(item, (list, tuple)):
            stack.extend((inner, f"{at}[{i}]", False) for i, inner in reversed(list(enumerate(item))))
    return None


def bad_text(value: Any, where: str) -> str | None:
    """``lone_surrogate`` as a request's error, or None when it is all text. The message shows
    the character escaped, never raw, so it can itself be printed."""
    found = lone_surrogate(value, where)
    if found is None:
        return None
    at = (f"{found.where}: a key" if found.where else "a key") if found.key else found.where
    code = ord(found.text[found.index])
    return (
        f"{at}: not valid Unicode text (a lone surrogate \\u{code:04x} at character "
        f"{found.index}; undecodable bytes or a half of a UTF-16 pair)"
    )


def _parse_messages(messages: Any) -> tuple[tuple[dict[str, Any], ...], set[str]]:
    """Validated copies of the messages and the part types they contain."""
    if not isinstance(messages, list):
        raise ValueError(f"messages must be a list of messages, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty")
    out: list[dict[str, Any]] = []
    kinds: set[str] = set()
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, Mapping):
            raise ValueError(f"{where} must be an object with role and content")
        unknown = [k for k in msg if k not in ("role", "content") and not _comment(k)]
        if unknown:
            raise ValueError(f"{where} has " + _unknown(unknown, ("role", "content"), "keys"))
        role = msg.get("role")
        if role not in ROLES:
            raise ValueError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
        if "content" not in msg:
            raise ValueError(f"{where} has no content")
        content = msg["content"]
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            kinds.add("text")
            continue
        if not isinstance(content, list):
            raise ValueError(
                f"{where}.content must be a string or a list of parts, got {type(content).__name__}"
            )
        parts = [_parse_part(p, f"{where}.content[{j}]") for j, p in enumerate(content)]
        kinds.update(p["type"] for p in parts)
        out.append({"role": role, "content": parts})
    return tuple(out), kinds


def parse_sampling(
    obj: Any, base: SamplingParams = DEFAULT_SAMPLING, extra_base: Mapping[str, Any] = _EMPTY
) -> tuple[SamplingParams, dict[str, Any]]:
    """Split a sampling object (a request's, or the CLI's --sampling) into params and extras.

    Unlike ``sampling_from_dict`` it rejects unknown keys, listing the accepted ones.
    """
    if not isinstance(obj, Mapping):
        raise ValueError(f"sampling must be an object, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in SAMPLING_KEYS and not _is_extra_key(k)]
    if unknown:
        raise ValueError(_unknown(unknown, SAMPLING_KEYS, "sampling keys") + _STAGE_KEYS_TOO)
    params = sampling_from_dict(obj, base)
    extra = dict(extra_base)
    extra.update({k: _check_extra(k, v) for k, v in obj.items() if _is_extra_key(k)})
    return params, extra


def _parse_request(
    index: int,
    req: Any,
    base: SamplingParams,
    extra_base: Mapping[str, Any],
    file: Mapping[str, Any],
    given: frozenset[str] = frozenset(),
) -> Request:
    if not isinstance(req, Mapping):
        raise ValueError(f"a request must be an object, got {type(req).__name__}")
    # its reference is only copied back, and written as JSON spells it: not the model's text
    problem = bad_text({k: v for k, v in req.items() if k != "reference"}, "")
    if problem:
        raise ValueError(problem)
    unknown = [k for k in req if k not in REQUEST_KEYS and not _comment(k)]
    if unknown:
        hint = ""
        if any(k in SAMPLING_KEYS or _is_extra_key(k) for k in unknown):
            hint = "; per-request sampling keys go in the 'sampling' object"
        raise ValueError(_unknown(unknown, tuple(REQUEST_KEYS), "request keys") + hint)
    if "prompt" in req:
        if "messages" in req:
            raise ValueError("give either prompt or messages, not both")
        if not isinstance(req["prompt"], str):
            raise ValueError(f"prompt must be a string, got {type(req['prompt']).__name__}")
        messages, kinds = _parse_messages([{"role": "user", "content": req["prompt"]}])
    elif "messages" not in req:
        raise ValueError("request has no messages (or prompt)")
    else:
        messages, kinds = _parse_messages(req["messages"])
    for key, why in UNSUPPORTED_KEYS.items():
        if req.get(key, file.get(key)) not in (None, "", {}):
            raise ValueError(f"{key}: {why} by edgeomni")
    lengths = _overrides(req, file, "max_generate_length", "min_generate_length")
    max_len, min_len = lengths["max_generate_length"], lengths["min_generate_length"]
    if min_len > max_len:
        raise ValueError(f"min_generate_length {min_len} exceeds max_generate_length {max_len}")
    inner = req.get("sampling", {})
    params, extra = parse_sampling(inner, base, extra_base)
    if "sampling_seed" in req:
        seeded = sampling_from_dict({"sampling_seed": req["sampling_seed"]}, params)
        if any(k in inner for k in ("seed", "sampling_seed")) and seeded.seed != params.seed:
            raise ValueError(
                f"sampling_seed {seeded.seed} and the sampling object's seed {params.seed} disagree"
            )
        params = seeded
    _audio_cap(req, extra)
    voice = _pick_voice(req) or file["voice"]
    texts = _overrides(req, file, "stop", "logit_bias", "num_logprobs")
    for key in ("disable_spec_decode", "save_system_prompt_kv_cache"):
        if key in req:
            _check_bool(key, req[key])
    speech = _speech(req, file["speech"])
    fields = {"messages"} | (kinds & {"audio", "image", "video"}) | set(speech)
    if voice is not None:
        fields.add("voice")
    return Request(
        index=index,
        messages=messages,
        **lengths,
        sampling=params,
        stage_settings=MappingProxyType(extra),
        **{flag: file[flag] for flag in _FLAG_DEFAULTS},
        voice=voice,
        **texts,
        fields=frozenset(fields),
        speech=MappingProxyType(speech),
        carry=_carry(req),
        given=given | _keys(req) | _keys(req.get("sampling")),
        context_cache_key=_cache_key(req["context_cache_key"]) if "context_cache_key" in req
        else file["context_cache_key"],
    )


def _cache_key(value: Any) -> str | None:
    """A context_cache_key: a non-empty string of at most MAX_CACHE_KEY characters, or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_CACHE_KEY:
        raise ValueError(f"context_cache_key must be a non-empty string of at most "
                         f"{MAX_CACHE_KEY} characters, got {value!r:.80}")  # fmt: skip
    return value


def _keys(obj: Any) -> frozenset[str]:
    """An object's keys but its comments (nothing for a non-object)."""
    if not isinstance(obj, Mapping):
        return frozenset()
    return frozenset(k for k in obj if isinstance(k, str) and not _comment(k))


# keys only a text model reads (a graph without one, Qwen3-TTS's, speaks the request's text)
TEXT_MODEL_KEYS = ("temperature", "top_k", "top_p", "max_generate_length",
                   "min_generate_length", "stop", "logit_bias", "num_logprobs",
                   "apply_chat_template", "add_generation_prompt", "enable_thinking",
                   "continue_final_message")  # fmt: skip
# keys only the speech stages read
SPEECH_STAGE_KEYS = ("voice", "speaker", *ALIASES)


def inert_keys(
    given: Collection[str], *, reads: Collection[str], text_model: bool, speaks: bool
) -> dict[str, str]:
    """The keys of ``given`` that change nothing in a run whose stages read ``reads`` (the
    runners' ``reads``), with why: a text model's keys on a graph without one, the speech
    stages' keys in a run that does not speak, a key the graph's stages do not read (the
    text mode of one family's talker on another's)."""
    known = {*TEXT_MODEL_KEYS, *SPEECH_STAGE_KEYS, *STAGE_KEYS, "repetition_penalty"}
    out: dict[str, str] = {}
    for key in sorted(set(given) & known - set(reads)):
        if key in (*TEXT_MODEL_KEYS, "repetition_penalty") and not text_model:
            out[key] = f"this graph has no text model (its stages' keys are {_PREFIXED})"
        elif (key in SPEECH_STAGE_KEYS or _is_extra_key(key)) and not speaks:
            out[key] = "this run does not speak"
        else:
            out[key] = "no stage of this graph reads it"
    return out


def _carry(req: Any) -> Mapping[str, Any]:
    return MappingProxyType(
        {"reference": req["reference"]} if isinstance(req, Mapping) and "reference" in req else {}
    )


def parse_request_file(
    obj: Any,
    defaults: SamplingParams = DEFAULT_SAMPLING,
    extra_defaults: Mapping[str, Any] = _EMPTY,
    given: Collection[str] = (),
    top: Mapping[str, Any] = _EMPTY,
) -> tuple[list[Request | BadRequest], dict[str, Any]]:
    """Parse a loaded request file; precedence is CLI ``defaults`` < file top level < request.
    ``given``: the keys the CLI's defaults set (each request's ``given`` adds its own).
    ``top``: top-level keys the CLI's flags set, which the file's own top level overrides
    (``voice`` and ``speaker`` as one key).

    Returns one entry per request, in input order, and the file-level settings the file gave
    (``batch_size`` and the other top-level keys, validated) for the CLI; ``settings["ignored"]``
    lists the top-level keys that change nothing here, with why.
    """
    if not isinstance(obj, Mapping):
        raise ValueError(f"a request file must be a JSON object, got {type(obj).__name__}")
    voiced = "voice" in obj or "speaker" in obj
    obj = {**{k: v for k, v in top.items() if not (k == "voice" and voiced)}, **obj}
    unknown = [k for k in obj if k not in FILE_KEYS and not _is_extra_key(k) and not _comment(k)]
    if unknown:
        raise ValueError(_unknown(unknown, tuple(FILE_KEYS), "top-level keys") + _STAGE_KEYS_TOO)
    if not isinstance(obj.get("requests"), list):
        raise ValueError("a request file needs a 'requests' list")
    problem = bad_text({k: v for k, v in obj.items() if k != "requests"}, "")
    if problem:
        raise ValueError(f"top level: {problem}")
    settings: dict[str, Any] = {}
    try:
        extra_base = {k: _check_extra(k, v) for k, v in extra_defaults.items()}
    except ValueError as e:
        raise ValueError(f"sampling defaults: {e}") from None
    try:
        base = sampling_from_dict(obj, defaults)
        extra_base.update({k: _check_extra(k, v) for k, v in obj.items() if _is_extra_key(k)})
        _audio_cap(obj, extra_base)
        if "batch_size" in obj:
            settings["batch_size"] = _check_int("batch_size", obj["batch_size"])
        lengths = _overrides(obj, _DEFAULTS, "max_generate_length", "min_generate_length")
        flags = {k: _check_bool(k, obj[k]) if k in obj else v for k, v in _FLAG_DEFAULTS.items()}
        if flags["continue_final_message"] and obj.get("add_generation_prompt") is True:
            raise ValueError(
                "continue_final_message and add_generation_prompt cannot both be true: the "
                "reply either continues the last message or starts a new assistant turn"
            )
        voice = _pick_voice(obj)
        texts = _overrides(obj, _DEFAULTS, "stop", "logit_bias", "num_logprobs")
        speech = _speech(obj, {})
        cache_key = _cache_key(obj.get("context_cache_key"))
    except ValueError as e:
        raise ValueError(f"top level: {e}") from None
    file = {**lengths, "voice": voice, **texts, "speech": speech, "context_cache_key": cache_key,
            "guided_decoding": obj.get("guided_decoding"), **flags}  # fmt: skip
    kept = ("max_generate_length", "min_generate_length", "voice", *_FLAG_DEFAULTS)
    settings.update({k: file[k] for k in kept if k in obj or (k == "voice" and voice)})
    settings.update({k: obj[k] for k in obj if k in SAMPLING_KEYS or _is_extra_key(k)})
    settings["ignored"] = {k: IGNORED_FILE_KEYS[k] for k in obj if k in IGNORED_FILE_KEYS}
    # text-model keys upstream's llm_inference gives a later stage (the top-level
    # repetition_penalty to the talker), given here without that stage's own: key -> stage key
    settings["fallbacks"] = {k: v for k, v in TEXT_FALLBACKS.items() if k in obj and v not in obj}

    entries: list[Request | BadRequest] = []
    file_given = frozenset(given) | (_keys(obj) - {"requests"})
    for i, req in enumerate(obj["requests"]):
        try:
            entries.append(_parse_request(i, req, base, extra_base, file, file_given))
        except ValueError as e:
            messages = req.get("messages") if isinstance(req, Mapping) else None
            if isinstance(req, Mapping) and isinstance(req.get("prompt"), str):
                messages = [{"role": "user", "content": req["prompt"]}]
            entries.append(BadRequest(index=i, error=str(e), messages=messages, carry=_carry(req)))
    return entries, settings


def load_request_file(
    path: str | os.PathLike[str],
    defaults: SamplingParams = DEFAULT_SAMPLING,
    extra_defaults: Mapping[str, Any] = _EMPTY,
    given: Collection[str] = (),
    top: Mapping[str, Any] = _EMPTY,
) -> tuple[list[Request | BadRequest], dict[str, Any]]:
    """Read and parse a request file; JSON errors become ``ValueError`` with line and column,
    and so does a key given twice in one object (JSON would keep the last, unsaid)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    try:
        obj = loads_once(text)
    except KeyGivenTwice as e:
        raise ValueError(f"{path}: {e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    except RecursionError:  # the decoder recurses per level: a request file never needs this
        raise ValueError(f"{path}: nested too deeply to read (arrays or objects in "
                         "each other hundreds of levels deep)") from None  # fmt: skip
    try:
        return parse_request_file(obj, defaults, extra_defaults, given, top)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


class KeyGivenTwice(ValueError):
    """A JSON object gives a key more than once."""


def loads_once(text: str) -> Any:
    """``json.loads``, but a key given twice in one object (JSON would keep the last, unsaid)
    raises KeyGivenTwice, naming the key and where it is."""
    twice: dict[int, str] = {}  # id of an object read -> its first key given again

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(pairs)
        if len(obj) < len(pairs):
            keys = [k for k, _ in pairs]
            twice[id(obj)] = next(k for i, k in enumerate(keys) if k in keys[:i])
        return obj

    obj = json.loads(text, object_pairs_hook=pairs_hook)
    if twice:
        where, key = _given_twice(obj, twice)
        raise KeyGivenTwice(f"{where or 'top level'}: the key {key!r} is given more than once "
                            "(JSON would keep only the last); give it once")  # fmt: skip
    return obj


def _given_twice(obj: Any, twice: Mapping[int, str]) -> tuple[str, str]:
    """The first object (in the file's order) ``twice`` names: its path and its key."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:  # not recursive: a file as deep as the decoder reads must not overflow here
        where, value = stack.pop()
        if isinstance(value, dict):
            if id(value) in twice:
                return where, twice[id(value)]
            stack += [(f"{where}.{k}" if where else k, v) for k, v in reversed(value.items())]
        elif isinstance(value, list):
            stack += [(f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value)))]
    raise AssertionError("an object read with a key given twice is not in the file")
