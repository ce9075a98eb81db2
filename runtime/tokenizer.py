"""Text in and out: the fast tokenizer and the chat template the build copied into the engine."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class TextTokenizer:
    """tokenizer.json through `tokenizers`, chat_template.jinja through jinja2 (as transformers
    renders it: sandboxed, trim_blocks, lstrip_blocks)."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        cfg_path = folder / "tokenizer_config.json"
        self._cfg: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        tpl_path = folder / "chat_template.jinja"
        self._template_src = tpl_path.read_text() if tpl_path.is_file() else None
        self._template: Any = None

    @property
    def has_chat_template(self) -> bool:
        return self._template_src is not None

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
        if self._template_src is None:
            raise ValueError("this engine has no chat template; send apply_chat_template: false")
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise ValueError(f"chat template: {message}")

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(
                x, indent=indent, ensure_ascii=False
            )
            self._template = env.from_string(self._template_src)
        specials = {
            k: v if isinstance(v, str) else (v or {}).get("content")
            for k, v in self._cfg.items()
            if k.endswith("_token")
        }
        return self._template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            **specials,
        )
