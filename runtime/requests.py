"""Request files in, predictions out.

The input is llm_inference's request file: top-level defaults plus a ``requests`` list. A bad
request becomes a ``BadRequest`` so one typo does not cost the other requests their answers;
a bad file raises ``ValueError`` before anything runs. Predictions are written atomically so
a crash never leaves a truncated predictions.json behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .sampling import DEFAULT_SAMPLING, SAMPLING_KEYS, SamplingParams, sampling_from_dict

__all__ = [
    "EXTRA_SAMPLING_PREFIXES",
    "BadRequest",
    "Request",
    "load_request_file",
    "parse_sampling",
    "parse_request_file",
    "write_json_atomic",
    "write_predictions",
]

# Keys for later speech stages (talker, code predictor) ride along untouched.
EXTRA_SAMPLING_PREFIXES: tuple[str, ...] = ("talker_", "cp_", "subtalker_")
ROLES = ("system", "user", "assistant")
PART_TYPES = ("text", "audio", "image")
DEFAULT_MAX_GENERATE_LENGTH = 256

_FLAG_KEYS = ("apply_chat_template", "add_generation_prompt", "enable_thinking")
_FLAG_DEFAULTS = {
    "apply_chat_template": True,
    "add_generation_prompt": True,
    "enable_thinking": False,
}
_TOP_LEVEL_KEYS = (
    "requests",
    "batch_size",
    "max_generate_length",
    "min_generate_length",
    *_FLAG_KEYS,
    *SAMPLING_KEYS,
    "voice",
    "speaker",
)
_REQUEST_KEYS = (
    "messages",
    "prompt",
    "max_generate_length",
    "min_generate_length",
    "sampling",
    "voice",
    "speaker",
    "stop",
)
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Request:
    """One validated request; ``fields`` says which request inputs it supplies to the graph."""

    index: int
    messages: tuple[Mapping[str, Any], ...]
    max_generate_length: int
    sampling: SamplingParams
    extra_sampling: Mapping[str, float | int]
    apply_chat_template: bool
    add_generation_prompt: bool
    enable_thinking: bool
    voice: str | None
    stop: tuple[str, ...]
    fields: frozenset[str]
    # end-of-sequence tokens are banned until this many tokens are generated (HF min_new_tokens)
    min_generate_length: int = 0

    @property
    def batch_settings(self) -> tuple[Any, ...]:
        """Hashable settings that must be equal across a cohort (part of its cohort key)."""
        return (
            self.sampling,
            tuple(sorted(self.extra_sampling.items())),
            self.apply_chat_template,
            self.add_generation_prompt,
            self.enable_thinking,
        )


@dataclass(frozen=True)
class BadRequest:
    """A request that failed validation; it is answered with ``ok: false`` and this error."""

    index: int
    error: str


def _is_extra_key(key: str) -> bool:
    return key.startswith(EXTRA_SAMPLING_PREFIXES)


def _check_extra(key: str, value: Any) -> float | int:
    """Speech-stage keys: sampling names are range-checked, the rest must be numbers."""
    prefix = next((p for p in EXTRA_SAMPLING_PREFIXES if key.startswith(p)), None)
    if prefix is None:
        raise ValueError(f"{key} is not a speech-stage key ({', '.join(EXTRA_SAMPLING_PREFIXES)})")
    name = key[len(prefix) :]
    if name in SAMPLING_KEYS:
        params = sampling_from_dict({key: value}, prefix=prefix)
        return getattr(params, "seed" if name == "sampling_seed" else name)
    if name == "max_new_tokens":
        return _check_positive_int(key, value)
    if name == "min_new_tokens":
        return _check_min_length(key, value)
    if not isinstance(value, (int, float)):  # bool passes: e.g. subtalker_dosample
        raise ValueError(f"{key} must be a number, got {value!r}")
    return value


def _check_positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
    return value


def _check_min_length(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be an integer >= 0, got {value!r}")
    return value


def _check_bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")
    return value


def _check_voice(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} must be a non-empty string, got {value!r}")
    return value


def _pick_voice(d: Mapping[str, Any], where: str) -> str | None:
    """``voice`` and ``speaker`` are synonyms (speaker is llm_inference's name)."""
    given = {k: _check_voice(f"{where}{k}", d[k]) for k in ("voice", "speaker") if k in d}
    if len(set(given.values())) > 1:
        raise ValueError(f"{where}voice and {where}speaker disagree: {given}")
    return next(iter(given.values()), None)


def _parse_part(part: Any, where: str) -> dict[str, str]:
    if not isinstance(part, Mapping):
        raise ValueError(f"{where} must be an object like {{'type': 'text', 'text': ...}}")
    kind = part.get("type")
    if kind not in PART_TYPES:
        raise ValueError(f"{where}.type must be one of {', '.join(PART_TYPES)}, got {kind!r}")
    unknown = set(part) - {"type", kind}
    if unknown:
        raise ValueError(
            f"{where} has unknown keys {sorted(unknown)}; a {kind} part holds {kind!r}"
        )
    value = part.get(kind)
    if not isinstance(value, str) or (kind != "text" and not value):
        what = "a string" if kind == "text" else "a non-empty path string"
        raise ValueError(f"{where}.{kind} must be {what}, got {value!r}")
    return {"type": kind, kind: value}


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
        unknown = set(msg) - {"role", "content"}
        if unknown:
            raise ValueError(f"{where} has unknown keys {sorted(unknown)}; accepted: role, content")
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
    unknown = sorted(k for k in obj if k not in SAMPLING_KEYS and not _is_extra_key(k))
    if unknown:
        raise ValueError(
            f"unknown sampling keys {unknown}; accepted: {', '.join(SAMPLING_KEYS)} "
            f"and keys starting with {', '.join(EXTRA_SAMPLING_PREFIXES)}"
        )
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
) -> Request:
    if not isinstance(req, Mapping):
        raise ValueError(f"a request must be an object, got {type(req).__name__}")
    unknown = sorted(set(req) - set(_REQUEST_KEYS))
    if unknown:
        hint = ""
        if any(k in SAMPLING_KEYS or _is_extra_key(k) for k in unknown):
            hint = "; per-request sampling keys go in the 'sampling' object"
        raise ValueError(
            f"unknown request keys {unknown}; accepted: {', '.join(_REQUEST_KEYS)}{hint}"
        )
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
    max_len = file["max_generate_length"]
    if "max_generate_length" in req:
        max_len = _check_positive_int("max_generate_length", req["max_generate_length"])
    min_len = file["min_generate_length"]
    if "min_generate_length" in req:
        min_len = _check_min_length("min_generate_length", req["min_generate_length"])
    if min_len > max_len:
        raise ValueError(f"min_generate_length {min_len} exceeds max_generate_length {max_len}")
    params, extra = base, dict(extra_base)
    if "sampling" in req:
        params, extra = parse_sampling(req["sampling"], base, extra_base)
    voice = _pick_voice(req, "") or file["voice"]
    stop = req.get("stop", ())
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"stop must be a list of non-empty strings, got {stop!r}")
    fields = {"messages"} | (kinds & {"audio", "image"})
    if voice is not None:
        fields.add("voice")
    return Request(
        index=index,
        messages=messages,
        max_generate_length=max_len,
        min_generate_length=min_len,
        sampling=params,
        extra_sampling=MappingProxyType(extra),
        apply_chat_template=file["apply_chat_template"],
        add_generation_prompt=file["add_generation_prompt"],
        enable_thinking=file["enable_thinking"],
        voice=voice,
        stop=tuple(stop),
        fields=frozenset(fields),
    )


