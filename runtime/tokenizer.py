"""Text in and out: the fast tokenizer and the chat template the build copied into the engine."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeomni.export.common.text_files import generation_block
from edgeomni.runtime.artifacts import ArtifactError, read_json


class TextTokenizer:
    """tokenizer.json through `tokenizers`, chat_template.jinja through jinja2 (as transformers
    renders it: sandboxed, trim_blocks, lstrip_blocks)."""

    def __init__(self, folder: Path) -> None:
        """Reads and compiles everything up front, so a broken tokenizer or template is an
        ArtifactError when the stage opens, not a failure of every request."""
        from tokenizers import Tokenizer

        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ArtifactError(path, "missing (the stage's tokenizer)")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises its own exception type
            raise ArtifactError(path, f"not a tokenizer file ({e})") from None
        cfg_path = folder / "tokenizer_config.json"
        self._cfg: dict[str, Any] = read_json(cfg_path) if cfg_path.is_file() else {}
        if not isinstance(self._cfg, dict):
            raise ArtifactError(cfg_path, "must be a JSON object")
        tpl_path = folder / "chat_template.jinja"
        self._template: Any = _compile(tpl_path) if tpl_path.is_file() else None
        self._byte_level: bool | None = None

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (half a character, for some byte-level tokens):
        a byte-level BPE token's characters mapped back to their bytes, a byte-fallback
        ``<0xNN>`` token its byte, any other token its decoded text as UTF-8; an id past the
        tokenizer's vocabulary (a model's padded rows) none."""
        piece = self._tok.id_to_token(int(token_id))
        if piece is None:  # a logit row of the model past the tokenizer's vocabulary: no text
            return b""
        if self._byte_level is None:
            from tokenizers import decoders

            self._byte_level = isinstance(self._tok.decoder, decoders.ByteLevel)
        if self._byte_level and all(c in _UNICODE_TO_BYTE for c in piece):
            return bytes(_UNICODE_TO_BYTE[c] for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            with contextlib.suppress(ValueError):
                return bytes([int(piece[3:5], 16)])
        return self._tok.decode([int(token_id)], skip_special_tokens=False).encode("utf-8")

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = False,
        continue_final_message: bool = False,
    ) -> str:
        """The prompt text; a template that fails on these messages is a ValueError saying
        so (the request fails, not the run). ``continue_final_message``: the prompt ends
        inside the last message, which the model continues (no end of turn after it, no
        generation prompt), as transformers' ``apply_chat_template`` does it: the message's
        last text is rendered with a tag after it and the text is cut at the tag."""
        if self._template is None:
            raise ValueError("this engine has no chat template; send apply_chat_template: false")
        specials = {
            k: v if isinstance(v, str) else (v or {}).get("content")
            for k, v in self._cfg.items()
            if k.endswith("_token")
        }
        from jinja2 import TemplateError

        chat = [dict(m) for m in messages]
        if continue_final_message:
            final = _tag_final_message(chat)
            add_generation_prompt = False
        try:
            text = self._template.render(
                messages=chat,
                add_generation_prompt=add_generation_prompt,
                enable_thinking=enable_thinking,
                **specials,
            )
        except _TemplateRaised as e:
            raise ValueError(f"chat template: {e}") from None
        except (TemplateError, TypeError, ValueError, KeyError, AttributeError) as e:
            raise ValueError(
                f"the chat template cannot render these messages ({type(e).__name__}: {e})"
            ) from None
        return _cut_at_tag(text, final) if continue_final_message else text


# transformers' marker for the end of the message to continue (chat_template_utils.py)
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _tag_final_message(chat: list[dict[str, Any]]) -> str:
    """Put the tag after the last message's text (its last text part) and return that text;
    a ValueError when it has no text to continue."""
    if not chat:
        raise ValueError("continue_final_message: there are no messages")
    last = chat[-1]
    content = last.get("content")
    if isinstance(content, str):
        last["content"] = content + _CONTINUE_TAG
        return content
    parts = [dict(p) for p in content or ()]
    for part in reversed(parts):
        if "text" in part:
            text, part["text"] = part["text"], part["text"] + _CONTINUE_TAG
            last["content"] = parts
            return str(text)
    raise ValueError("continue_final_message: the last message has no text to continue")


def _cut_at_tag(text: str, final: str) -> str:
    """The rendered chat up to the tag (trailing spaces dropped where the template trimmed
    the message's), as transformers cuts it."""
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise ValueError(
            "continue_final_message: the chat template does not render the last message's "
            "text, so the prompt cannot end inside it"
        )
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    return text[:at].rstrip()


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as the printable character BPE vocabularies
    spell it with."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in keep]  # the others, past the first 256 code points
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(moved)}}


_UNICODE_TO_BYTE = {c: b for b, c in _byte_to_unicode().items()}


class _TemplateRaised(Exception):
    """The template's own raise_exception(message)."""


def _compile(path: Path) -> Any:
    """chat_template.jinja as transformers renders it: sandboxed, trim_blocks, lstrip_blocks,
    its ``{% generation %}`` blocks rendered as their bodies."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise _TemplateRaised(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[generation_block()]
    )
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(
        x, indent=indent, ensure_ascii=False
    )
    try:
        return env.from_string(path.read_text(encoding="utf-8"))
    except TemplateSyntaxError as e:
        raise ArtifactError(path, f"line {e.lineno}: {e.message}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ArtifactError(path, f"cannot be read ({e})") from None
