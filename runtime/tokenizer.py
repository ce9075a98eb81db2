"""Text in and out: the fast tokenizer and the chat template the build copied into the engine."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = False,
    ) -> str:
        """The prompt text; a template that fails on these messages is a ValueError saying
        so (the request fails, not the run)."""
        if self._template is None:
            raise ValueError("this engine has no chat template; send apply_chat_template: false")
        specials = {
            k: v if isinstance(v, str) else (v or {}).get("content")
            for k, v in self._cfg.items()
            if k.endswith("_token")
        }
        from jinja2 import TemplateError

        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
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


class _TemplateRaised(Exception):
    """The template's own raise_exception(message)."""


def _compile(path: Path) -> Any:
    """chat_template.jinja as transformers renders it: sandboxed, trim_blocks, lstrip_blocks."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise _TemplateRaised(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
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