def parse_request_file(
    obj: Any,
    defaults: SamplingParams = DEFAULT_SAMPLING,
    extra_defaults: Mapping[str, Any] = _EMPTY,
) -> tuple[list[Request | BadRequest], dict[str, Any]]:
    """Parse a loaded request file; precedence is CLI ``defaults`` < file top level < request.

    Returns one entry per request, in input order, and the file-level settings the file gave
    (``batch_size`` and the other top-level keys, validated) for the CLI.
    """
    if not isinstance(obj, Mapping):
        raise ValueError(f"a request file must be a JSON object, got {type(obj).__name__}")
    unknown = sorted(k for k in obj if k not in _TOP_LEVEL_KEYS and not _is_extra_key(k))
    if unknown:
        raise ValueError(
            f"unknown top-level keys {unknown}; accepted: {', '.join(_TOP_LEVEL_KEYS)} "
            f"and keys starting with {', '.join(EXTRA_SAMPLING_PREFIXES)}"
        )
    if not isinstance(obj.get("requests"), list):
        raise ValueError("a request file needs a 'requests' list")
    settings: dict[str, Any] = {}
    try:
        extra_base = {k: _check_extra(k, v) for k, v in extra_defaults.items()}
    except ValueError as e:
        raise ValueError(f"sampling defaults: {e}") from None
    try:
        base = sampling_from_dict(obj, defaults)
        extra_base.update({k: _check_extra(k, v) for k, v in obj.items() if _is_extra_key(k)})
        if "batch_size" in obj:
            settings["batch_size"] = _check_positive_int("batch_size", obj["batch_size"])
        max_len = DEFAULT_MAX_GENERATE_LENGTH
        if "max_generate_length" in obj:
            max_len = _check_positive_int("max_generate_length", obj["max_generate_length"])
        min_len = 0
        if "min_generate_length" in obj:
            min_len = _check_min_length("min_generate_length", obj["min_generate_length"])
        flags = {k: _check_bool(k, obj[k]) if k in obj else v for k, v in _FLAG_DEFAULTS.items()}
        voice = _pick_voice(obj, "")
    except ValueError as e:
        raise ValueError(f"top level: {e}") from None
    file = {"max_generate_length": max_len, "min_generate_length": min_len, "voice": voice,
            **flags}  # fmt: skip
    settings.update({k: v for k, v in file.items() if k in obj or (k == "voice" and voice)})
    settings.update({k: obj[k] for k in obj if k in SAMPLING_KEYS or _is_extra_key(k)})

    entries: list[Request | BadRequest] = []
    for i, req in enumerate(obj["requests"]):
        try:
            entries.append(_parse_request(i, req, base, extra_base, file))
        except ValueError as e:
            entries.append(BadRequest(index=i, error=str(e)))
    return entries, settings


def load_request_file(
    path: str | os.PathLike[str],
    defaults: SamplingParams = DEFAULT_SAMPLING,
    extra_defaults: Mapping[str, Any] = _EMPTY,
) -> tuple[list[Request | BadRequest], dict[str, Any]]:
    """Read and parse a request file; JSON errors become ``ValueError`` with line and column."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    try:
        return parse_request_file(obj, defaults, extra_defaults)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """Write JSON so readers see the old file or the whole new one, never a partial one.

    Serialises into a temp file in the same directory (same filesystem, so ``os.replace`` is
    atomic), fsyncs it, renames it over ``path`` and fsyncs the directory. Any failure removes
    the temp file and leaves ``path`` as it was.
    """
    path = Path(os.path.realpath(path))  # through a symlink to its file, as ``>`` writes
    directory = path.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2, ensure_ascii=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; keep an existing file's mode, else the usual 0644.
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if hasattr(os, "O_DIRECTORY"):
        # Make the rename itself durable; best effort where directories cannot be opened.
        try:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return
        try:
            with contextlib.suppress(OSError):
                os.fsync(dfd)
        finally:
            os.close(dfd)


def write_predictions(path: str | os.PathLike[str], entries: Sequence[Mapping[str, Any]]) -> None:
    """Write ``{"responses": [...]}`` atomically; entries must already be in input order."""
    last = -1
    for n, entry in enumerate(entries):
        missing = [k for k in ("request_idx", "ok", "error") if k not in entry]
        if missing:
            raise ValueError(f"prediction entry {n} lacks {', '.join(missing)}")
        idx = entry["request_idx"]
        if isinstance(idx, bool) or not isinstance(idx, int) or idx <= last:
            raise ValueError(
                f"prediction entry {n} has request_idx {idx!r}; entries must be in input order"
            )
        last = idx
    write_json_atomic(path, {"responses": [dict(e) for e in entries]})
